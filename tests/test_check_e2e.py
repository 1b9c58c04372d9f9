"""`tfcluster check` end to end on the namespace test bed (3 hosts, real sshd, real TensorFlow): a healthy
bed names nothing; a host under a CPU quota is named as the slow host; a host whose link is shaped with
`tc tbf` is named as the slow link, not as a slow host; `launch --check` refuses to start on it (exit 6,
the finding in events.jsonl), or starts without the named host where the spec allows it (the finding in
the launch's own events.jsonl). Nothing of the check is left on any host."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PY, _env, assert_no_job_processes, read_events, repo_python, run_cli
from cpu_quota import cpu_cgroup, cpu_quota
from testbed_fixtures import requires_netns
from waiting import wait_for

from orchestrator.runs import RunDir, read_plan

pytestmark = [pytest.mark.e2e, requires_netns]

EXIT_CHECK_FINDINGS = 6


def _spec(tb, tmp_path, heartbeat_timeout_s=30, **check):
    return tb.write_spec(
        tmp_path / "spec.yaml",
        "checked",
        ["true"],
        job={"python": repo_python(tmp_path), "startup_timeout_s": 120},
        heartbeat={"interval_s": 1.0, "timeout_s": heartbeat_timeout_s},
        **({"check": check} if check else {}),
    )


def _check(tb, spec, run_dir, timeout="90"):
    out = run_cli("check", str(spec), "--json", "-o", str(run_dir), "--timeout", timeout, tb=tb, timeout=300)
    check = json.loads(out.stdout) if out.stdout.strip() else None
    return out, check


@pytest.fixture(scope="module")
def bed(session_testbed_factory):
    return session_testbed_factory(3, mode="netns")


@dataclass(frozen=True)
class TrainedThenChecked:
    """``trained_then_checked``: the runs directory, the training launch, the check's CLI result and JSON."""

    runs: Path
    train: Path
    launched: subprocess.CompletedProcess
    out: subprocess.CompletedProcess
    check: dict | None


@pytest.fixture(scope="module")
def trained_then_checked(bed, tmp_path_factory) -> TrainedThenChecked:
    """The job launched to its end, then `tfcluster check` of the same spec on the healthy bed, both in one
    runs directory: test_healthy_bed_names_nothing asserts on the check, test_status_and_report_by_name_...
    on what `status`/`report` NAME mean after it (one healthy check, three TensorFlow imports, for both)."""
    tmp = tmp_path_factory.mktemp("trained-then-checked")
    runs = tmp / "runs"
    spec = _spec(bed, tmp)
    train = runs / "checked-train"
    launched = run_cli("launch", str(spec), "--run-dir", str(train), "--no-live", "-q", tb=bed, timeout=300)
    # The check's deadline bounds each node from its start, TensorFlow's import included: three imports at
    # once on the 2-core box took 45 s of a 56-s check at load 9, so under a heavier load the other tests'
    # 90 s can pass before anything is measured (every node then ends with no figures, named). A healthy
    # bed is judged by what it measured, given the time to measure it.
    out, check = _check(bed, spec, runs / "check-checked-later", timeout="240")
    assert_no_job_processes(bed, 10)
    return TrainedThenChecked(runs, train, launched, out, check)


def test_healthy_bed_names_nothing(bed, trained_then_checked):
    out, check = trained_then_checked.out, trained_then_checked.check
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:], check and check["findings"])
    assert check == json.loads((trained_then_checked.runs / "check-checked-later" / "check.json").read_text())
    assert [h["host"] for h in check["hosts"]] == [h.address for h in bed.hosts]
    assert all(h["gflops"] > 0 and h["device"] == "CPU" for h in check["hosts"]), check["hosts"]
    assert len(check["links"]) == 3 and all(x["bandwidth_Bps"] > 0 and x["latency_s"] > 0 for x in check["links"])
    assert [a["bytes"] for a in check["allreduce"]] == [65536, 4194304]
    for a in check["allreduce"]:
        assert a["communication"] == "ring" and a["ranks"] == 3
        assert a["busbw_GBps"] == pytest.approx(a["algbw_GBps"] * 4 / 3)
    assert check["network"]["bandwidth_Bps"] == min(x["bandwidth_Bps"] for x in check["links"])
    assert check["findings"] == []


