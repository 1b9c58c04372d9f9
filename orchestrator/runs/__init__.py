"""The run directory: everything a run leaves on the launcher, in one private place (0700)."""

from .launcher import launcher_info, process_start_time
from .rundir import (
    RunDir,
    check_new_dir,
    json_objects,
    read_jsonl,
    resolve_run,
    wait_for_run,
    write_bytes_atomic,
    write_json_atomic,
    write_private,
)

__all__ = [
    "RunDir",
    "check_new_dir",
    "json_objects",
    "launcher_info",
    "process_start_time",
    "read_jsonl",
    "resolve_run",
    "wait_for_run",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_private",
]
