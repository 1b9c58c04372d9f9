"""How GPUs are judged, on the real readings of an H100 (tests/data/h100: a healthy GPU under dense load
runs at 1.41-1.50 GHz of 1.98 GHz, 690 W of 700 W, reason "power cap"). One judgement, four views: the
live monitor's events, `status`, the Prometheus metrics and `report` must all name the same GPUs — none
when every GPU is healthy, the one worker's with the reason when one is not."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakenode import FakeBackend, FakeNode, make_plan, stopped
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from orchestrator.core.states import JobState
from orchestrator.events import event_from_dict
from orchestrator.job import Job, LaunchOptions
from orchestrator.runs import RunDir
from orchestrator.sinks.metrics import JobMetrics, _Collector
from orchestrator.supervise import Monitor, Policy, TaskSession, judge_gpus
from orchestrator.supervise.figures import Figures
from orchestrator.supervise.status import Snapshots
from orchestrator.supervise.supervisor import VERDICT_EVENTS
from orchestrator.views.control import status_text
from orchestrator.views.handle import RunHandle
from orchestrator.views.report import build_report, report_text
from worker_entry import protocol as p

DATA = Path(__file__).parent / "data" / "h100"
H100 = json.loads((DATA / "h100-nvml.json").read_text())
POWER = json.loads((DATA / "h100-power-and-sharing.json").read_text())
MODEL = "NVIDIA H100 80GB HBM3"
TASKS = ["worker:0", "worker:1", "worker:2"]
T0 = 1_800_000_000.0
BEATS = 8
DEFAULT_W = POWER["power_default_limit_mw"] / 1000.0

Sample = Callable[[str, int], dict[str, Any]]


def loaded(task: str, beat: int) -> dict[str, Any]:
    """A real H100 sample under load (each worker and beat another one), with the board's default limit
    as NVML read it on that GPU."""
    i = TASKS.index(task)
    return {**H100["load"][(3 * beat + i) % len(H100["load"])], "power_default_limit_w": DEFAULT_W}


def on(task: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Sample:
    """The healthy readings, with ``change`` applied to ``task``'s."""
    return lambda t, b: change(loaded(t, b)) if t == task else loaded(t, b)


def hw_slowdown(g: dict[str, Any]) -> dict[str, Any]:
    return {**g, "throttle": ["power cap", "HW slowdown"], "sm_clock_mhz": 840, "power_w": 402.0, "temp_c": 61}


def capped_400w(g: dict[str, Any]) -> dict[str, Any]:
    return {**g, "power_limit_w": 400.0, "power_w": 396.5, "sm_clock_mhz": 1155}


def shared(g: dict[str, Any]) -> dict[str, Any]:
    """A leftover process of another program on the GPU: PID and memory as NVML listed them on the H100."""
    other = POWER["procs_while_shared"][1]
    return {**g, "processes": 2, "others": [{"pid": other["pid"], "used_mb": other["used_mb"], "name": "python3"}]}


# --- the four views of one judgement -----------------------------------------------------------------


def monitor_events(sample: Sample) -> tuple[list[Any], Monitor]:
    """Heartbeats through the live monitor; its verdicts become events exactly as the supervisor makes
    them, and survive events.jsonl."""
    m = Monitor(TASKS, Policy(), now=0.0)
    for t in TASKS:
        m.gpus.on_models(t, [{"index": 0, "name": MODEL}])
    events = []
    for b in range(BEATS):
        for t in TASKS:
            gpus = [p.GpuSample.from_dict(sample(t, b))]  # validated like a heartbeat on receipt
            m.on_heartbeat(t, p.Heartbeat(seq=b + 1, ts=T0 + b, gpus=gpus), float(b))
        for v in m.check(float(b)):
            assert v.kind == "gpu_problem", v
            ev = VERDICT_EVENTS[v.kind](task=v.task, host="h", message=v.message, **v.data)
            events.append(event_from_dict(json.loads(json.dumps(ev.to_dict()))))
    return events, m


