"""The launcher's real supervisor against load-generator nodes that are lost for good (issue 34, item 9):
``bench/elastic_sim.py --live N`` runs it.

A real ``Job`` (supervisor, policy, reshaping, sinks) over ``tests/loadfleet.py``'s ``LoadGenBackend``:
every task is a rank of a ``tfcluster_testbed.loadgen`` process that speaks the real protocol. A lost
host here: its rank goes ``silent`` (no heartbeat, no step, the socket left open: a host or its link
gone) and its host is marked gone, so a connect to it fails from then on (``connect`` says so, as an SSH
connect to a dead host would). Every ``every_s`` real seconds of training one random host of the
current plan is lost; after the last loss has been trained again after, every rank exits 0.

Measured from the run directory, by what ``report`` computes (``views.goodput``/``views.recovery``):
each failure's loss to training again (the culprit's last heartbeat → the next attempt's first step),
the reshapes, the workers at the end. The generator's nodes keep no backup (their steps restart at 0),
so their "work redone" is every step of the failed attempt: the redone work is the model's
(``bench/elastic_model.py``), the times here are the launcher's own.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
from loadfleet import LoadGenBackend, load_plan  # noqa: E402

from orchestrator.core.diagnostics import Diagnostic  # noqa: E402
from orchestrator.job import Job, Members, RunScheduling  # noqa: E402
from orchestrator.job.options import LaunchOptions  # noqa: E402
from orchestrator.runs import RunDir  # noqa: E402
from orchestrator.schedulers.ssh import ssh_plan  # noqa: E402
from orchestrator.views.report import build_report  # noqa: E402
from tfcluster_testbed.waiting import wait_for  # noqa: E402


class LossyBackend(LoadGenBackend):
    """The load generator's nodes, whose hosts can be lost for good."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.hosts: list[str] = []  # the current attempt's host of each rank
        self.gone: set[str] = set()

    def launch(self, starts: Sequence[Any]) -> None:
        self.hosts = [node.host for node, _ in starts]
        super().launch(starts)

    def connect(self, nodes: Sequence[Any]) -> list[Diagnostic]:
        return [
            Diagnostic(f"cannot reach {n.host}: host gone", task=str(n.task), host=n.host, code="connect")
            for n in nodes
            if n.host in self.gone
        ]

    def lose(self, rank: int) -> str:
        host = self.hosts[rank]
        self.gone.add(host)
        self.gen.cue("silent", rank)
        return host


class LoadScheduling(RunScheduling):
    """The SSH fleet's reshaping (``SshScheduling``), planning with the made-up hosts' fixed lookup."""

    reshapes = True

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def replan(self, plan: Any, members: Members) -> Any:
        return ssh_plan(
            self.spec,
            run_id=plan.run_id,
            local_user="me",
            ssh_lookup=None,
            members=members.hosts,
            spares=members.spares,
            planned_workers=members.planned,
        )


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def training(run_dir: Path, attempt: int) -> bool:
    """Attempt ``attempt`` runs and every task of it has stepped."""
    s = _status(run_dir)
    tasks = s.get("tasks") or {}
    return (
        s.get("attempt") == attempt
        and bool(tasks)
        and all((t.get("steps") or 0) > 0 for t in tasks.values() if t.get("state") == "running")
        and all(t.get("state") == "running" for t in tasks.values())
    )


def _trains_after(run_dir: Path, attempt: Any) -> bool:
    """An attempt after ``attempt`` runs and trains (the exit cue went to an earlier one's ranks)."""
    now = _status(run_dir).get("attempt")
    return isinstance(now, int) and now != attempt and training(run_dir, now)


def run(
    tasks: int,
    spares: int,
    min_workers: int | None,
    losses: int,
    every_s: float,
    run_dir: Path,
    timeout_s: float = 5.0,
    seed: int = 0,
) -> dict[str, Any]:
    """One real run; its figures (``report``'s) and what the bench saw."""
    rng = random.Random(seed)
    hosts = [{"address": f"node{i}", **({"spare": True} if i >= tasks else {})} for i in range(tasks + spares)]
    restart = {"max_restarts": losses + 4, **({"min_workers": min_workers} if min_workers is not None else {})}
    backend = LossyBackend(threads=2)
    loaded, plan = load_plan(tasks + spares, interval=1.0, timeout=timeout_s, hosts=hosts, restart=restart)
    opts = LaunchOptions(run_dir=str(run_dir), gather=False, live=False, echo_logs=False)
    job = Job(loaded, plan, opts, backend, scheduling=LoadScheduling(loaded.spec))
    lost: list[str] = []
    done = threading.Event()  # the job returned

    def drive() -> None:
        """Lose a host every ``every_s`` of training, up to ``losses``; then every rank exits 0. The job
        runs in the main thread (it takes the signals), this beside it."""
        try:
            for attempt in range(losses + 1):
                wait_for(lambda a=attempt: training(run_dir, a) or done.is_set(), 600, f"attempt {attempt} training")
                if done.is_set() or attempt == losses:
                    break
                time.sleep(every_s)
                lost.append(backend.lose(rng.randrange(len(backend.hosts))))
            time.sleep(2.0)
            # every rank exits 0; a rank the loaded generator left silent past the timeout is judged lost
            # too (one more reshape): its next attempt's ranks get the cue again once they train
            while not done.is_set():
                cued = _status(run_dir).get("attempt")
                backend.gen.cue("exit", "all", 0)
                wait_for(lambda c=cued: done.is_set() or _trains_after(run_dir, c), 600, "the run's end")
        except BaseException:
            job.interrupt.trigger(15)  # the job ends either way; the figures say what happened
            raise

    driver = threading.Thread(target=drive, daemon=True)
    t0 = time.monotonic()
    driver.start()
    try:
        result = job.run()
    finally:
        done.set()
        driver.join(30)
        backend.close()
    wall = time.monotonic() - t0
    rep = build_report(RunDir(run_dir))
    attempts = rep.goodput.attempts if rep.goodput is not None else ()
    again = [a.loss_to_training_s for a in attempts if a.loss_to_training_s is not None]
    return {
        "tasks": tasks,
        "spares": spares,
        "min_workers": min_workers,
        "state": result.state.value,
        "hosts_lost": len(lost),  # cued; more reshapes than these: tasks the loaded generator left silent
        "failures": len(again) + (result.state.value != "succeeded"),
        "reshapes": len(rep.reshapes),
        "workers_end": rep.reshapes[-1]["workers_after"] if rep.reshapes else tasks,
        "again_mean_s": round(sum(again) / len(again), 2) if again else None,
        "again_max_s": round(max(again), 2) if again else None,
        "again": again,
        "timeout_s": timeout_s,
        "wall_s": round(wall, 1),
        "run_dir": str(run_dir),
    }