def test_cpu_quota_host_is_named_slow_host(bed, tmp_path):
    """One check, through `launch --check` (check.without_named_hosts): its check.json names the host
    under the quota as the slow host with its figure, and the job starts on the other two hosts. (The
    check behind `launch --check` is `tfcluster check`'s own code, job/check.py; the standalone command's
    exit 6 on a finding is asserted by the late-host test, its healthy run by the healthy-bed test.)"""
    if cpu_cgroup() is None:
        pytest.skip("no writable CPU cgroup (v1 cpu.cfs_quota_us or v2 cpu.max) on this machine")
    slow = bed.hosts[1].address
    with cpu_quota(0.1, "tfcluster-check-e2e") as cg:
        (cg / "cgroup.procs").write_text(str(bed.sshd_pid(1)))  # what its sshd starts inherits the quota
        # a tenth of a core: TensorFlow's import alone takes ~35 s there, so the check gets 150 s (the
        # default 60 s ends the check with no figures from anyone: the collective rounds wait for it)
        run = tmp_path / "launch"
        spec = _spec(bed, tmp_path, without_named_hosts=True, timeout_s=150)
        launched = run_cli(
            "launch", str(spec), "--check", "--run-dir", str(run), "--no-live", "-q", tb=bed, timeout=300
        )
    relaunch_check = tmp_path / "launch-check" / "check.json"
    check = json.loads(relaunch_check.read_text()) if relaunch_check.is_file() else None
    assert check is not None, (launched.returncode, launched.stderr[-3000:])
    named = [(f["code"], f["subject"]) for f in check["findings"]]
    figures = [(h["host"], h.get("gflops")) for h in check["hosts"]]  # what the judgement saw, if it named none
    assert named == [("slow_host", slow)], (check["findings"], figures)
    assert check["findings"][0]["figure"] < 0.5 * check["findings"][0]["median"]
    assert launched.returncode == 0, (launched.returncode, launched.stderr[-1500:], check)
    plan = read_plan(RunDir(run))
    assert sorted(t.host for t in plan.tasks) == sorted(h.address for h in bed.hosts if h.address != slow)
    events = read_events(run)
    left_out = [e for e in events if e["event"] == "check_finding"]
    assert [(e["code"], e["host"], e.get("task")) for e in left_out] == [("slow_host", slow, None)], left_out
    assert [e["event"] for e in events].index("job_started") < [e["event"] for e in events].index("check_finding")
    assert_no_job_processes(bed, 10)


def test_rate_limited_link_is_named_slow_link_and_launch_refuses(bed, tmp_path):
    """One check, through `launch --check`: its check.json names the shaped link (not a slow host) with
    its figure, the finding is an event, and the job does not start. (`tfcluster check`'s own exit 6 on
    a finding: test_the_host_the_others_waited_for_is_named_alone_when_the_deadline_passes.)"""
    slow = bed.hosts[2].address
    bed.rate_limit(2, rate="40mbit", burst="32kb", latency="100ms")
    try:
        spec = _spec(bed, tmp_path)
        run = tmp_path / "launch"
        launched = run_cli("launch", str(spec), "--check", "--run-dir", str(run), "--no-live", tb=bed, timeout=300)
    finally:
        bed.rate_limit(2, None)
    assert launched.returncode == EXIT_CHECK_FINDINGS, (launched.returncode, launched.stderr[-3000:])
    check = json.loads((tmp_path / "launch-check" / "check.json").read_text())
    named = [(f["code"], f["subject"]) for f in check["findings"]]
    assert named == [("slow_link", slow)], check["findings"]  # a slow link, not a slow host
    assert check["findings"][0]["figure"] < 10e6  # 40 Mbit/s = 5 MB/s, against GB/s on the other links
    assert "not starting" in launched.stderr and not run.exists()
    events = [e for e in read_events(tmp_path / "launch-check") if e["event"] == "check_finding"]
    assert [(e["code"], e["subject"]) for e in events] == [("slow_link", slow)], events
    assert_no_job_processes(bed, 10)


