"""RUN/plan.json: the one writer and the one reader of a run's plan record (``plan.record.PlanRecord``).

Every view and scheduler asks ``read_plan`` for the typed record; no module outside this one and the
record reads the file (``tests/test_architecture.py`` fails on one that does)."""

from __future__ import annotations

import json

from ..plan import Plan
from ..plan.record import PlanChange, PlanRecord, PlanRecordError
from .rundir import RunDir, open_regular, write_bytes_atomic

#: A plan.json larger than this is refused (this version's record of 65,536 tasks is ~10 MB; a version-1
#: record kept every task's TF_CONFIG and reached hundreds of MB at 4,096 tasks).
MAX_PLAN_BYTES = 64 << 20


def write_plan(run: RunDir, plan: Plan, *, attempt: int = 0, reshapes: tuple[PlanChange, ...] = ()) -> PlanRecord:
    """Record the plan a run starts from (redacted, linear in the tasks), or the plan of a reshaped
    attempt with the run's reshapes so far (its history); returns the record."""
    record = PlanRecord.from_plan(plan, attempt=attempt, reshapes=reshapes)
    write_bytes_atomic(run.plan_json, record.to_json().encode(), durable=False)
    return record


def read_plan(run: RunDir) -> PlanRecord | None:
    """The run's plan record; None when the run has no plan.json (yet); ``PlanRecordError`` naming the
    file and field when it is damaged or written by a newer tfcluster."""
    path = run.plan_json
    try:
        with open_regular(path) as f:  # a FIFO or device planted in a shared runs/ cannot hang us
            text = f.read(MAX_PLAN_BYTES + 1)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise  # another user's run: the caller says so its own way
    except OSError as exc:
        raise PlanRecordError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if len(text) > MAX_PLAN_BYTES:
        raise PlanRecordError(f"{path}: larger than {MAX_PLAN_BYTES >> 20} MiB: not a plan this version reads")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PlanRecordError(f"{path}: not JSON ({str(exc)[:120]})") from None
    return PlanRecord.from_dict(data, str(path))


def plan_or_none(run: RunDir) -> PlanRecord | None:
    """The run's plan record, or None when it is missing or damaged: for views that show what they can
    (a report of a run whose plan.json was hand-edited still shows its figures)."""
    try:
        return read_plan(run)
    except PlanRecordError:
        return None
