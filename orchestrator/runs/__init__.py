"""The run directory: everything a run leaves on the launcher, in one private place (0700)."""

from .jsonl import per_line as json_objects
from .launcher import launcher_info, process_start_time
from .planfile import plan_or_none, read_plan, write_plan
from .rundir import (
    RunDir,
    check_new_dir,
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
    "plan_or_none",
    "process_start_time",
    "read_jsonl",
    "read_plan",
    "resolve_run",
    "wait_for_run",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_plan",
    "write_private",
]
