"""The run directory: everything a run leaves on the launcher, in one private place (0700)."""

from .jsonl import per_line as json_objects
from .launcher import launcher_info, process_start_time
from .planfile import plan_or_none, read_plan, write_plan
from .rundir import (
    RunDir,
    check_new_dir,
    open_regular,
    read_jsonl,
    resolve_run,
    wait_for_run,
    write_bytes_atomic,
    write_json_atomic,
    write_private,
)
from .untrusted import private_subdir, read_tail

__all__ = [
    "RunDir",
    "check_new_dir",
    "json_objects",
    "launcher_info",
    "open_regular",
    "plan_or_none",
    "private_subdir",
    "process_start_time",
    "read_jsonl",
    "read_plan",
    "read_tail",
    "resolve_run",
    "wait_for_run",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_plan",
    "write_private",
]
