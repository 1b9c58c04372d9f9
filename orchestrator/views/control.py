"""`tfcluster status` and `tfcluster stop`: talk to a running launcher through its run directory.

The launcher writes status.json every second and launcher.json (pid + start time) once. `stop`
sends it SIGTERM — the same clean teardown as Ctrl-C — after checking that it is really that
process (pid and start time, so a recycled pid is never signalled) and that it belongs to us.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ..core.errors import UsageError
from ..core.text import table
from ..runs import RunDir, write_json_atomic

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


def _launcher_process(run: RunDir) -> Any:
    info = run.read_json(run.launcher_json) or {}
    pid = info.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or psutil is None:
        return None
    try:
        p = psutil.Process(pid)
        created = info.get("create_time")
        if created is not None and abs(p.create_time() - created) > 0.05:
            return None  # the pid was recycled by another process
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def launcher_alive(run: RunDir) -> bool:
    from .slurm import is_slurm_batch, supervisor_alive

    if is_slurm_batch(run):  # its supervisor runs in the allocation, often on another machine
        return supervisor_alive(run)
    p = _launcher_process(run)
    if p is None:
        return False
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def job_status(run: RunDir) -> dict[str, Any]:
    from .slurm import is_slurm_batch, supervisor_alive

    if is_slurm_batch(run) and not run.is_finished() and not supervisor_alive(run):
        from .slurm import finalize

        finalize(run)  # the job is gone and nobody wrote its result (cancelled while pending, killed): now there is one
    result = run.read_json(run.result_json)
    status = run.read_json(run.status_json) or {}
    launcher = run.read_json(run.launcher_json) or {}
    plan = run.read_json(run.plan_json) or {}
    out: dict[str, Any] = {
        "run_dir": str(run.path),
        "job": plan.get("job"),
        "launcher_pid": launcher.get("pid"),
        "launcher_host": launcher.get("hostname"),
    }
    if (run.path / "slurm.json").exists():
        from .slurm import slurm_status

        out["slurm"] = slurm_status(run)
    if result is not None:
        kube = run.read_json(run.path / "kubernetes.json")
        if kube is not None:
            out["kubernetes"] = kube
        out.update(
            {
                "state": result.get("state"),
                "finished": True,
                "launcher_alive": False,
                "wall_time_s": result.get("wall_time_s"),
                "root_cause": result.get("root_cause"),
                "restarts": result.get("restarts", 0),
                "tasks": _finished_tasks(status, result),
            }
        )
        return out
    kube = run.read_json(run.path / "kubernetes.json")
    if kube is not None:
        out["kubernetes"] = kube
    alive = launcher_alive(run)
    updated = status.get("updated")
    queued = out.get("slurm", {}).get("state") in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")
    out.update(
        {
            "state": ("pending" if queued else status.get("state", "starting")) if alive else "launcher_gone",
            "finished": False,
            "launcher_alive": alive,
            "status_age_s": round(time.time() - updated, 1) if updated else None,
            "attempt": status.get("attempt"),
            "stopping_reason": status.get("stopping_reason"),
            "tasks": status.get("tasks", {}),
        }
    )
    if not alive and kube is not None and not kube.get("closed"):
        out["message"] = (
            "the launcher is not running and wrote no result.json; the pods it applied keep running without it "
            f"(`tfcluster stop {run.path}` deletes them); last known state: {status.get('state', 'unknown')}"
        )
    elif not alive:
        out["message"] = (
            "the launcher is not running and wrote no result.json: it was killed (SIGKILL) or its machine "
            "went away. Its workers stop by themselves when the launcher stops answering; "
            f"last known state: {status.get('state', 'unknown')}"
        )
    return out


def _finished_tasks(status: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The final snapshot's tasks as the launcher wrote them (whole-run figures: what `report` shows);
    without one (the launcher died between result.json and status.json) the result's own."""
    if status.get("finished") and isinstance(status.get("tasks"), dict):
        return status["tasks"]
    return result.get("tasks", {})


def _not_our_launcher(proc: Any, owner: int) -> str | None:
    """Why ``proc`` is not the launcher of a run owned by ``owner`` (None when it is)."""
    if proc.uids().real != owner:
        return f"it belongs to uid {proc.uids().real}, the run directory to uid {owner}"
    argv = proc.cmdline()
    names = {os.path.basename(a) for a in argv[:3]}
    is_tfcluster = "tfcluster" in names or any(a == "orchestrator" for a in argv[1:3])
    if not (is_tfcluster and "launch" in argv):
        return f"it is not a tfcluster launcher ({' '.join(argv)[:80]!r})"
    return None


