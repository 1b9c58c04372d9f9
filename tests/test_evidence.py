"""Host and GPU evidence, scores, and how the monitor names a straggler from them (pure, no sshd)."""

from __future__ import annotations

from orchestrator.supervise import Monitor, Policy, explain, find_straggler, host_suspect, judge_gpus
from orchestrator.supervise.evidence import Scores, starved
from worker_entry import protocol as p

TASKS = ["worker:0", "worker:1", "worker:2"]


def hosts(**per_task):
    """{task: [samples]} with the given fields for the named tasks and a quiet baseline elsewhere."""
    base = {"interval_s": 1.0, "wait_pct": 30.0, "steal_pct": 0.0, "tcp_retrans_pct": 0.0}
    return {t: [{**base, **per_task.get(t.replace(":", ""), {})}] * 3 for t in TASKS}


def test_host_evidence_names_one_starved_worker_only():
    f = host_suspect(hosts(worker1={"wait_pct": 85.0}))
    assert f is not None and (f.task, f.cause) == ("worker:1", "host CPU")
    assert "85%" in f.detail and "30% on the other workers" in f.detail
    # every worker starved alike (one overloaded box): nobody stands out
    assert host_suspect({t: [{"wait_pct": 80.0}] for t in TASKS}) is None
    assert host_suspect(hosts()) is None


def test_starvation_compares_run_queue_delay_per_cpu_second_not_percentages():
    """On a box where every worker already waits 67 % of its runnable time, a quota'd worker at 93 % is
    5x as starved per CPU second; a worker at 75 % is not."""

    def sample(pct):
        return {"interval_s": 1.0, "run_ms": 100.0 - pct, "wait_ms": pct, "wait_pct": pct}

    busy = {t: [sample(67.0)] * 3 for t in TASKS}
    assert host_suspect({**busy, "worker:1": [sample(93.0)] * 3}).task == "worker:1"
    assert host_suspect({**busy, "worker:1": [sample(75.0)] * 3}) is None


def test_cgroup_throttling_steal_cpu_clock_and_retransmissions():
    f = host_suspect(hosts(worker2={"throttled_pct": 62.0, "quota_cpus": 0.2, "wait_pct": 80.0}))
    assert f.task == "worker:2" and "throttled it 62%" in f.detail and "quota 0.2 CPU" in f.detail
    f = host_suspect(hosts(worker0={"steal_pct": 35.0}))
    assert f.task == "worker:0" and "steals 35%" in f.detail
    clocked = hosts(worker1={"cpu_mhz": 1200.0, "cpu_max_mhz": 3000.0})
    for t in ("worker:0", "worker:2"):
        clocked[t] = [{**s, "cpu_mhz": 2900.0, "cpu_max_mhz": 3000.0} for s in clocked[t]]
    f = host_suspect(clocked)
    assert f.task == "worker:1" and "1.20 GHz of 3.00 GHz" in f.detail
    f = host_suspect(hosts(worker2={"tcp_retrans_pct": 4.0, "net_errors": 12}))
    assert (f.task, f.cause) == ("worker:2", "network") and "4.0%" in f.detail


def gpu(index=0, clock=1440, top=1980, util=98, throttle=("power cap",)):
    return {"index": index, "sm_clock_mhz": clock, "sm_clock_max_mhz": top, "util": util, "throttle": list(throttle)}


def test_a_gpu_slower_than_its_peers_is_attributed_to_its_worker_alone():
    """Every busy GPU is power-capped (normal); worker:3's GPU 2 runs 24 % below the other GPUs: it alone
    is the suspect (tests/test_gpus.py judges the real H100 readings)."""
    gpus = {"worker:0": [[gpu()]], "worker:1": [[gpu()]], "worker:3": [[gpu(), gpu(2, 1100)]]}
    task, cause, detail = judge_gpus(gpus).suspect()
    assert (task, cause) == ("worker:3", "GPU slow")
    assert detail.startswith("worker:3's GPU 2: runs at 1.10 GHz, 24% below its peers' 1.44 GHz")
    assert judge_gpus({t: [[gpu()]] for t in TASKS}).problems == ()  # every healthy GPU at its power cap


def profile(pre, step=60.0, **kw):
    return {
        "pre_collective_ms": pre,
        "step_ms": step,
        "input_ms": 1.0,
        "compute_ms": pre - 1.0,
        "collective_ms": step - pre,
        "update_ms": 0.0,
        "host_ms": 0.0,
        **kw,
    }


