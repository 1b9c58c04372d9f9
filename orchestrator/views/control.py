"""`tfcluster status` and `tfcluster stop`: a run through its run directory and its handle.

The launcher writes status.json every second, launcher.json once and result.json at the end; the
run's ``RunHandle`` (``views.handle``, or its scheduler's) says whether its supervisor is alive, what
the scheduler sees, and how to stop it — the same clean teardown as Ctrl-C.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..core.text import table
from ..runs import RunDir, plan_or_none
from ..supervise.figures import TaskFigures
from ..supervise.summary import FULL_UP_TO, summarize, summary_lines
from .evaluations import status_lines
from .handle import RunHandle
from .reshapes import elastic_lines


def launcher_alive(run: RunDir, handle: RunHandle | None = None) -> bool:
    return (handle or RunHandle(run)).alive()


def job_status(run: RunDir, handle: RunHandle | None = None) -> dict[str, Any]:
    """Everything ``tfcluster status RUN`` shows: the run's own files, and its scheduler's view."""
    handle = handle or RunHandle(run)
    handle.settle()
    result = run.read_json(run.result_json)
    status = run.read_json(run.status_json) or {}
    launcher = run.read_json(run.launcher_json) or {}
    plan = plan_or_none(run)
    out: dict[str, Any] = {
        "run_dir": str(run.path),
        "job": plan.job if plan else None,
        "purpose": plan.purpose if plan else None,  # "check": a run of `tfcluster check`
        "launcher_pid": launcher.get("pid"),
        "launcher_host": launcher.get("hostname"),
        **handle.scheduler_status(),
    }
    if isinstance(status.get("refused_connections"), dict):
        out["refused_connections"] = status["refused_connections"]
    out["throughput"] = status["throughput"] if isinstance(status.get("throughput"), dict) else None
    if isinstance(status.get("elastic"), dict):  # hosts excluded for good, spares left (issue 34)
        out["elastic"] = status["elastic"]
    if result is not None:
        out.update(
            {
                "state": result.get("state"),
                "finished": True,
                "launcher_alive": False,
                "wall_time_s": result.get("wall_time_s"),
                "root_cause": result.get("root_cause"),
                "restarts": result.get("restarts", 0),
                "tasks": _finished_tasks(status, result),
                "throughput": out["throughput"] if status.get("finished") else None,  # the whole run's
            }
        )
        return out
    alive = handle.alive()
    updated = status.get("updated")
    out.update(
        {
            "state": ("pending" if handle.queued(out) else status.get("state", "starting"))
            if alive
            else "launcher_gone",
            "finished": False,
            "launcher_alive": alive,
            "status_age_s": round(time.time() - updated, 1) if updated else None,
            "attempt": status.get("attempt"),
            "stopping_reason": status.get("stopping_reason"),
            "tasks": status.get("tasks", {}),
        }
    )
    if not alive:
        out["message"] = handle.gone_message(status)
    return out


def _finished_tasks(status: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The final snapshot's tasks as the launcher wrote them (whole-run figures: what `report` shows);
    without one (the launcher died between result.json and status.json) the result's own."""
    if status.get("finished") and isinstance(status.get("tasks"), dict):
        return status["tasks"]
    return result.get("tasks", {})


def status_text(st: dict[str, Any], handle: RunHandle | None = None, *, show_all: bool = False) -> str:
    """The run, and its tasks: one a row up to ``FULL_UP_TO`` tasks (or ``show_all``), else a summary."""
    handle = handle or RunHandle(RunDir(Path(str(st.get("run_dir")))))
    check = " (a check run)" if st.get("purpose") == "check" else ""
    head = f"job {st.get('job')}{check}   state {st.get('state')}   run {st.get('run_dir')}"
    lines = [head, *handle.scheduler_lines(st), *throughput_lines(st.get("throughput")), *loss_line(st.get("tasks"))]
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
    if rc:
        lines.append(f"root cause: {rc.get('task') or 'job'} ({rc.get('host') or '-'}): {rc.get('message')}")
        if rc.get("hint"):
            lines.append(f"  fix: {rc['hint']}")
    tasks = st.get("tasks", {})
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
        exit_text = t.get("signal") or ("" if t.get("exit_code") is None else str(t.get("exit_code")))
        fig = TaskFigures.from_dict(t)  # the type `report` shows its rows in (supervise.figures: one owner)
        age = t.get("last_heartbeat_age_s")
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
                "" if t.get("rss_mb") is None else f"{t['rss_mb']:.0f}",
                "" if age is None or st.get("finished") else f"{age:.1f}s ago",
            )
        )
    lines.append("")
    lines.extend(table(rows))
    problems = [g.get("message") for _, t in sorted(st.get("tasks", {}).items()) for g in t.get("gpu_problems") or []]
    if problems:  # the live monitor's judgement of the last heartbeats (supervise.gpus)
        lines += ["", "GPU problems:", *(f"  {m}" for m in problems)]
    lines.extend(status_lines(tasks))  # an evaluator's last evaluation
    lines.extend(handle.detail_lines(st))
    return "\n".join(lines)


def throughput_lines(rates: Any) -> list[str]:
    """The job's rates (every worker counts the global batch: one worker's, never the sum)."""
    if not isinstance(rates, dict) or rates.get("steps_per_s") is None:
        return []
    ex = rates.get("examples_per_s")
    text = f"throughput {rates['steps_per_s']:.2f} steps/s" + ("" if ex is None else f", {ex:,.0f} examples/s")
    return [text + " (the job's: every worker counts the global batch)"]


def loss_line(tasks: Any) -> list[str]:
    """The job's training loss: the workers' mean of their last interval (a finished run: of its end)."""
    losses = [
        t["loss"] for t in (tasks or {}).values() if isinstance(t, dict) and isinstance(t.get("loss"), (int, float))
    ]
    if not losses:
        return []
    return [f"training loss {sum(losses) / len(losses):.4g} (the mean of {len(losses)} worker(s)' last reports)"]


def stop_job(run: RunDir, handle: RunHandle | None = None, *, timeout_s: float = 120.0) -> str:
    """``tfcluster stop RUN``: the run's supervisor tears it down cleanly (its handle knows how)."""
    return (handle or RunHandle(run)).stop(timeout_s)
