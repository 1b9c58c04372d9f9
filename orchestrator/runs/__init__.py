"""The run directory: everything a run leaves on the launcher, in one private place (0700)."""

from .rundir import RunDir, read_jsonl, resolve_run, wait_for_run, write_bytes_atomic, write_json_atomic

__all__ = ["RunDir", "read_jsonl", "resolve_run", "wait_for_run", "write_bytes_atomic", "write_json_atomic"]
