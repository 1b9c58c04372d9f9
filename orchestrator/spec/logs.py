"""The spec's ``logs:`` section: how much of each task's output the launcher keeps."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: 4 GiB. A task printing one 200-byte line a step at 50 steps/s writes 10 KB/s: five days of that fit;
#: a runaway task (the flood that grew a run directory by 4.3 GB in 30 s) is cut within seconds,
#: and its node keeps the whole output on its own disk.
DEFAULT_MAX_BYTES_PER_TASK = 4 << 30


class LogsSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False, defer_build=True)

    max_bytes_per_task: Annotated[int, Field(strict=True, ge=1 << 16, le=1 << 50)] | None = Field(
        DEFAULT_MAX_BYTES_PER_TASK,
        description="Bytes of a task's output the launcher keeps over the run (its log, combined.log, the "
        "console); past it the lines are cut (the log says so, a log_cut event), the task runs on and its "
        "node keeps its own complete log. Default 4 GiB; null: no cap.",
    )
