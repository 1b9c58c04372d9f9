"""The step clock's stamps in real TensorFlow, for every way of training (custom loops, Keras fit with
tf_keras and Keras 3, several optimizers, gradient accumulation, IndexedSlices): training unchanged,
known delays in their parts, XLA left alone, failures, GPU-sync structure; and 3 workers (e2e)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from worker_entry.instrument.stepclock import timeline as stepclock

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0  # seconds since the epoch, like tf.timestamp()

# --------------------------------------------------------------------- real TensorFlow, one process


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCLUSTER_") and k != "TF_CONFIG"}
    cwd = tmp_path_factory.mktemp("stamps")
    tmpdir = cwd / "tmp"  # TensorFlow's __autograph_generated_file*.py go here, not in the machine's /tmp
    tmpdir.mkdir()
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", STAMP_CASES_EXTRA="fail,sync", TMPDIR=str(tmpdir))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "workloads" / "stamp_cases.py")],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmpdir, ignore_errors=True)
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, err[-4000:]
    return json.loads(lines[0][7:]), err


EXPECTED_STEPS = {
    "loop": 24,
    "loop next inside": 24,
    "loop legacy optimizer": 24,
    "loop embedding": 24,
    "loop two optimizers": 24,
    "loop accumulation": 8,  # 32 micro-batches, every 4th all-reduces
    "loop accumulation together": 8,  # the same, each optimizer step's 4 micro-batches in one strategy.run
    "fit": 24,
    "fit 3 per execution": 24,
    "fit legacy optimizer": 24,
    "fit partial batches": 8,  # 2 epochs of 101 examples in batches of 32: 3 full, one of 5
    "keras 3 fit": 24,
    "delays": 16,
}


EXPECTED_EXAMPLES = {
    "loop accumulation": 8 * 4 * 32,
    "loop accumulation together": 8 * 4 * 32,  # every micro-batch counted, not the first argument's alone
    "fit partial batches": 2 * 101,
}


@pytest.mark.parametrize("case", sorted(EXPECTED_STEPS))
def test_every_way_of_training_is_stamped_and_unchanged(cases, case):
    results, _ = cases
    on, off = results[case]["on"], results[case]["off"]
    assert on["losses"] == off["losses"]  # bit-identical training with the stamps
    assert off["rows"] == 0 and on["rows"] > 0
    assert on["steps"] == EXPECTED_STEPS[case]  # steps derived from the stamps alone
    # examples from each step's own batch (no static batch dimension: batched without drop_remainder),
    # a partial last batch included (5 split 3 + 2 over the replicas)
    assert on["examples"] == EXPECTED_EXAMPLES.get(case, 32 * EXPECTED_STEPS[case])
    assert all(on["graph"]["batch_colocated"])  # the batch dimension is read where the batch is
    if case in ("loop next inside", "fit", "fit partial batches"):  # batches without a static dimension
        assert on["graph"]["batch_colocated"]
    rec = on["record"]
    parts = [rec[f"{k}_ms"] for k in stepclock.CATEGORIES]
    assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(rec["step_ms"], abs=0.01)
    assert rec["other_ms"] == 0  # every instant attributed to a measured part
    assert on["graph"]["chained"] == []  # no stamp waits for another one beyond the designed edges


def test_known_delays_land_in_their_parts(cases):
    """input: 120 ms per batch in the tf.data map, partly hidden by prefetching behind the rest of the
    step (the more, the busier the box): the step clock's input part must be the wait the training loop
    itself timed around each ``next()``, not a fixed share of the 120 ms; compute: 5 ms before the
    gradients, after: 5 ms after the update, per replica (the two replicas' py_functions run one after
    the other); host: 10 ms of Python between steps."""
    on = cases[0]["delays"]["on"]
    rec = on["record"]
    assert rec["compute_ms"] >= 9.5 and rec["update_ms"] >= 9.5 and rec["host_ms"] >= 9.5, rec
    waits = on["next_ms"][1:]  # the first next() comes before the warm-up step, which no window holds
    seen = sum(waits) / len(waits)
    assert seen >= 10, f"the input wait was hidden behind the step ({waits}): its attribution cannot be judged"
    assert 0.5 * seen <= rec["input_ms"] <= max(waits) + 5.0, (seen, waits, rec)  # + the in-function part


def test_xla_is_left_alone_and_failures_leave_training_unchanged(cases):
    results, err = cases
    assert (
        results["fit jit"]["on"]["rows"] == 0
        and results["fit jit"]["on"]["losses"] == results["fit jit"]["off"]["losses"]
    )
    for fail in ("_enter", "_exit", "_begin_run", "_end_run"):
        got = results[f"loop fail {fail}"]["on"]
        assert got["losses"] == results["loop"]["on"]["losses"], fail
    assert results["loop fail _begin_run"]["on"]["steps"] == 24  # the collectives are still stamped
    lines = [x for x in err.splitlines() if x.startswith("tfcluster:")]
    assert len(lines) == 4 and all("injected" in x and "step unchanged" in x for x in lines), lines


def test_gpu_sync_structure_on_cpu_graphs(cases):
    """TFCLUSTER_STAMP_SYNC=1 on CPU builds the GPU path: each stamp waits for a host copy (on
    /device:CPU:0) of a one-element slice created after every gradient — a data dependency through a
    device-to-host value, so on a GPU the stamp is taken when the kernels have *finished*."""
    results, _ = cases
    for case in ("loop synced", "fit synced"):
        on = results[case]["on"]
        assert on["losses"] == results[case.replace(" synced", "")]["on"]["losses"]
        assert on["steps"] == 24 and on["graph"]["d2h_stamps"] >= 8
        for enter in on["graph"]["enter_sync"]:
            assert enter == {"copy_device": "/device:CPU:0", "slice": "StridedSlice", "waits_for_gradients": True}


# ------------------------------------------------------------------------- 3 workers (e2e)


def run_cluster(
    extra: list[str],
    steps: int,
    interval_s: float = 1.0,
    num_workers: int = 3,
    env_extra=None,
    module="keras_synthetic",
):
    """An example on ``num_workers`` local MWMS workers under the instrumentation (step clock on)."""
    import statistics  # noqa: F401 - used by callers through medians()

    from worker_entry.examples.local_cluster import run_local_cluster

    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCLUSTER_") and k != "TF_CONFIG"}
    env.update(
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([str(ROOT / "worker_entry" / "_site"), str(ROOT)]),
        TFCLUSTER_INSTRUMENT="1",
        TFCLUSTER_PROFILE_INTERVAL_S=str(interval_s),
        **(env_extra or {}),
    )
    if module == "keras_synthetic":
        argv = ["--epochs", "1", "--steps-per-epoch", str(steps)]
    else:
        argv = ["--steps", str(steps)]
    argv = [sys.executable, "-m", f"worker_entry.examples.{module}", *argv]
    with tempfile.TemporaryDirectory(prefix="tfcluster-stepclock-") as tmpdir:  # TensorFlow's autograph files
        env["TMPDIR"] = tmpdir
        results = run_local_cluster([*argv, *extra], num_workers, env=env, timeout_s=150, cwd=str(ROOT))
    for r in results:
        assert r.returncode == 0, r.output[-3000:]
        assert not [x for x in r.output.splitlines() if x.startswith("tfcluster:")], r.output[-3000:]
    return results


def medians(
    records: list[dict], keys=("pre_collective_ms", "input_ms", "compute_ms", "collective_ms", "step_ms", "cpu_ms")
):
    import statistics

    return {k: round(statistics.median(r[k] for r in records if r.get(k) is not None), 2) for k in keys}


@pytest.mark.e2e
def test_compute_bound_straggler_shows_as_compute_not_input():
    """Keras fit, 3 local workers: worker:2 multiplies 30 extra 256x256 matrices per forward pass: its
    excess between two all-reduces is compute (batch → gradients), not input."""
    from orchestrator.supervise import find_straggler

    results = run_cluster(["--extra-matmuls", "30", "--slow-task", "worker:2"], steps=150)
    profiles = [r.of_kind("profile") for r in results]
    assert all(len(p) >= 2 and all(x["source"] == "stepclock" for x in p) for p in profiles), profiles
    m = [medians(p) for p in profiles]
    print(json.dumps({f"worker:{i}": x for i, x in enumerate(m)}))
    comp = [x["compute_ms"] for x in m]
    inp = [x["input_ms"] for x in m]
    assert comp[2] > 4 * max(comp[0], comp[1], 0.5) and comp[2] > 5, m
    assert inp[2] < comp[2] / 2, m  # not an input problem
    pre = [x["pre_collective_ms"] for x in m]
    assert pre[2] > 1.5 * max(pre[0], pre[1]), m
    finding = find_straggler({f"worker:{i}": profiles[i][-1] for i in range(3)})
    assert finding is not None and finding.task == "worker:2" and finding.cause == "compute", finding


def test_report_split_adds_up_with_known_delays_in_each_part(cases, tmp_path):
    """The step-clock windows of the run with known delays (input, compute, after the all-reduce, host),
    as two workers' records in a run directory: `tfcluster report`'s split adds up to the step and
    shows each delay in its own line."""
    from orchestrator.runs import RunDir
    from orchestrator.views.report import build_report, report_text

    rec = cases[0]["delays"]["on"]["record"]
    plan = {
        "job": "delays",
        "nodes": [{"host": f"h{i}", "task": {"type": "worker", "index": i}, "env": {}} for i in range(2)],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    lines = [{**rec, "task": f"worker:{i}", "kind": "profile", "ts": 1.0 + k} for k in range(3) for i in range(2)]
    (tmp_path / "heartbeats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "events.jsonl").write_text("")
    rep = build_report(RunDir(tmp_path))
    split = rep.split
    parts = ("input_ms", "compute_ms", "waiting_for_slowest_ms", "allreduce_ms", "update_ms", "host_ms", "other_ms")
    assert sum(getattr(split, k) for k in parts) == pytest.approx(split.step_ms, abs=0.01), split
    assert split.compute_ms >= 9.5 and split.update_ms >= 9.5 and split.host_ms >= 9.5, split
    assert split.input_ms == pytest.approx(rec["input_ms"], abs=0.01), split  # the known-delays test judges it
    text = report_text(rep)
    assert "input pipeline (waiting for the batch)" in text and "after it: optimizer update" in text
