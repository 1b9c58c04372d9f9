"""Bounded runs and the scaling sweep's logic: the bound through the real supervisor over fake nodes,
the sizes and the cut spec, the steady-state rate, speed-up and efficiency, batch notes, advice tied
to its trigger, exit codes, and the pictures and page (rendered by headless Chromium when present)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from fakenode import healthy, make_plan
from supervising import supervise
from waiting import wait_for

from orchestrator.cli.exitcodes import exit_code_for_sweep
from orchestrator.core.errors import UsageError
from orchestrator.core.states import JobState, TaskState
from orchestrator.events.kinds import Teardown
from orchestrator.job.scale import SweepOptions, parse_sizes, sized_spec
from orchestrator.sinks.console import describe
from orchestrator.supervise.bound import BoundWatch, RunBound
from orchestrator.supervise.figures import Figures, job_rate
from orchestrator.views import scale as sv
from worker_entry import protocol as p
from worker_entry.instrument.sweep import sweep_batch_size


def stepping(steps_per_beat: int):
    """A worker that trains (progress every heartbeat) until told to stop."""
    from fakenode import stopped

    def script(n) -> None:
        n.hello()
        cmd = n.wait_for(p.Go)
        if not isinstance(cmd, p.Go):
            n.exited(None, not_started=True, reason="stopped before the go")
            return
        n.send(p.Spawned(pid=2000 + n.node.task.index))
        n.send(p.Started(how="strategy"))
        stopped(n, n.run_until_stopped(steps=steps_per_beat))

    return script


# --- the bound ------------------------------------------------------------------------------------


def test_a_step_bound_stops_every_worker_and_counts_as_success():
    res, rec, _ = supervise({f"worker:{i}": stepping(5) for i in range(3)}, bound=RunBound(steps=60))
    assert res.state == JobState.SUCCEEDED, res.root_cause
    assert {t.state for t in res.tasks.values()} == {TaskState.STOPPED}
    (ev,) = rec.kinds("bound_reached")
    assert ev.steps >= 60
    (down,) = rec.kinds("teardown")
    assert down.reason.startswith("bounded run:") and down.bounded is True
    assert describe(down) is None and "stopping the job" in describe(ev)  # the console says it once


def test_only_a_bounded_teardown_is_left_to_bound_reached():
    ev = Teardown(ts=0.0, reason="bounded run: of a user's own words", grace_s=1)
    assert describe(ev) == "tearing down the job: bounded run: of a user's own words"


def test_a_failure_before_the_bound_is_still_a_failure():
    scripts = {"worker:0": healthy(0.3, code=3), "worker:1": stepping(1), "worker:2": stepping(1)}
    res, rec, _ = supervise(scripts, bound=RunBound(steps=10**9))
    assert res.state == JobState.FAILED
    assert res.root_cause.task == "worker:0"
    assert not rec.kinds("bound_reached")


def test_a_time_bound_without_step_counters_counts_after_the_startup_budget():
    res, rec, _ = supervise(
        {f"worker:{i}": stepping(0) for i in range(2)},
        n_hosts=2,
        bound=RunBound(seconds=0.3),
        job={"startup_timeout_s": 1.0},
    )
    assert res.state == JobState.SUCCEEDED
    assert "no worker reports training steps" in rec.kinds("bound_reached")[0].message
    went = rec.kinds("task_spawned")[0].ts
    assert rec.kinds("bound_reached")[0].ts - went >= 1.0  # not before the startup budget was spent


def test_bound_watch_counts_time_from_the_first_step():
    w = BoundWatch(RunBound(seconds=10), startup_s=60)
    assert w.check({"a": None, "b": None}, 100.0, went_at=95.0) is None  # slow start: not yet
    assert w.check({"a": None, "b": None}, 160.0, went_at=95.0) is None
    assert w.check({"a": 1, "b": None}, 104.0, went_at=95.0) is None  # the clock starts here
    assert w.check({"a": 5, "b": 5}, 113.9, went_at=95.0) is None
    assert "first training step" in w.check({"a": 9, "b": 9}, 114.0, went_at=95.0)
    idle = BoundWatch(RunBound(seconds=10), startup_s=60)
    assert idle.check({"a": None}, 164.9, went_at=95.0) is None
    assert "startup budget" in idle.check({"a": None}, 165.0, went_at=95.0)
    steps = BoundWatch(RunBound(steps=10))
    assert steps.check({"a": 10, "b": 9}, 1.0, went_at=0.0) is None  # every worker, not the fastest
    assert steps.check({"a": 12, "b": 10}, 1.0, went_at=0.0) is not None
    assert steps.check({}, 1.0, went_at=0.0) is None
    with pytest.raises(ValueError):
        RunBound(steps=0)


# --- sizes and the cut spec -------------------------------------------------------------------------


def test_sizes_are_sorted_distinct_and_bounded_by_the_hosts():
    assert parse_sizes("4,1,2,2", 4) == (1, 2, 4)
    for bad in ("0,1", "a", "1,,2", "-1"):
        with pytest.raises(UsageError, match="--workers"):
            parse_sizes(bad, 4)
    with pytest.raises(UsageError, match="the spec has 3 host"):
        parse_sizes("1,4", 3)


def test_each_size_runs_on_the_first_hosts_and_knows_the_sweep():
    loaded, _ = make_plan(4, heartbeat={"profile_interval_s": 30})
    opts = SweepOptions((1, 2, 4), RunBound(seconds=20), Path("/tmp/x"), strong=True)
    sized = sized_spec(loaded, 2, opts).spec
    assert [h.address for h in sized.hosts] == ["10.0.0.1", "10.0.0.2"]
    env = sized.job.env
    assert (env["TFCLUSTER_SCALE_WORKERS"], env["TFCLUSTER_SCALE_BASE_WORKERS"], env["TFCLUSTER_SCALE_MODE"]) == (
        "2",
        "1",
        "strong",
    )
    assert sized.job.instrument is True
    assert sized.job.stop_grace_s <= 2.0  # nothing to save at the end of a measurement
    assert 2.0 <= sized.heartbeat.profile_interval_s <= 5.0  # several windows in 20 s
    assert loaded.spec.hosts and len(loaded.spec.hosts) == 4  # the spec itself is untouched


def test_bad_sweeps_are_usage_errors_naming_the_option(tmp_path):
    from conftest import REPO, run_cli

    specs = REPO / "cluster_specs"
    for args, needle in [
        (["loopback-3.yaml", "--workers", "1,9"], "--workers 1,9: the spec has 3 host(s)"),
        (["loopback-3.yaml", "--duration", "soon"], "--duration 'soon'"),
        (["loopback-3.yaml", "--steps", "0"], "--steps 0: must be at least 1"),
        (["k8s-jobset.yaml"], "scheduler: kubernetes: `tfcluster scale` runs over ssh"),
        (["slurm-2x4.yaml"], "scheduler: slurm"),
    ]:
        out = run_cli("scale", str(specs / args[0]), *args[1:], "--run-dir", str(tmp_path / "sweep"))
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert not (tmp_path / "sweep").exists()  # nothing made before the checks


def test_the_script_side_batch_follows_the_mode():
    assert sweep_batch_size(64, {}) == 64
    weak = {"TFCLUSTER_SCALE_MODE": "weak", "TFCLUSTER_SCALE_WORKERS": "4", "TFCLUSTER_SCALE_BASE_WORKERS": "1"}
    assert sweep_batch_size(64, weak) == 64
    assert sweep_batch_size(64, {**weak, "TFCLUSTER_SCALE_MODE": "strong"}) == 16
    assert sweep_batch_size(64, {**weak, "TFCLUSTER_SCALE_MODE": "strong", "TFCLUSTER_SCALE_WORKERS": "x"}) == 64


# --- measurement and comparison ---------------------------------------------------------------------


def test_the_steady_rate_leaves_the_warm_up_out():
    """scale's rate is the report's (the common training window of ``figures``) less the warm-up."""
    # 2 s of slow warm-up (10 steps/s), then 100 steps/s with 64 examples per step
    pts = [(0.0, 1, 64), (1.0, 11, 704), (2.0, 21, 1344)]
    pts += [(2.0 + i, 21 + 100 * i, 64 * (21 + 100 * i)) for i in range(1, 9)]
    figs = Figures()
    for seq, (ts, steps, examples) in enumerate(pts):
        for task in ("worker:0", "worker:1"):
            figs.add(task, {"seq": seq, "ts": ts, "progress": {"steps": steps, "examples": examples, "ts": ts}})
    assert job_rate(figs.final(warmup_s=2.0)) == (pytest.approx(100.0), pytest.approx(6400.0))
    assert job_rate(figs.final())[0] == pytest.approx(82.0)  # the whole window, warm-up included
    idle = Figures()
    idle.add("worker:0", {"seq": 0, "ts": 0.0, "progress": {"steps": 0, "ts": 0.0}})
    idle.add("worker:0", {"seq": 1, "ts": 1.0, "progress": {"steps": 0, "ts": 1.0}})
    assert job_rate(idle.final()) == (None, None)
    no_examples = Figures()
    no_examples.add("worker:0", {"seq": 0, "ts": 0.0, "progress": {"steps": 1, "ts": 0.0}})
    no_examples.add("worker:0", {"seq": 1, "ts": 1.0, "progress": {"steps": 5, "ts": 1.0}})
    assert job_rate(no_examples.final()) == (pytest.approx(4.0), None)


def _size(n, steps, examples, batch, **kw):
    return {
        "workers": n,
        "steps_per_s": steps,
        "examples_per_s": examples,
        "global_batch": batch,
        "per_worker_batch": batch // n if batch else None,
        **kw,
    }


def test_speedup_and_efficiency_against_the_smallest_size():
    sizes = [_size(1, 10.0, 640.0, 64), _size(2, 9.0, 1152.0, 128), _size(4, 5.0, 1280.0, 256)]
    cmp = sv.compare(sizes, strong=False)
    assert cmp["unit"] == "examples/s" and cmp["baseline_workers"] == 1 and cmp["measured_scaling"] == "weak"
    assert cmp["notes"] == [
        "weak scaling: the script kept its per-worker batch (64 at 1, 64 at 2, 64 at 4) and its global batch grew "
        "with the workers (64 at 1, 128 at 2, 256 at 4)"
    ]
    assert [s["speedup"] for s in sizes] == [1.0, 1.8, 2.0]
    assert [s["efficiency"] for s in sizes] == [1.0, 0.9, 0.5]


def test_batch_notes_say_which_scaling_was_really_measured():
    weak_script = [_size(1, 10.0, 640.0, 64), _size(2, 9.0, 1152.0, 128)]
    (note,) = sv.compare(weak_script, strong=True)["notes"]
    assert "measured weak scaling" in note and "sweep_batch_size" in note
    fixed_global = [_size(1, 10.0, 640.0, 64), _size(2, 18.0, 1152.0, 64)]
    (note,) = sv.compare(fixed_global, strong=False)["notes"]
    assert "measured strong scaling" in note


def test_without_examples_throughput_is_steps_and_the_note_says_so():
    sizes = [_size(1, 10.0, None, None), _size(2, 9.0, None, None)]
    cmp = sv.compare(sizes, strong=False)
    assert cmp["unit"] == "steps/s" and "examples/s unknown" in cmp["notes"][0]
    assert sizes[1]["efficiency"] == pytest.approx(0.9)


def _split(step, inp=1.0, wait=0.0, allreduce=1.0, host=0.0, slowest="worker:1"):
    compute = step - inp - wait - allreduce - host
    return {
        "step_ms": step,
        "input_ms": inp,
        "compute_ms": compute,
        "waiting_for_slowest_ms": wait,
        "allreduce_ms": allreduce,
        "update_ms": 0.0,
        "host_ms": host,
        "other_ms": 0.0,
        "after_allreduce_ms": host,
        "slowest_worker": slowest,
        "worker": "worker:0",
    }


def test_advice_is_tied_to_the_measurement_that_triggers_it():
    comm = [
        _size(1, 10, 640, 64, efficiency=1.0, split=None),
        _size(2, 6, 768, 128, efficiency=0.6, split=_split(100, allreduce=50)),
    ]
    (a,) = sv.advise(comm)
    assert a["size"] == "2" and "all-reduce itself 50%" in a["trigger"] and "bytes_per_pack" in a["advice"]
    inp = [_size(2, 6, 768, 128, efficiency=0.6, split=_split(100, inp=40))]
    assert "prefetch" in sv.advise(inp)[0]["advice"] and "input pipeline 40%" in sv.advise(inp)[0]["trigger"]
    slow = {"task": "worker:2", "host": "10.0.0.3", "cause": "host CPU", "message": "worker:2 is slow"}
    host = [_size(3, 4, 768, 192, efficiency=0.4, split=_split(100, wait=60, allreduce=5), straggler=slow)]
    advice = sv.advise(host)
    assert advice[0]["advice"].startswith("one slow host: 10.0.0.3") and "host CPU" in advice[0]["trigger"]
    assert not any("communication-bound" in a["advice"] for a in advice)
    mem = [_size(2, 6, 768, 128, efficiency=0.6, split=_split(100), gpu_mem_pct=99.0)]
    assert any(a["advice"].startswith("memory-bound") for a in sv.advise(mem))
    good = [_size(1, 10, 640, 64, efficiency=1.0), _size(2, 19, 1216, 128, efficiency=0.95, split=_split(100))]
    assert sv.advise(good)[0]["advice"].startswith("scales well up to 2 workers")
    # every host short of CPU (3 workers on 2 cores): the all-reduce waits for CPUs, not for the network
    starved = {"kind": "cpu wait", "detail": "all 3 workers' training processes waited for a CPU 66% of the time"}
    cpu = [_size(3, 6, 768, 128, efficiency=0.3, split=_split(100, allreduce=70), shared_problems=[starved])]
    (a,) = sv.advise(cpu)
    assert "on every host: cpu wait" in a["trigger"] and a["advice"].startswith(starved["detail"])
    assert "communication-bound" not in a["advice"] and "not the network's time" in a["advice"]


def test_sweep_exit_codes():
    assert exit_code_for_sweep(["succeeded", "succeeded"], False) == 0
    assert exit_code_for_sweep(["succeeded", "failed", "succeeded"], False) == 3
    assert exit_code_for_sweep(["succeeded", "interrupted_sigterm"], True) == 143
    assert exit_code_for_sweep(["succeeded"], True) == 130
    assert exit_code_for_sweep([], False) == 130


# --- pictures and the page ----------------------------------------------------------------------


def _summary(tmp_path: Path) -> dict:
    sizes = [
        {**_size(1, 10.0, 640.0, 64), "state": "succeeded", "split": None},
        {**_size(2, 8.0, 1024.0, 128), "state": "succeeded", "split": _split(125, allreduce=30)},
        {**_size(3, 5.0, 960.0, 192), "state": "succeeded", "split": _split(200, wait=80, allreduce=30)},
    ]
    summary = {"mode": "weak", **sv.compare(sizes, False), "sizes": sizes, "advice": sv.advise(sizes)}
    return summary


def test_the_sweep_page_holds_its_pictures(tmp_path):
    pytest.importorskip("matplotlib")
    from orchestrator.views.pages import sweep_page

    summary = _summary(tmp_path)
    text = sv.sweep_text(summary)
    assert "SPEED-UP" in text and "1.60x" in text and "80%" in text
    page, pngs = sweep_page(summary, text, tmp_path)
    assert [p.name for p in pngs] == ["scaling.png", "split_by_size.png"]
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 2 and "scaling sweep" in html
    assert page.stat().st_mode & 0o077 == 0


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_page_renders_in_headless_chromium(tmp_path):
    """The page as a browser shows it: the screenshot holds the plots' own colours (the efficiency
    line's red, the throughput line's blue), so the inlined PNGs decoded and were drawn."""
    mpimg = pytest.importorskip("matplotlib.image")
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium (Debian package chromium; .ci/install installs it)")
    from orchestrator.views.pages import sweep_page

    summary = _summary(tmp_path)
    page, _ = sweep_page(summary, sv.sweep_text(summary), tmp_path)
    shot = tmp_path / "shot.png"
    argv = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--hide-scrollbars",
        "--window-size=1200,1600",
        f"--screenshot={shot}",
        page.as_uri(),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        proc.communicate(timeout=120)
    finally:
        try:  # chromium's helpers too: they share its new session's process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
    wait_for(shot.exists, 5, "chromium's screenshot")
    img = mpimg.imread(shot)[:, :, :3]
    rgb = (img * 255).round().astype(int)
    colours = {tuple(c) for c in rgb.reshape(-1, 3)[::7]}

    def near(target: tuple[int, int, int]) -> bool:
        return any(sum(abs(a - b) for a, b in zip(c, target, strict=True)) < 30 for c in colours)

    assert near((0xE1, 0x57, 0x59)), "the efficiency line's red is not on the screen"
    assert near((0x1F, 0x77, 0xB4)), "the throughput line's blue is not on the screen"
    assert len(colours) > 50