def status_and_metrics(m: Monitor) -> tuple[dict[str, Any], set[tuple[str, str, str]]]:
    _, plan = make_plan(3)
    sessions = {str(n.task): TaskSession(n) for n in plan.nodes}
    status = Snapshots(sessions, Figures()).build(
        state=JobState.RUNNING, attempt=0, stopping_reason=None, straggler=None, gpu_problems=m.gpus.judgement.by_task()
    )
    metrics = JobMetrics("job", "run")
    metrics.update(status)
    found = set()
    for fam in _Collector(metrics).collect():
        if fam.name == "tfcluster_task_gpu_problem":
            found |= {(s.labels["task"], s.labels["gpu"], s.labels["problem"]) for s in fam.samples if s.value == 1}
    return status, found


def report_of(tmp_path: Path, sample: Sample) -> dict[str, Any]:
    """A finished run's directory with these heartbeats (training, equal step-clock windows on every
    worker: only the GPUs differ), reported."""
    plan = {
        "job": "gpus",
        "nodes": [{"host": f"10.0.0.{i + 1}", "task": {"type": "worker", "index": i}} for i in range(3)],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    events = [
        {
            "ts": T0,
            "event": "task_ready",
            "task": t,
            "host": f"10.0.0.{i + 1}",
            "hostname": f"node{i}",
            "pid": 100 + i,
            "gpus": [{"name": MODEL, "memory_mb": 81559}],
        }
        for i, t in enumerate(TASKS)
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = []
    for b in range(BEATS):
        for t in TASKS:
            lines.append(
                {
                    "task": t,
                    "kind": "heartbeat",
                    "ts": T0 + b,
                    "seq": b + 1,
                    "gpus": [sample(t, b)],
                    "host": {"interval_s": 1.0, "run_ms": 800.0, "wait_ms": 50.0},
                    "progress": {"steps": 20 * (b + 1), "ts": T0 + b},
                }
            )
            if b % 2:
                lines.append(
                    {
                        "task": t,
                        "kind": "profile",
                        "ts": T0 + b,
                        "steps": 40,
                        "step_ms": 50.0,
                        "input_ms": 1.0,
                        "compute_ms": 30.0,
                        "collective_ms": 15.0,
                        "update_ms": 2.0,
                        "host_ms": 2.0,
                        "other_ms": 0.0,
                        "pre_collective_ms": 35.0,
                    }
                )
    (tmp_path / "heartbeats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return build_report(RunDir(tmp_path))


def named_everywhere(tmp_path: Path, sample: Sample) -> dict[str, Any]:
    """(task, problem) as each view names them, and the texts, for one set of heartbeats."""
    events, m = monitor_events(sample)
    status, metrics = status_and_metrics(m)
    rep = report_of(tmp_path, sample)
    text = status_text(
        {"job": "gpus", "state": "running", "run_dir": str(tmp_path), **status}, RunHandle(RunDir(tmp_path))
    )
    return {
        "events": {(e.task, e.problem) for e in events},
        "status": {(t, g["problem"]) for t, s in status["tasks"].items() for g in s["gpu_problems"]},
        "metrics": {(t, problem) for t, _, problem in metrics},
        "report": {(g["task"], g["problem"]) for g in rep.to_dict()["gpu_problems"]},
        "messages": [e.message for e in events],
        "advice": rep.advice,
        "text": report_text(rep),
        "status_text": text,
    }


def test_healthy_h100s_at_their_power_cap_are_named_nowhere(tmp_path):
    got = named_everywhere(tmp_path, loaded)
    assert got["events"] == got["status"] == got["metrics"] == got["report"] == set()
    assert not any("GPU" in a for a in got["advice"]), got["advice"]
    assert "GPU problems" not in got["status_text"]
    assert "median SM clock 1.4" in got["text"]  # what they do run at, shown, not judged


@pytest.mark.parametrize(
    ("change", "problem", "words"),
    [
        (hw_slowdown, "fault", "worker:1's GPU 0: HW slowdown at 0.84 GHz of 1.98 GHz, 61 °C, 402 W of 700 W"),
        (capped_400w, "power limit", "worker:1's GPU 0: its power limit is 400 W, below the board's default 700 W"),
    ],
    ids=["hw-slowdown", "capped-400w"],
)
def test_one_faulty_or_capped_gpu_is_named_alone_with_its_reason_everywhere(tmp_path, change, problem, words):
    got = named_everywhere(tmp_path, on("worker:1", change))
    assert got["events"] == got["status"] == got["metrics"] == got["report"] == {("worker:1", problem)}
    assert len(got["messages"]) == 1 and got["messages"][0].startswith(words)  # announced once
    assert any(words in a for a in got["advice"]), got["advice"]
    assert not any("worker:0" in a or "worker:2" in a for a in got["advice"])


def test_a_gpu_shared_with_another_program_is_named_with_its_pid_and_memory(tmp_path):
    got = named_everywhere(tmp_path, on("worker:2", shared))
    assert got["events"] == got["status"] == got["metrics"] == got["report"] == {("worker:2", "shared")}
    words = "worker:2's GPU 0: shared with a process outside the task: PID 461 (python3, 1002 MB)"
    assert got["messages"] == [words] and any(words in a for a in got["advice"])
    assert f"GPU problems:\n  {words}" in got["status_text"]  # `tfcluster status` of the running job


# --- the rules, one by one ---------------------------------------------------------------------------


def judge(sample: Sample, beats: int = 3, **kw: Any):
    return judge_gpus({t: [[sample(t, b)] for b in range(beats)] for t in TASKS}, **kw)


def test_a_power_limit_below_the_peers_is_named_where_the_default_is_unknown():
    """An older node (no default limit in its samples): the limit is compared with its peers'."""

    def old(t: str, b: int) -> dict[str, Any]:
        g = {k: v for k, v in loaded(t, b).items() if k != "power_default_limit_w"}
        return capped_400w(g) if t == "worker:1" else g

    (got,) = judge(old).problems
    assert (got.task, got.problem) == ("worker:1", "power limit")
    assert "its power limit is 400 W, below its peers' 700 W" in got.detail


def test_clock_below_the_peers_beyond_the_chip_spread_is_slow_within_it_is_not():
    def scaled(factor: float) -> Sample:
        return on("worker:0", lambda g: {**g, "sm_clock_mhz": round(g["sm_clock_mhz"] * factor)})

    assert judge(scaled(0.92)).problems == ()  # within the spread of chips under a power limit
    (got,) = judge(scaled(0.78)).problems
    assert (got.task, got.problem) == ("worker:0", "slow") and "below its peers'" in got.detail
    assert "reasons: power cap" in got.detail


def test_power_cap_is_named_when_its_worker_is_slower_than_its_peers_or_its_own_best():
    """Same clocks everywhere (power cap, normal), but the step clock says worker:2 works 1.6x as long per
    step as its same-model peers, or 1.8x its own best while the others hold theirs."""
    even = {t: {"local_ms": 20.0, "individual": 1.0} for t in TASKS}
    assert judge(loaded, work=even).problems == ()
    (got,) = judge(loaded, work={**even, "worker:2": {"local_ms": 32.0, "individual": 1.0}}).problems
    assert (got.task, got.problem) == ("worker:2", "slow")
    assert "its worker's own work per step is 1.6x its same-model peers' (32.0 vs 20.0 ms)" in got.detail
    drift = {"local_ms": 36.0, "individual": 0.55, "best_local_ms": 20.0}
    lone = {t: [[loaded(t, b)] for b in range(3)] for t in ("worker:2",)}
    (got,) = judge_gpus(lone, work={"worker:2": drift}).problems  # one worker: no peers, its own best
    assert "1.8x its own best (36.0 vs 20.0 ms)" in got.detail


def test_idle_gpus_and_a_gpu_just_after_its_load_are_not_judged_slow():
    idle = H100["idle"][0]
    after = {**H100["load"][5], "util": 20, "sm_clock_mhz": 1980, "throttle": []}
    assert judge(lambda t, b: idle if t == "worker:0" else loaded(t, b)).problems == ()
    assert judge(lambda t, b: after if t == "worker:0" else loaded(t, b)).problems == ()


def test_thermal_and_errors_are_faults_one_odd_sample_is_not():
    def thermal(t: str, b: int) -> dict[str, Any]:
        g = loaded(t, b)
        return {**g, "throttle": ["power cap", "thermal (SW)"], "temp_c": 88} if t == "worker:0" and b == 1 else g

    assert judge(thermal, beats=10).problems == ()  # one sample in ten: a blip
    ecc = on("worker:0", lambda g: {**g, "ecc_uncorrected": 2, "xid_errors": 1, "last_xid": 79})
    (got,) = judge(ecc).problems
    assert (
        got.problem == "fault"
        and got.detail == "2 uncorrected ECC errors (volatile count); 1 critical XID event (last: XID 79)"
    )


def test_processes_in_another_pid_namespace_are_named_only_when_one_cannot_be_the_tasks_own():
    """Inside a container NVML's PIDs may be the host's: one unplaced process is likely the task itself."""
    procs = POWER["procs_while_shared"]
    one = on("worker:1", lambda g: {**g, "others": [{"pid": procs[0]["pid"], "used_mb": 1002, "visible": False}]})
    assert judge(one).problems == ()
    two = on(
        "worker:1",
        lambda g: {**g, "others": [{"pid": x["pid"], "used_mb": x["used_mb"], "visible": False} for x in procs]},
    )
    (got,) = judge(two).problems
    assert got.problem == "shared" and "cannot place (PIDs 460 (1002 MB), 461 (1002 MB)" in got.detail


def test_a_problem_is_announced_once_and_again_after_it_cleared():
    m = Monitor(TASKS, Policy(), now=0.0)
    kinds = []
    for b in range(12):
        bad = b < 3 or b >= 8  # HW slowdown, gone for 5 rounds, back
        for t in TASKS:
            g = hw_slowdown(loaded(t, b)) if bad and t == "worker:1" else loaded(t, b)
            m.on_heartbeat(t, p.Heartbeat(seq=b + 1, ts=T0 + b, gpus=[p.GpuSample.from_dict(g)]), float(b))
        kinds += [(b, v.task) for v in m.check(float(b))]
    assert [t for _, t in kinds] == ["worker:1", "worker:1"] and kinds[1][0] >= 8


# --- the real path: nodes' heartbeats → supervisor → events.jsonl, status.json, metrics, report ----------


def test_through_a_running_job_one_judgement_reaches_every_view(tmp_path):
    """Fake nodes send the real H100 readings (worker:1's GPU at HW slowdown) through the real supervisor:
    the live status and the metrics name worker:1 alone; so do events.jsonl and the finished run's report."""
    sample = on("worker:1", hw_slowdown)
    done = threading.Event()
    seen: dict[str, Any] = {}

    def node(n: FakeNode) -> None:
        n.hello(gpus=[p.GpuInfo(index=0, name=MODEL, memory_mb=81559)])
        if not isinstance(n.wait_for(p.Go), p.Go):
            n.exited(None, not_started=True, reason="stopped before the go")
            return
        n.send(p.Spawned(pid=2000 + n.node.task.index))
        deadline = time.monotonic() + 60
        b = 0
        while not done.is_set() and time.monotonic() < deadline:
            n.heartbeat(
                state="running",
                gpus=[p.GpuSample.from_dict(sample(n.task, b))],
                progress=p.Progress(steps=10 * (b + 1), ts=time.time()),
            )
            b += 1
            cmd = n.next_command(0.05)
            if isinstance(cmd, p.Stop) or n.eof:
                stopped(n, cmd)
                return
        n.exited(0)

    def watch(run: Path) -> None:
        """Until the live status and the metrics both name a GPU problem (or a minute passed)."""
        try:
            wait_for(lambda: named_by_both(run), 60, "a GPU problem named by status.json and /metrics")
        finally:
            done.set()

    def named_by_both(run: Path) -> bool:
        status = json.loads((run / "status.json").read_text()) if (run / "status.json").exists() else {}
        named = {(t, g["problem"]) for t, s in (status.get("tasks") or {}).items() for g in s.get("gpu_problems") or []}
        info = json.loads((run / "launcher.json").read_text()) if (run / "launcher.json").exists() else {}
        scraped = set()
        if named and info.get("metrics_url"):
            with urllib.request.urlopen(info["metrics_url"], timeout=5) as r:
                for fam in text_string_to_metric_families(r.read().decode()):
                    scraped |= {
                        (s.labels["task"], s.labels["problem"])
                        for s in fam.samples
                        if fam.name == "tfcluster_task_gpu_problem"
                    }
        if named and scraped:
            seen.update(status=named, metrics=scraped)
        return bool(named and scraped)

    loaded_spec, plan = make_plan(3, metrics={"port": 0})
    backend = FakeBackend({t: node for t in TASKS})
    run = tmp_path / "run"
    job = Job(loaded_spec, plan, LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False), backend)
    watcher = threading.Thread(target=watch, args=(run,))
    watcher.start()
    result = job.run()
    watcher.join()
    assert result.state.value == "succeeded", result.root_cause
    assert seen == {"status": {("worker:1", "fault")}, "metrics": {("worker:1", "fault")}}
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    problems = [e for e in events if e["event"] == "gpu_problem"]
    assert [(e["task"], e["problem"], e["gpu"], e["model"]) for e in problems] == [("worker:1", "fault", 0, MODEL)]
    assert problems[0]["message"].startswith("worker:1's GPU 0: HW slowdown at 0.84 GHz of 1.98 GHz")
    assert problems[0]["reading"]["reasons"] == ["HW slowdown"]
    rep = build_report(RunDir(run))
    assert {(g["task"], g["problem"]) for g in rep.to_dict()["gpu_problems"]} == {("worker:1", "fault")}


def test_damaged_samples_are_skipped_not_raised():
    """A hand-edited or torn heartbeats.jsonl reaches report: odd shapes are left out, never a traceback."""
    odd = [
        [{"index": 0, "throttle": "power cap", "others": {"pid": 1}}],
        ["not a gpu"],
        None,
        [{"index": "0"}],
        [{"index": 1, "others": [{"pid": "7"}, 5, {"pid": 9, "used_mb": "x", "name": 3}]}],
    ]
    got = judge_gpus({"worker:0": odd}, models={"worker:0": ["bad", {"name": MODEL}]})
    assert [(p.gpu, p.problem, p.detail) for p in got.problems] == [
        (1, "shared", "shared with a process outside the task: PID 9 (unreadable)")
    ]


def test_only_a_busy_gpus_problem_makes_its_worker_the_one_to_wait_for():
    """A 400 W limit on an idle GPU is named (a configuration), but slows no step: no straggler suspect."""
    idle_capped = on("worker:1", lambda g: capped_400w({**H100["idle"][0], "power_default_limit_w": DEFAULT_W}))
    got = judge(idle_capped)
    assert [(p.task, p.problem) for p in got.problems] == [("worker:1", "power limit")] and got.suspect() is None
    assert judge(on("worker:1", capped_400w)).suspect()[:2] == ("worker:1", "GPU power limit")