def status_text(st: dict[str, Any]) -> str:
    head = f"job {st.get('job')}   state {st.get('state')}   run {st.get('run_dir')}"
    lines = [head]
    sl = st.get("slurm")
    if sl:
        lines.append(
            f"slurm job {sl.get('job_id') or '-'}: {sl.get('state', 'unknown')}"
            + (f" ({sl['reason']})" if sl.get("reason") and sl.get("reason") != "None" else "")
            + (f" on {sl['nodes']}" if sl.get("nodes") else "")
            + (f", {sl['time_left']} left" if sl.get("time_left") else "")
            + f"; preemptions {sl.get('preemptions', 0)}, time-outs {sl.get('timeouts', 0)}"
        )
    if st.get("message"):
        lines.append(st["message"])
    if st.get("stopping_reason"):
        lines.append(f"stopping: {st['stopping_reason']}")
    rc = st.get("root_cause")
    if rc:
        lines.append(f"root cause: {rc.get('task') or 'job'} ({rc.get('host') or '-'}): {rc.get('message')}")
    rows = [("TASK", "HOST", "STATE", "EXIT", "STEP", "STEP TIME", "STEPS/S", "EX/S", "CPU%", "RSS MB", "HEARTBEAT")]
    for name, t in sorted(st.get("tasks", {}).items()):
        exit_text = t.get("signal") or ("" if t.get("exit_code") is None else str(t.get("exit_code")))
        step_time = t.get("step_time_s")
        age = t.get("last_heartbeat_age_s")
        rows.append(
            (
                name + (" *straggler*" if t.get("straggler") else ""),
                str(t.get("host", "")),
                str(t.get("state", "")),
                exit_text,
                "" if t.get("steps") is None else str(t.get("steps")),
                "" if step_time is None else f"{step_time * 1000:.1f} ms",
                "" if t.get("steps_per_s") is None else f"{t['steps_per_s']:.1f}",
                "" if t.get("examples_per_s") is None else f"{t['examples_per_s']:.0f}",
                "" if t.get("cpu_pct") is None else f"{t['cpu_pct']:.0f}",
                "" if t.get("rss_mb") is None else f"{t['rss_mb']:.0f}",
                "" if age is None or st.get("finished") else f"{age:.1f}s ago",
            )
        )
    lines.append("")
    lines.extend(table(rows))
    lines.extend(_pods_text(st.get("kubernetes")))
    return "\n".join(lines)


def _pods_text(kube: Any) -> list[str]:
    """The pods of a Kubernetes run, newest attempt last: phase, node, how each container ended."""
    if not isinstance(kube, dict) or not isinstance(kube.get("pods"), dict):
        return []
    objects = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in kube.get("objects") or [] if isinstance(o, dict))
    head = f"kubernetes: namespace {kube.get('namespace')}   {objects or 'nothing applied'}"
    if not kube["pods"]:
        return ["", head]
    rows = [("ATTEMPT/TASK", "POD", "PHASE", "NODE", "EXIT", "REASON")]
    for key, pod in sorted(kube["pods"].items(), key=lambda kv: (int(kv[0].split("/")[0]) if kv[0].split("/")[0].isdigit() else 0, kv[0])):
        if not isinstance(pod, dict):
            continue
        rows.append(
            (
                key,
                str(pod.get("pod", "")),
                str(pod.get("phase", "")),
                str(pod.get("node") or ""),
                "" if pod.get("exit_code") is None else str(pod.get("exit_code")),
                str(pod.get("reason") or pod.get("problem") or "")[:80],
            )
        )
    return ["", head, *table(rows)]


def stop_job(run: RunDir, *, timeout_s: float = 120.0) -> str:
    from .slurm import is_slurm_batch, stop_slurm

    if is_slurm_batch(run) and not run.is_finished():  # its supervisor runs in the allocation: via Slurm
        owner = os.stat(run.path).st_uid
        if owner != os.getuid() and os.getuid() != 0:
            raise UsageError(f"{run.path} belongs to uid {owner}; only the user who started the job can stop it")
        return stop_slurm(run, timeout_s=timeout_s)
    if run.is_finished():
        result = run.read_json(run.result_json) or {}
        return f"the job already finished: {result.get('state')}"
    owner = os.stat(run.path).st_uid
    if owner != os.getuid() and os.getuid() != 0:
        raise UsageError(f"{run.path} belongs to uid {owner}; only the user who started the job can stop it")
    proc = _launcher_process(run)
    if proc is None:
        kube = run.read_json(run.path / "kubernetes.json")
        if kube is not None and kube.get("objects") and not kube.get("closed"):
            from ..backends.kubernetes.backend import delete_recorded

            done = delete_recorded(kube)
            write_json_atomic(run.path / "kubernetes.json", {**kube, "closed": True, "stopped": done}, durable=False)
            return "the launcher is not running; deleted what it applied: " + "; ".join(done)
        return "the launcher is not running (no result.json either: it was killed); its workers stop by themselves"
    if (run.path / "slurm.json").exists():  # inside an allocation: this SIGTERM is a stop, not a preemption
        from ..runs.slurm_state import request_stop

        request_stop(run, "SIGTERM", "tfcluster stop")
    try:
        # launcher.json is only a file: whoever could write it could name any process. Even as root,
        # signal only a tfcluster launcher owned by the run directory's owner.
        why = _not_our_launcher(proc, owner)
        if why:
            raise UsageError(f"refusing to signal pid {proc.pid}: {why}")
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return "the launcher exited just now"
    except psutil.AccessDenied:
        raise UsageError("not allowed to signal the launcher; only the user who started the job can stop it") from None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.is_finished():
            result = run.read_json(run.result_json) or {}
            tasks = result.get("tasks", {})
            states = ", ".join(f"{k}: {v.get('state')}" for k, v in sorted(tasks.items()))
            return f"stopped: job {result.get('state')} ({states})"
        if not launcher_alive(run):
            return "the launcher exited without writing result.json"
        time.sleep(0.2)
    raise UsageError(f"the launcher did not finish its teardown within {timeout_s:g}s (pid {proc.pid})")
