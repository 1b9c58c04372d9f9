"""A damaged or planted run directory (a shared runs/ holds what anyone put there) met by the read-only
views: Slurm's batch output a link or a FIFO, a plan.json field of a type no check foresaw, a .jsonl
line with no end, status/result/launcher.json of the wrong shapes, a ``report`` link, a summary's zero
step, a hostile scale.json. Each is named or left out: no traceback, no hang, nothing read or written
outside the run."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_cli
from waiting import returns_within

from orchestrator.core.errors import UsageError
from orchestrator.runs import RunDir, private_subdir, read_plan
from orchestrator.runs.jsonl import objects, per_line
from orchestrator.views.sweepfiles import sweep_sizes

SECRET = "SECRET-CONTENT-NOT-TO-BE-SHOWN"


def _run(base: Path, name: str, *, result: object = None, status: object = None, **plan_extra) -> Path:
    d = base / name
    d.mkdir(parents=True, mode=0o700)
    plan = {"job": "j", "run_id": name, "nodes": [{"task": {"type": "worker", "index": 0}, "command": ["x"]}]}
    (d / "plan.json").write_text(json.dumps({**plan, **plan_extra}))
    for fname, data in (("result.json", result), ("status.json", status)):
        if data is not None:
            (d / fname).write_text(data if isinstance(data, str) else json.dumps(data))
    return d


def test_slurm_batch_output_planted_as_a_link_or_a_fifo_is_not_read(tmp_path):
    from orchestrator.schedulers.slurm.handle import _started, out_tail
    from orchestrator.schedulers.slurm.state import stop_requested

    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    run = RunDir(_run(tmp_path, "r"))
    run.slurm_dir.mkdir()
    (run.slurm_dir / "slurm-123.out").symlink_to(secret)
    assert out_tail(run, "123") == ""  # it printed the link's target into status and result.json
    os.mkfifo(run.slurm_dir / "slurm-124.out")
    assert returns_within(10, lambda: out_tail(run, "124")) == ""  # it hung status for ever
    (run.slurm_dir / "slurm-125.out").write_bytes(b"x" * 10_000 + b"".join(b"\nline %d" % i for i in range(9)))
    assert out_tail(run, "125") == "line 4 | line 5 | line 6 | line 7 | line 8"  # a real file: its tail
    os.mkfifo(run.events_jsonl)
    assert returns_within(10, lambda: _started(run)) is None
    stop = run.slurm_dir / "stop.json"
    stop.symlink_to(secret)
    assert stop_requested(run) is None


@pytest.mark.parametrize("field", ["spares", "warnings"])
def test_a_plan_field_of_an_unforeseen_type_is_a_damaged_plan_not_a_crash_of_every_lookup(tmp_path, field):
    runs = tmp_path / "runs"
    _run(runs, "good-1", result={"state": "succeeded", "tasks": {}})
    evil = _run(runs, "evil", result={"state": "succeeded", "tasks": {}}, **{field: 5})
    assert read_plan(RunDir(evil)) is not None  # a number where a list belongs: left out, as other damage
    listed = run_cli("status", "--runs-dir", str(runs), "--json", timeout=60)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert {r["run_dir"].rsplit("/", 1)[1] for r in json.loads(listed.stdout)["runs"]} == {"good-1", "evil"}
    for argv in (("status", "j", "--runs-dir", str(runs)), ("report", str(runs / "good-1"), "--json")):
        r = run_cli(*argv, timeout=60)
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)


def test_a_jsonl_line_with_no_end_is_skipped_without_being_held(tmp_path):
    lines = [b'{"a": 1}', b"\0" * 5000, b'{"b": 2}', b'{"c": ' + b'"' + b"y" * 300 + b'"}', b'{"d": 4}']
    data = b"\n".join(lines) + b"\n" + b"z" * 3000  # a crash's tail: no newline at all
    got = list(objects(io.BytesIO(data), block=64, max_line=1000))
    assert got == [{"a": 1}, {"b": 2}, {"c": "y" * 300}, {"d": 4}]
    assert got == list(per_line(data.split(b"\n")))  # what line-by-line reading keeps, here too

    # a line past max_line is dropped up to its newline, whatever the blocks it spans: the records after
    # it are read (the line used to be held whole and joined again at every block)
    big = b'{"a": 1}\n' + b"a" * 200_000 + b'\n{"b": 2}\n'
    for block in (7, 1000, 1 << 16):
        assert list(objects(io.BytesIO(big), block=block, max_line=5000)) == [{"a": 1}, {"b": 2}]


def test_status_of_type_damaged_files_names_them_and_never_crashes(tmp_path):
    runs = tmp_path / "runs"
    cases = {
        "root-cause-text": {"result": {"state": "failed", "root_cause": "boom", "tasks": {}}},
        "result-a-list": {"result": [1]},
        "result-a-number": {"result": "5"},
        "result-truncated": {"result": '{"state": "succ'},
        "status-task-null": {"status": {"state": "running", "tasks": {"worker:0": None}, "updated": "yesterday"}},
        "status-signal-int": {"status": {"state": "running", "tasks": {"worker:0": {"signal": 9, "rss_mb": "x"}}}},
        "status-rates-text": {"status": {"throughput": {"steps_per_s": "fast"}, "tasks": []}},
        "status-nan": {"status": '{"state": "running", "tasks": {"worker:0": {"cpu_pct": NaN}}}'},
    }
    for name, files in cases.items():
        d = _run(runs, name, **files)
        for argv in (("status", str(d)), ("status", str(d), "--json"), ("stop", str(d))):
            r = run_cli(*argv, timeout=60)
            assert "Traceback" not in r.stderr and "internal error" not in r.stderr, (name, argv, r.stderr)
            if argv[-1] == "--json":
                st = json.loads(r.stdout)  # strict JSON: NaN is null
                assert "NaN" not in r.stdout
        if name.startswith("result-"):
            st = json.loads(run_cli("status", str(d), "--json", timeout=60).stdout)
            # a result.json the launcher wrote and something damaged since: not "the launcher died"
            assert st["state"] == "damaged" and any("result.json" in p for p in st["problems"]), (name, st)
            assert "SIGKILL" not in run_cli("status", str(d), timeout=60).stdout
    plan_damaged = _run(runs, "plan-damaged", result={"state": "succeeded", "tasks": {}})
    (plan_damaged / "plan.json").write_text("[1, 2")
    out = run_cli("status", str(plan_damaged), timeout=60).stdout
    assert "plan.json" in out and "job None" not in out, out


def test_report_html_does_not_write_through_a_planted_report_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    d = _run(tmp_path / "runs", "r", result={"state": "succeeded", "tasks": {}})
    (d / "report").symlink_to(outside)
    with pytest.raises(UsageError, match="symbolic link"):
        private_subdir(d / "report")
    r = run_cli("report", str(d), "--html", timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "symbolic link" in r.stderr, r.stderr
    assert list(outside.iterdir()) == []
    (d / "report").unlink()
    (d / "report").write_text("a file")
    with pytest.raises(UsageError, match="not a directory"):
        private_subdir(d / "report")
    (d / "report").unlink()
    assert private_subdir(d / "report").is_dir() and (os.stat(d / "report").st_mode & 0o777) == 0o700


def test_a_summary_split_of_zero_ms_is_shown_without_shares():
    from orchestrator.views.split import JobSplit, split_lines

    split = JobSplit.from_dict({"worker": "worker:0", "step_ms": 0.0, "input_ms": 1.0, "collective_ms": 0.0})
    if split is None:  # (a reader that refuses it outright is as good)
        return
    lines = split_lines(split, "over 3 windows")
    assert lines[0].startswith("a step takes 0.0 ms") and all("%" not in ln for ln in lines[1:])


def test_a_hostile_scale_json_is_named_and_its_runs_stay_in_the_sweep(tmp_path):
    root = tmp_path / "sweep"
    root.mkdir()
    scale = root / "scale.json"
    size = {"workers": 2, "run_dir": "/etc", "split": {"step_ms": 10.0}}
    for bad, field in (([1, 2], "sizes"), ({"sizes": 5}, "sizes"), ({"sizes": [{**size, "workers": "x"}]}, "workers")):
        scale.write_text(json.dumps(bad))
        with pytest.raises(UsageError, match=field):
            sweep_sizes(root)
    scale.write_text(json.dumps({"sizes": [size, {**size, "run_dir": "runs/sweep/workers-3", "workers": 3}]}))
    assert [s["run_dir"] for s in sweep_sizes(root)] == [str(root / "etc"), str(root / "workers-3")]
    scale.unlink()
    scale.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"sizes": []}))
    with pytest.raises(UsageError, match="link"):
        sweep_sizes(root)
    scale.unlink()
    os.mkfifo(scale)
    t0 = time.monotonic()
    with pytest.raises(UsageError):
        sweep_sizes(root)
    assert time.monotonic() - t0 < 10
    r = run_cli("predict", str(root), "--network", "10Gbit,5us", timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "scale.json" in r.stderr, r.stderr


def test_a_planted_combined_log_is_said_and_an_unknown_scheduler_names_plan_json(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    d = _run(tmp_path / "runs", "r", result={"state": "succeeded", "tasks": {}})
    (d / "combined.log").symlink_to(secret)
    r = run_cli("logs", str(d), timeout=60)
    assert SECRET not in r.stdout + r.stderr and "combined.log: not a regular file" in r.stderr, r
    other = _run(tmp_path / "runs", "s", result={"state": "succeeded", "tasks": {}}, scheduler="mesos")
    r = run_cli("status", str(other), timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{other / 'plan.json'}: scheduler: mesos is not supported" in r.stderr, r.stderr