def test_a_host_cut_off_during_the_check_ends_it_and_is_named(bed, tmp_path):
    """Never hangs: the host's link goes down once every task runs; the nodes' watchdogs and the
    launcher's heartbeat timeout end the check, every task without figures is named, nothing stays."""
    run = tmp_path / "run"
    spec = _spec(bed, tmp_path, heartbeat_timeout_s=6)
    argv = [PY, "-m", "orchestrator", "check", str(spec), "--json", "-o", str(run), "--timeout", "20"]
    proc = bed.run_on_controller(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        wait_for(
            lambda: run.exists() and sum(e["event"] == "task_spawned" for e in read_events(run)) == 3,
            120,
            "the 3 check tasks spawned",
        )
        bed.cut(1)
        out, err = proc.communicate(timeout=120)
    finally:
        bed.restore(1)
    assert proc.returncode == EXIT_CHECK_FINDINGS, (proc.returncode, err[-3000:])
    check = json.loads(out)
    named = {(f["code"], f["subject"]) for f in check["findings"]}
    assert ("no_result", bed.hosts[1].address) in named, check["findings"]
    lost = next(f for f in check["findings"] if f["subject"] == bed.hosts[1].address)
    assert "no heartbeat" in lost["what"], lost
    assert_no_job_processes(bed, 30)


def test_the_host_the_others_waited_for_is_named_alone_when_the_deadline_passes(bed, tmp_path):
    """One host's check starts 60 s late (its interpreter wrapper sleeps first, as a starved host's would
    crawl); with a 15 s deadline nobody has figures, yet only that host is named: the others reported
    phases it never reached (they waited in the link rounds for it), and are listed as having waited."""
    late = bed.hosts[1]
    python = tmp_path / "python-late-on-one-host"
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = worker_entry.check ] && [ "$(hostname)" = {late.hostname} ]; then sleep 60; fi\n'
        f'exec {repo_python(tmp_path)} "$@"\n'
    )
    python.chmod(0o755)
    spec = bed.write_spec(
        tmp_path / "late.yaml",
        "checked",
        ["true"],
        job={"python": str(python), "startup_timeout_s": 60},
        heartbeat={"interval_s": 1.0, "timeout_s": 30},
    )
    out, check = _check(bed, spec, tmp_path / "run", timeout="15")
    assert out.returncode == EXIT_CHECK_FINDINGS, (out.returncode, out.stderr[-3000:])
    assert [(f["code"], f["subject"]) for f in check["findings"]] == [("no_result", late.address)], check["findings"]
    what = check["findings"][0]["what"]
    assert "did not finish starting its check" in what and "within 15 s; the others waited for it" in what, what
    assert sorted(w["host"] for w in check["waited"]) == sorted(h.address for h in bed.hosts if h is not late)
    assert all(w["phase"] in ("started", "links") for w in check["waited"]), check["waited"]
    assert_no_job_processes(bed, 30)


def test_status_and_report_by_name_after_a_check_mean_the_training_run(trained_then_checked):
    """Issue 32.5: `tfcluster check` after a launch of the same job: `status NAME` and `report NAME` mean
    the training run; the check run is reachable by its directory and marked in the list."""
    runs, train = trained_then_checked.runs, trained_then_checked.train
    launched, out = trained_then_checked.launched, trained_then_checked.out
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert read_plan(RunDir(runs / "check-checked-later")).purpose == "check"
    status = run_cli("status", "checked", "--runs-dir", str(runs), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["run_dir"] == str(train)
    report = run_cli("report", "checked", "--runs-dir", str(runs), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["run_dir"] == str(train)
    by_dir = run_cli("status", str(runs / "check-checked-later"), "--json")
    assert json.loads(by_dir.stdout)["run_dir"] == str(runs / "check-checked-later")
    assert json.loads(by_dir.stdout)["purpose"] == "check" and json.loads(status.stdout)["purpose"] == "train"
    listing = json.loads(run_cli("status", "--runs-dir", str(runs), "--json").stdout)
    assert {r["run_dir"]: r["purpose"] for r in listing["runs"]} == {
        str(train): "train",
        str(runs / "check-checked-later"): "check",
    }
