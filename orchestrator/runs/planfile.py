"""RUN/plan.json: the one writer and the one reader of a run's plan record (``plan.record.PlanRecord``).

Every view and scheduler asks ``read_plan`` for the typed record; no module outside this one and the
record reads the file (``tests/test_architecture.py`` fails on one that does)."""

from __future__ import annotations

from ..plan import Plan
from ..plan.record import PlanChange, PlanRecord, PlanRecordError
from .rundir import RunDir, write_bytes_atomic
from .untrusted import read_json_strict

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
    try:  # (another user's run: its PermissionError goes up, for the caller to say so its own way)
        data = read_json_strict(path, MAX_PLAN_BYTES)
    except ValueError as exc:  # its text starts with the file's name
        raise PlanRecordError(f"{path.parent}/{exc}") from None
    if data is None:
        return None
    try:
        return PlanRecord.from_dict(data, str(path))
    except PlanRecordError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError, RecursionError) as exc:
        # a field of a type no check foresaw: still a damaged plan.json, named (a planted run in a shared
        # runs/ made every lookup by name fail with a TypeError)
        raise PlanRecordError(f"{path}: damaged ({type(exc).__name__}: {str(exc)[:120]})") from None


def plan_or_none(run: RunDir) -> PlanRecord | None:
    """The run's plan record, or None when it is missing or damaged: for views that show what they can
    (a report of a run whose plan.json was hand-edited still shows its figures)."""
    try:
        return read_plan(run)
    except PlanRecordError:
        return None