def test_explain_puts_the_gpu_or_host_cause_on_the_step_clocks_finding():
    profiles = {"worker:0": profile(4), "worker:1": profile(4), "worker:2": profile(30)}
    finding = find_straggler(profiles)
    assert finding.cause == "compute"
    gpus = {"worker:0": [[gpu()]], "worker:1": [[gpu()]], "worker:2": [[gpu(1, 1200, throttle=["thermal (HW)"])]] * 3}
    got = explain(finding, {}, judge_gpus(gpus), profiles)
    assert got.cause == "GPU fault" and got.detail == "worker:2's GPU 1: thermal (HW) at 1.20 GHz of 1.98 GHz"
    got = explain(finding, hosts(worker2={"wait_pct": 90.0}), None, profiles)
    assert got.cause == "host CPU" and got.task == "worker:2"


def test_a_moderately_starved_worker_the_step_clock_names_gets_the_host_cause():
    profiles = {"worker:0": profile(4), "worker:1": profile(12, compute_ms=3.0, update_ms=8.0), "worker:2": profile(4)}
    finding = find_straggler(profiles)
    assert (finding.task, finding.cause) == ("worker:1", "after the all-reduce")

    def sample(pct):
        return [{"run_ms": 100.0 - pct, "wait_ms": pct}] * 3

    moderate = {"worker:0": sample(65.0), "worker:1": sample(80.0), "worker:2": sample(66.0)}
    assert host_suspect(moderate) is None  # not enough on its own (2.2x per CPU second)
    got = explain(finding, moderate, None, profiles)
    assert got.cause == "host CPU" and "80%" in got.detail and "optimizer update" in got.detail


def test_an_input_bound_worker_that_runs_less_cpu_is_not_called_starved():
    """The CI case: worker:1's input pipeline sleeps 37 ms a step. It runs less CPU than the others, so the
    same run-queue delay per wall second is 2.75x theirs per CPU second and its host looks starved; but its
    delay per wall second is no higher than theirs, so it cannot explain 37 ms of a 100 ms step. A worker
    whose delay per wall second is well above the others' keeps the host cause."""
    profiles = {
        "worker:0": profile(20, step=100.0),
        "worker:1": profile(57, step=100.0, input_ms=38.0, compute_ms=19.0),
        "worker:2": profile(20, step=100.0),
    }
    finding = find_straggler(profiles)
    assert (finding.task, finding.cause) == ("worker:1", "input pipeline")

    def sample(run_ms, wait_ms):
        return [{"interval_s": 1.0, "run_ms": run_ms, "wait_ms": wait_ms}] * 3

    sleeper = {"worker:0": sample(600, 600), "worker:1": sample(200, 550), "worker:2": sample(600, 600)}
    assert host_suspect(sleeper).task == "worker:1"  # the odds alone would name its host
    got = explain(finding, sleeper, None, profiles)
    assert (got.task, got.cause) == ("worker:1", "input pipeline"), got
    moderate = {**sleeper, "worker:1": sample(300, 550)}  # 1.8x per CPU second: corroboration only
    assert host_suspect(moderate) is None and starved(moderate, "worker:1") is not None
    assert explain(finding, moderate, None, profiles).cause == "input pipeline"
    starving = {**sleeper, "worker:1": sample(200, 900)}  # 0.3 s more delay per wall second than the others
    got = explain(finding, starving, None, profiles)
    assert (got.task, got.cause) == ("worker:1", "host CPU") and "input pipeline" in got.detail, got


def test_explain_names_a_starved_worker_the_step_clock_cannot_see():
    """A CPU-starved worker stalls inside the ring all-reduce: every worker's time outside it is the
    same, so the step clock names nobody; its host does."""
    profiles = {t: profile(4, collective_ms=56) for t in TASKS}
    assert find_straggler(profiles) is None
    got = explain(None, hosts(worker1={"wait_pct": 88.0}), None, profiles)
    assert (got.task, got.cause, got.wait_ms) == ("worker:1", "host CPU", 0.0)
    assert explain(None, hosts(), None, profiles) is None


def hb(task, wait_pct, seq=1):
    return p.Heartbeat(seq=seq, ts=1.0, host=p.HostSample(interval_s=1.0, wait_pct=wait_pct))


