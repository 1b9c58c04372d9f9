"""`tfcluster status` and `tfcluster stop`: a run through its run directory and its handle.

The launcher writes status.json every second, launcher.json once and result.json at the end; the
run's ``RunHandle`` (``views.handle``, or its scheduler's) says whether its supervisor is alive, what
the scheduler sees, and how to stop it — the same clean teardown as Ctrl-C.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ..core.text import table
from ..plan.record import PlanRecordError
from ..runs import RunDir, read_plan
from ..runs.untrusted import read_json_strict
from ..supervise.figures import TaskFigures
from ..supervise.summary import FULL_UP_TO, summarize, summary_lines
from .evaluations import status_lines
from .handle import RunHandle
from .reshapes import elastic_lines


def launcher_alive(run: RunDir, handle: RunHandle | None = None) -> bool:
    return (handle or RunHandle(run)).alive()


def _json_file(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """A run file's object; None when it is absent, or damaged (then said in ``problems``, by name and why)."""
    try:
        data = read_json_strict(path)  # (no link, no FIFO, bounded)
    except PermissionError:
        problems.append(f"{path.name}: not readable; left out")
        return None
    except ValueError as exc:  # (its text names the file and why)
        problems.append(f"{exc}; left out")
        return None
    if data is None or isinstance(data, dict):
        return data
    problems.append(f"{path.name}: damaged (not a JSON object); left out")
    return None


def _tasks(x: Any) -> dict[str, Any]:
    """A file's tasks: only those that are objects (a damaged or planted entry is left out)."""
    return {str(k): v for k, v in x.items() if isinstance(v, dict)} if isinstance(x, dict) else {}


