"""What a node's check line may claim: the check's figures, read as a hostile node could write them.

A node's ``TFCLUSTER_CHECK`` line is only text it printed. It is validated as a protocol record
(``worker_entry.protocol.checkline``: types, ranges, no NaN) and then held to what the node can
know: the node is the task whose log it is in, so it speaks for its own figures, for the links it
measured as the probe's client (``a`` is itself) and for the probes it served (``b`` is itself) — each
with a partner of the plan. Anything else (a link between two other tasks, a task outside the plan,
a line that says it is another task) is dropped and named in ``ignored``: a node that claims it is
reported (``bad_claim``), and never moves the judgement of the others (``checkjudge``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from worker_entry.protocol.checkline import CheckReport, find_line, last_phase, parse_report
from worker_entry.protocol.frames import ProtocolError


def node_result(task: str, log_text: str, tasks: Collection[str]) -> dict[str, Any] | None:
    """``task``'s verified figures from its log text, in check.json's shape (None: no check line).
    An invalid line is ``{"task", "error", "invalid": True}``: the node's ``no_result``, with why."""
    payload = find_line(log_text)
    if payload is None:
        return None
    try:
        report = parse_report(payload)
    except ProtocolError as exc:
        return {"task": task, "error": f"its check line is invalid: {exc}", "invalid": True}
    return verified(task, report, tasks)


def verified(task: str, report: CheckReport, tasks: Collection[str]) -> dict[str, Any]:
    """The report's figures that ``task`` may claim; the rest named in ``ignored``."""
    if report.task is not None and report.task != task:
        return {
            "task": task,
            "error": f"its check line speaks for {report.task!r}, not for itself ({task}): not counted",
            "invalid": True,
            "ignored": [f"the whole line: it says it is {report.task!r}"],
        }
    out = report.to_dict()
    ignored: list[str] = []
    links, served = [], []
    for link in report.links:
        why = _not_own(task, link.a, link.b, tasks, "measured")
        if why:
            ignored.append(why)
        else:
            links.append(link.to_dict())
    for probe in report.served:
        why = _not_own(task, probe.b, probe.a, tasks, "served")
        if why:
            ignored.append(why)
        else:
            served.append(probe.to_dict())
    out.update(task=task, links=links, served=served)
    if ignored:
        out["ignored"] = ignored
    return out


def _not_own(task: str, me: str, partner: str, tasks: Collection[str], verb: str) -> str | None:
    """Why a link claim is not ``task``'s to make (None: it is)."""
    if me != task:
        return f"a link {verb} by {me!r} (to {partner!r}): a node speaks only for the links it {verb} itself"
    if partner not in tasks or partner == task:
        return f"a link {verb} to {partner!r}, which is not another task of this check"
    return None


def node_phase(log_text: str) -> str | None:
    """The last phase a task's check reported reaching (validated; None: none). A node's own word about
    itself: it counts only with a majority (``checklag``)."""
    found = last_phase(log_text)
    return found.phase if found else None