def _host_only_rounds(m: Monitor, starved_in: range, rounds: int) -> list:
    """``rounds`` profile rounds in which nobody stands out on the step clock (every worker's stall is inside
    the all-reduce) and worker:1's threads wait for a CPU 86 % of the time in the rounds of ``starved_in``."""
    out = []
    for r in range(rounds):
        for t in TASKS:
            m.on_heartbeat(t, hb(t, 86.0 if t == "worker:1" and r in starved_in else 28.0, r), float(r))
        for t in TASKS:
            out += m.on_profile(t, profile(4, collective_ms=56), float(r))
    return [v for v in out if v.kind == "straggler"]


def test_a_few_seconds_of_host_evidence_alone_name_nobody():
    """CI, 15 runnable processes on 2 cores: one worker's run-queue delay jumped for one heartbeat window,
    with nothing on the step clock (its 3-beat window carries it 3 rounds); host evidence alone needs twice
    the step clock's confirmations."""
    assert _host_only_rounds(Monitor(TASKS, Policy(), now=0.0), range(1, 3), 6) == []  # 3 rounds of evidence
    assert len(_host_only_rounds(Monitor(TASKS, Policy(), now=0.0), range(1, 6), 6)) == 1


def test_monitor_names_the_starved_worker_after_four_rounds_and_only_it():
    m = Monitor(TASKS, Policy(), now=0.0)
    out = []
    for r in range(5):
        for t in TASKS:
            m.on_heartbeat(t, hb(t, 86.0 if t == "worker:1" else 28.0, r), float(r))
        for t in TASKS:
            out += m.on_profile(t, profile(4, collective_ms=56), float(r))
    stragglers = [v for v in out if v.kind == "straggler"]
    assert [(v.task, v.data["cause"]) for v in stragglers] == [("worker:1", "host CPU")]
    assert "every worker's 60 ms step waits for it" in stragglers[0].message
    assert "waited for a CPU 86%" in stragglers[0].message


def test_scores_and_a_worker_slowing_down_against_its_own_best():
    """All workers equally slow at first (relative 1.0); worker:2 drifts to 2x its own best: flagged once."""
    m = Monitor(TASKS, Policy(), now=0.0)
    verdicts = []
    for r in range(10):
        drift = 20.0 if r < 4 else 40.0
        for t in TASKS:
            verdicts += m.on_profile(t, profile(drift if t == "worker:2" else 20.0, step=100.0), float(r))
    slowing = [v for v in verdicts if v.kind == "worker_slowing"]
    assert [v.task for v in slowing] == ["worker:2"], [(v.kind, v.task) for v in verdicts]
    assert slowing[0].data["individual_score"] == 0.5 and slowing[0].data["best_local_ms"] == 20.0
    assert m.scores["worker:0"] == {"local_ms": 20.0, "relative": 1.0, "individual": 1.0, "best_local_ms": 20.0}
    # the whole job slowing together is not one worker slowing
    m = Monitor(TASKS, Policy(), now=0.0)
    verdicts = []
    for r in range(10):
        for t in TASKS:
            verdicts += m.on_profile(t, profile(20.0 if r < 4 else 40.0, step=100.0), float(r))
    assert [v for v in verdicts if v.kind == "worker_slowing"] == []


def test_scores_ignore_one_odd_window():
    s = Scores()
    for local in (20, 20, 20, 20, 60, 20, 20):
        got = s.update({"worker:0": {"pre_collective_ms": local}, "worker:1": {"pre_collective_ms": 20}})
        assert got["worker:0"]["individual"] == 1.0


def test_one_burst_of_retransmissions_names_no_host():
    """A link that resent 40 % in one interval and nothing in the others is not degraded (the median
    interval judges, not the mean); one that resends in most intervals is."""
    burst = hosts()
    burst["worker:1"] = [{**burst["worker:1"][0], "tcp_retrans_pct": v} for v in (40.0, 0.0, 0.0)]
    assert host_suspect(burst) is None
    steady = hosts()
    steady["worker:1"] = [{**steady["worker:1"][0], "tcp_retrans_pct": v} for v in (3.0, 2.5, 0.0)]
    f = host_suspect(steady)
    assert (f.task, f.cause) == ("worker:1", "network") and "2.5%" in f.detail
