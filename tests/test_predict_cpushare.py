"""`predict` from CPU-starved runs (issue 32, item 3): TensorFlow's all-reduce as `tfcluster check` measured
it (not the links alone), each worker's own work grown by the share of a machine's cores it gets when k
workers land on one machine (processor sharing, from one run's CPU figures), and per size what the
prediction rests on or why it cannot be made with confidence. Recorded inputs: `bench/predict_accuracy.py`
on the namespace bed, 2026-11-27 (three hosts on one 2-core machine, other sessions' tests beside them).
Pure: no TensorFlow, no hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.views import cpushare
from orchestrator.views import predict as view
from orchestrator.views.predict_model import Network, fit_allreduce, ring_allreduce_s

GRAD_BYTES = 2_761_732  # Dense 128-768-768-1: the traced gradients
LINKS = Network(0.000195, 19_911_485.0, "check.json (slowest link)")
# check.json's all-reduce rounds, load 0 (TensorFlow's ring at 3 ranks on the same CPU-starved machine)
ROUNDS = [
    {"bytes": 65536, "latency_s": 0.018929, "ranks": 3, "communication": "ring"},
    {"bytes": 4194304, "latency_s": 0.331453, "ranks": 3, "communication": "ring"},
]
BOOT = "a435aaee-81a0-4a55-8503-12a19cb96abc"  # every namespace host's kernel: one machine
# the one-worker run's step-clock windows (cpu_ms, step_ms) and its heartbeats' run-queue delay (%)
WINDOWS_1 = [(20.398, 20.309), (17.264, 15.573), (18.125, 19.427), (18.499, 22.159), (18.837, 19.651)]
WAITS_1 = [66.4, 63.9, 66.7, 67.2, 66.6, 67.5, 67.3, 66.9, 66.1, 70.5, 70.5, 85.6, 67.1, 80.3, 68.1, 65.9]
# measured (split of the median worker): step, all-reduce, wait
MEASURED = {1: (19.103, 0.0, 0.0), 2: (184.845, 149.778, 2.985), 3: (329.949, 268.53, 0.0)}
CPU_WAIT = {"kind": "cpu wait", "detail": "all workers' training processes waited for a CPU 67-80% of the time"}


def _run(root: Path, n: int, machine: str | None = BOOT, cpus: int | None = 2) -> Path:
    run = root / f"workers-{n}"
    run.mkdir()
    prof = {"kind": "profile", "source": "stepclock", "steps": 50, "grad_bytes": GRAD_BYTES, "grad_tensors": 6}
    prof.update(grad_packs=1, allreduce_impl="ring")
    lines = []
    for t in range(n):
        lines += [
            {**prof, "task": f"worker:{t}", "cpu_ms": c, "step_ms": s, "pre_collective_ms": s} for c, s in WINDOWS_1
        ]
        lines += [
            {"task": f"worker:{t}", "seq": i, "host": {"run_ms": 300.0, "wait_pct": w}} for i, w in enumerate(WAITS_1)
        ]
    (run / "heartbeats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    ready = [
        {"ts": 1.0, "event": "task_ready", "task": f"worker:{t}", "host": f"10.0.0.{t + 2}", "hostname": f"host{t}"}
        | {"pid": 100 + t, "gpus": [], "cpus": cpus, "machine": machine}
        for t in range(n)
    ]
    (run / "events.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in e.items() if v is not None}) + "\n" for e in ready)
    )
    return run


def _sweep(tmp_path: Path, sizes=(1, 2, 3), machine: str | None = BOOT, problems=True) -> list[dict]:
    out = []
    for n in sizes:
        step, ar, wait = MEASURED[n]
        split = {"worker": "worker:0", "step_ms": step, "allreduce_ms": ar, "waiting_for_slowest_ms": wait}
        out.append(
            {
                "workers": n,
                "run_dir": str(_run(tmp_path, n, machine)),
                "split": split,
                "per_worker_batch": 32,
                "shared_problems": [CPU_WAIT] if problems else [],
            }
        )
    return out


# ------------------------------------------------------------------ the all-reduce as TensorFlow ran it


def test_the_checks_allreduce_rounds_give_alpha_and_b_as_tensorflow_ran_them():
    net = fit_allreduce(ROUNDS, LINKS)
    assert net is not None and "TensorFlow's all-reduce measured at 3 ranks" in net.source
    # t = a + b·S through the two rounds: a = 2(n-1)·alpha, b = 2(n-1)/n / B (hand-computed)
    slope = (0.331453 - 0.018929) / (4194304 - 65536)
    assert net.bandwidth_Bps == pytest.approx(4 / 3 / slope, rel=1e-6)
    assert net.latency_s == pytest.approx((0.018929 - slope * 65536) / 4, rel=1e-6)
    # it reproduces both rounds at 3 ranks, where the links alone predict 15 % less for the large one
    for r in ROUNDS:
        assert ring_allreduce_s(3, r["bytes"], net) == pytest.approx(r["latency_s"], rel=1e-6)
    assert ring_allreduce_s(3, 4194304, LINKS) < 0.9 * 0.331453


def test_a_fit_never_claims_a_faster_network_than_the_links_and_needs_two_sizes():
    fast = [{"bytes": 65536, "latency_s": 1e-5, "ranks": 2}, {"bytes": 4194304, "latency_s": 1e-4, "ranks": 2}]
    net = fit_allreduce(fast, LINKS)
    assert net is not None and net.bandwidth_Bps == LINKS.bandwidth_Bps and net.latency_s == LINKS.latency_s
    assert fit_allreduce(ROUNDS[:1], LINKS) is None  # one size: no line
    assert fit_allreduce([{**r, "ranks": 1} for r in ROUNDS], LINKS) is None  # one rank: no all-reduce
    assert fit_allreduce([ROUNDS[1], {**ROUNDS[0], "latency_s": 0.5}], LINKS) is None  # larger is faster: no fit
    assert fit_allreduce([{"bytes": "x"}], LINKS) is None


def test_check_json_with_rounds_is_read_as_tensorflows_allreduce(tmp_path):
    path = tmp_path / "check.json"
    path.write_text(
        json.dumps({"network": {"latency_s": 0.000195, "bandwidth_Bps": 19_911_485.0}, "allreduce": ROUNDS})
    )
    net = view.network_of(str(path), None)
    assert net.bandwidth_Bps < LINKS.bandwidth_Bps and "at 3 ranks" in net.source
    path.write_text(json.dumps({"network": {"latency_s": 0.000195, "bandwidth_Bps": 19_911_485.0}}))
    assert view.network_of(str(path), None).source.endswith("(slowest link)")  # an older check.json: the links


# --------------------------------------------------------------------------- the CPU share of a machine


def test_processor_sharing_by_hand():
    # one worker kept 1 core busy and waited 50 %: it wanted 2; the machine's 4 cores had 8 runnable: others 6
    share = cpushare.CpuShare(demand_cores=1.0, wait=0.5, cores=4.0)
    assert share.runnable == 2.0 and share.total_at_run == 8.0 and share.others == 6.0
    assert share.inflation(1) == 1.0
    assert share.inflation(2) == pytest.approx(10 / 8) and share.inflation(4) == pytest.approx(14 / 8)
    # an idle machine: no sign of others; 2 workers of 1 core each fit on 4 cores, 8 do not
    idle = cpushare.CpuShare(demand_cores=1.0, wait=0.0, cores=4.0)
    assert idle.others == 0.0 and idle.inflation(2) == 1.0 and idle.inflation(8) == pytest.approx(2.0)


def test_layout_by_boot_id_else_hostname_and_future_sizes_spread_over_the_sweeps_machines():
    one = [{"task": f"worker:{t}", "hostname": f"host{t}", "machine": BOOT} for t in range(3)]
    old = [{"task": f"worker:{t}", "hostname": f"host{t}"} for t in range(3)]  # before task_ready had a machine
    assert cpushare.layout_of(one) == (1, 3) and cpushare.layout_of(old) == (3, 1)
    assert cpushare.per_machine_at(2, {1: (1, 1), 3: (1, 3)}) == 2  # 3 on one machine: 2 share it too
    assert cpushare.per_machine_at(8, {1: (1, 1), 3: (1, 3)}) == 3  # as densely as the largest size measured
    assert cpushare.per_machine_at(8, {1: (1, 1), 3: (3, 1)}) == 1  # a machine each: new workers bring cores
    assert cpushare.per_machine_at(8, {}) == 1


def test_share_of_the_recorded_one_worker_run(tmp_path):
    run = _run(tmp_path, 1)
    recs = [json.loads(line) for line in (run / "heartbeats.jsonl").read_text().splitlines()]
    ready = view._ready(run)
    share = cpushare.share_of(
        [r for r in recs if r.get("kind") == "profile"], [r for r in recs if "kind" not in r], ready
    )
    assert share is not None and share.cores == 2.0 and share.per_machine == 1
    assert share.wait == pytest.approx(0.6715, abs=1e-3)
    assert share.demand_cores == pytest.approx(0.9462, abs=1e-3)  # windows after the first: cpu_ms / step_ms
    # without the CPU count (a run from before task_ready carried it): nothing to model
    assert cpushare.share_of(recs, recs, [{**ready[0], "cpus": None}]) is None


# ---------------------------------------------------------------------------------- predict on them


def test_the_recorded_cpu_starved_sweep_predicted_within_25_percent_or_said_it_cannot(tmp_path, monkeypatch):
    measured = _sweep(tmp_path)
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    check = tmp_path / "check.json"
    check.write_text(
        json.dumps(
            {"network": {"latency_s": LINKS.latency_s, "bandwidth_Bps": LINKS.bandwidth_Bps}, "allreduce": ROUNDS}
        )
    )
    pred = view.build_prediction(tmp_path, [2, 3, 8], view.network_of(str(check), None))
    sizes = {s["workers"]: s for s in pred["sizes"]}
    # 2 workers from the one-worker run: two workers on one machine's 2 cores, own work x1.47 by the share
    two = sizes[2]
    assert two["workers_per_machine"] == 2 and two["own_inflation"] == pytest.approx(1.47, abs=0.01)
    assert "processor sharing" in two["basis"] and "cannot_predict" not in two
    assert abs(two["step_error_pct"]) <= 25 and abs(two["allreduce_error_pct"]) <= 25, two
    # 3 workers: corrected with what 1 and 2 measured
    assert sizes[3]["corrected_from"] == [1, 2] and abs(sizes[3]["step_error_pct"]) <= 25, sizes[3]
    conf = pred["confidence"]
    assert conf["level"] == "low"
    kinds = [c["kind"] for c in conf["contradictions"]]
    assert kinds == ["own work grew with the workers", "workers waited for a CPU", "workers share a machine's cores"]
    assert any("2 share a machine's 2 usable cores" in r for r in conf["reasons"])
    assert pred["cpu_share"]["usable_cores"] == 2.0
    text = view.prediction_text(pred)
    assert "share a machine's 2 usable cores" in text and "scales well" not in text


def test_without_a_share_a_contradicted_size_says_it_cannot_be_predicted(tmp_path, monkeypatch):
    measured = _sweep(tmp_path)
    for m in measured:  # runs from before task_ready said which machine: three hosts, three machines
        ev = Path(m["run_dir"]) / "events.jsonl"
        ev.write_text(ev.read_text().replace(f',"machine": "{BOOT}"', "").replace(', "cpus": 2', ""))
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2, 3], fit_allreduce(ROUNDS, LINKS) or LINKS)
    two = next(s for s in pred["sizes"] if s["workers"] == 2)
    assert pred["cpu_share"] is None and two["basis"] == "the model"
    assert two["cannot_predict"].startswith("the measurements contradict the model (own work grew with the workers)")
    assert "? cannot predict 2 workers with confidence" in view.prediction_text(pred)


def test_workers_on_machines_of_their_own_keep_the_model(tmp_path, monkeypatch):
    measured = _sweep(tmp_path, machine=None, problems=False)
    for m in measured:  # each on a quiet machine of its own, no growth measured
        m["split"] = {
            "worker": "worker:0",
            "step_ms": 19.1 + m["workers"],
            "allreduce_ms": 1.0 * (m["workers"] > 1),
            "waiting_for_slowest_ms": 0.0,
        }
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2, 8], LINKS)
    assert pred["confidence"] == {"level": "high", "reasons": [], "contradictions": []}
    assert all(s.get("own_inflation", 1.0) <= 1.0 or s["workers_per_machine"] == 1 for s in pred["sizes"])
    assert not any("cannot_predict" in s for s in pred["sizes"])


def test_a_shared_machine_alone_lowers_the_confidence_and_the_advice_says_why(tmp_path, monkeypatch):
    measured = _sweep(tmp_path, sizes=(1, 3), problems=False)
    for m in measured:  # no growth measured, no CPU problem flagged: only the placement says they share
        m["split"] = {"worker": "worker:0", "step_ms": 19.1, "allreduce_ms": 0.0, "waiting_for_slowest_ms": 0.0}
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2], LINKS)
    two = next(s for s in pred["sizes"] if s["workers"] == 2)
    assert two["workers_per_machine"] == 2 and two["own_inflation"] > 1.25
    assert pred["confidence"]["level"] == "low"
    assert [c["kind"] for c in pred["confidence"]["contradictions"]] == ["workers share a machine's cores"]
    assert pred["advice"][0].startswith("own work per step grows x1.5 at 2 workers: 2 share a machine's cores")
    assert not any("scales well" in a for a in pred["advice"])
    assert any("share its 2 usable cores (processor sharing)" in a for a in pred["assumptions"])
    out, lines = view.sweep_prediction({"sizes": measured}, LINKS)  # scale's own check of predict: the same
    assert out["confidence"]["level"] == "low" and any("share a machine's 2 usable cores" in x for x in lines)


def test_workers_with_their_own_cpu_quota_do_not_share_one_quota():
    # pods with a 2-core quota each on a 16-core node: the run waited 50 % (throttled), k pods add their quotas
    share = cpushare.CpuShare(demand_cores=1.0, wait=0.5, cores=16.0, quota=2.0)
    assert share.pool(1) == 2.0 and share.pool(4) == 8.0 and share.pool(16) == 16.0
    assert share.inflation(2) == share.inflation(8) == 1.0  # 8 x 2 cores fit the node: nothing shared
    assert share.inflation(16) == pytest.approx(2.0)  # 16 x min(2, 2 runnable) on 16 cores
    assert cpushare.CpuShare(1.0, 0.5, 2.0).inflation(4) > 1.25  # one 2-core pool for all four would
    assert share.as_json()["usable_cores"] == 2.0 and share.as_json()["quota_cores"] == 2.0