def job_status(run: RunDir, handle: RunHandle | None = None) -> dict[str, Any]:
    """Everything ``tfcluster status RUN`` shows: the run's own files, and its scheduler's view. Every
    file is read as untrusted (a shared runs/ holds what anyone planted): a damaged one is named in
    ``problems`` and left out, never a crash, never taken for a launcher that died."""
    handle = handle or RunHandle(run)
    handle.settle()
    problems: list[str] = []
    result = _json_file(run.result_json, problems)
    damaged_result = bool(problems)
    status = _json_file(run.status_json, problems) or {}
    launcher = _json_file(run.launcher_json, problems) or {}
    try:
        plan = read_plan(run)
    except PermissionError:
        plan = None
    except PlanRecordError as exc:
        plan = None
        problems.append(str(exc))
    out: dict[str, Any] = {
        "run_dir": str(run.path),
        "job": plan.job if plan else None,
        "purpose": plan.purpose if plan else None,  # "check": a run of `tfcluster check`
        "launcher_pid": launcher.get("pid"),
        "launcher_host": launcher.get("hostname"),
        **handle.scheduler_status(),
    }
    if problems:
        out["problems"] = problems
    if isinstance(status.get("refused_connections"), dict):
        out["refused_connections"] = status["refused_connections"]
    out["throughput"] = status["throughput"] if isinstance(status.get("throughput"), dict) else None
    if isinstance(status.get("elastic"), dict):  # hosts excluded for good, spares left (issue 34)
        out["elastic"] = status["elastic"]
    if result is not None:
        out.update(
            {
                "state": result.get("state") if isinstance(result.get("state"), str) else "damaged",
                "finished": True,
                "launcher_alive": False,
                "wall_time_s": _num(result.get("wall_time_s")),
                "root_cause": result["root_cause"] if isinstance(result.get("root_cause"), dict) else None,
                "restarts": result.get("restarts", 0),
                "tasks": _finished_tasks(status, result),
                "throughput": out["throughput"] if status.get("finished") else None,  # the whole run's
            }
        )
        return out
    alive = handle.alive()
    updated = _num(status.get("updated"))
    state = status.get("state") if isinstance(status.get("state"), str) else "starting"
    out.update(
        {
            "state": ("pending" if handle.queued(out) else state) if alive else "launcher_gone",
            "finished": False,
            "launcher_alive": alive,
            "status_age_s": round(time.time() - updated, 1) if updated else None,
            "attempt": status.get("attempt"),
            "stopping_reason": _text(status.get("stopping_reason")),
            "tasks": _tasks(status.get("tasks")),
        }
    )
    if damaged_result:  # the launcher wrote it, so it ended: damaged since, not a launcher that died
        out["state"] = "damaged" if not alive else out["state"]
    elif not alive:
        out["message"] = handle.gone_message(status)
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _text(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def json_safe(x: Any) -> Any:
    """``x`` with every float that is not finite as None: ``status --json`` is strict JSON whatever
    status.json held (``json.dumps`` writes NaN, which strict readers refuse)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def _finished_tasks(status: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The final snapshot's tasks as the launcher wrote them (whole-run figures: what `report` shows);
    without one (the launcher died between result.json and status.json) the result's own."""
    if status.get("finished") and isinstance(status.get("tasks"), dict):
        return _tasks(status["tasks"])
    return _tasks(result.get("tasks"))


def status_text(st: dict[str, Any], handle: RunHandle | None = None, *, show_all: bool = False) -> str:
    """The run, and its tasks: one a row up to ``FULL_UP_TO`` tasks (or ``show_all``), else a summary."""
    handle = handle or RunHandle(RunDir(Path(str(st.get("run_dir")))))
    check = " (a check run)" if st.get("purpose") == "check" else ""
    head = f"job {st.get('job') or '-'}{check}   state {st.get('state')}   run {st.get('run_dir')}"
    lines = [head, *handle.scheduler_lines(st), *throughput_lines(st.get("throughput")), *loss_line(st.get("tasks"))]
    lines += [f"problem: {p}" for p in st.get("problems") or ()]
    if st.get("message"):
        lines.append(st["message"])
    if st.get("stopping_reason"):
        lines.append(f"stopping: {st['stopping_reason']}")
    refused = st.get("refused_connections") or {}
    if isinstance(refused, dict) and refused.get("count"):
        recent = refused.get("recent") or [{}]
        last = recent[-1] if isinstance(recent, list) and isinstance(recent[-1], dict) else {}
        lines.append(
            f"connect-back port: {refused['count']} connection(s) refused; last from "
            f"{last.get('peer', '?')}: {last.get('reason', '?')}"
        )
    lines += elastic_lines(st.get("elastic"))
    rc = st.get("root_cause")
    if isinstance(rc, dict) and rc:
        lines.append(f"root cause: {rc.get('task') or 'job'} ({rc.get('host') or '-'}): {rc.get('message')}")
        if rc.get("hint"):
            lines.append(f"  fix: {rc['hint']}")
    tasks = _tasks(st.get("tasks"))
    if len(tasks) > FULL_UP_TO and not show_all:
        lines.append("")
        lines.extend(summary_lines(summarize(tasks), finished=bool(st.get("finished"))))
        lines.append("(every task: tfcluster status RUN --all)")
        lines.extend(handle.detail_lines(st))
        return "\n".join(lines)
    rows = [
        ("TASK", "HOST", "STATE", "EXIT", "STEP", "STEP TIME", "STEPS/S", "EX/S", "LOSS", "CPU%", "RSS MB", "HEARTBEAT")
    ]
    for name, t in sorted(tasks.items()):
        code, sig = t.get("exit_code"), _text(t.get("signal"))
        exit_text = sig or (str(code) if isinstance(code, int) and not isinstance(code, bool) else "")
        fig = TaskFigures.from_dict(t)  # the type `report` shows its rows in (supervise.figures: one owner)
        age, rss = _num(t.get("last_heartbeat_age_s")), _num(t.get("rss_mb"))
        rows.append(
            (
                name
                + (" *straggler*" if t.get("straggler") else "")
                + (f" (restarted {t['restarts']}x)" if isinstance(t.get("restarts"), int) and t["restarts"] else ""),
                str(t.get("host", "")),
                str(t.get("state", "")),
                exit_text,
                "" if fig.steps is None else str(fig.steps),
                "" if fig.step_time_s is None else f"{fig.step_time_s * 1000:.1f} ms",
                "" if fig.steps_per_s is None else f"{fig.steps_per_s:.1f}",
                "" if fig.examples_per_s is None else f"{fig.examples_per_s:.0f}",
                "" if fig.loss is None else f"{fig.loss:.4g}",
                "" if fig.cpu_pct is None else f"{fig.cpu_pct:.0f}",
                "" if rss is None else f"{rss:.0f}",
                "" if age is None or st.get("finished") else f"{age:.1f}s ago",
            )
        )
    lines.append("")
    lines.extend(table(rows))
    problems = [
        str(g.get("message"))
        for _, t in sorted(tasks.items())
        for g in (t.get("gpu_problems") if isinstance(t.get("gpu_problems"), list) else ())
        if isinstance(g, dict)
    ]
    if problems:  # the live monitor's judgement of the last heartbeats (supervise.gpus)
        lines += ["", "GPU problems:", *(f"  {m}" for m in problems)]
    lines.extend(status_lines(tasks))  # an evaluator's last evaluation
    lines.extend(handle.detail_lines(st))
    return "\n".join(lines)


def throughput_lines(rates: Any) -> list[str]:
    """The job's rates (every worker counts the global batch: one worker's, never the sum)."""
    if not isinstance(rates, dict) or (steps := _num(rates.get("steps_per_s"))) is None:
        return []
    ex = _num(rates.get("examples_per_s"))
    text = f"throughput {steps:.2f} steps/s" + ("" if ex is None else f", {ex:,.0f} examples/s")
    return [text + " (the job's: every worker counts the global batch)"]


def loss_line(tasks: Any) -> list[str]:
    """The job's training loss: the workers' mean of their last interval (a finished run: of its end)."""
    losses = [t["loss"] for t in _tasks(tasks).values() if _num(t.get("loss")) is not None]
    if not losses:
        return []
    return [f"training loss {sum(losses) / len(losses):.4g} (the mean of {len(losses)} worker(s)' last reports)"]


def stop_job(run: RunDir, handle: RunHandle | None = None, *, timeout_s: float = 120.0) -> str:
    """``tfcluster stop RUN``: the run's supervisor tears it down cleanly (its handle knows how)."""
    return (handle or RunHandle(run)).stop(timeout_s)
