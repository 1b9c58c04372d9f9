"""`report` gives the same report, to the digit, as the code before issue 33's speed-ups (the records
read once, the collector paused, the validation's and the figures' fast paths): the recorded 3-worker
run (whole run and ``--last 20s``) against its saved report, and a 512-task synthetic run
(``tests/bigrun.py``: a straggler, slow workers) against the hash of its saved report.

The saved reports (tests/data/report_golden) were written by the code before the change. A change that
means to alter the report rewrites them: ``python3 tests/test_report_golden.py --write``."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from bigrun import big_run
from conftest import run_cli

from orchestrator.runs import RunDir
from orchestrator.views.records import heartbeat_records
from orchestrator.views.report import Report, build_report, report_text

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "report_golden"


def _json(run: RunDir, rep: Report) -> str:
    return json.dumps(rep.to_dict(), indent=1, sort_keys=True).replace(str(run.path), "RUN")


def _text(run: RunDir, rep: Report) -> str:
    return report_text(rep).replace(str(run.path), "RUN")


def _recorded(tmp: Path) -> RunDir:
    shutil.copytree(DATA / "recorded_run", tmp / "run")
    return RunDir(tmp / "run")


def _hashes(run: RunDir, rep: Report) -> str:
    h = hashlib.sha256(_json(run, rep).encode()).hexdigest()
    t = hashlib.sha256(_text(run, rep).encode()).hexdigest()
    return f"{h}  report.json\n{t}  report.txt\n"


@pytest.mark.parametrize(("name", "last_s"), [("recorded", None), ("recorded_last20", 20.0)])
def test_the_recorded_run_reports_as_before(tmp_path, name, last_s):
    run = _recorded(tmp_path)
    rep = build_report(run, last_s=last_s)
    assert _json(run, rep) + "\n" == (GOLDEN / f"{name}.json").read_text()
    assert _text(run, rep) + "\n" == (GOLDEN / f"{name}.txt").read_text()


def test_a_512_task_run_reports_as_before(tmp_path):
    run = RunDir(big_run(tmp_path / "big", 512))
    records = heartbeat_records(run.heartbeats_jsonl)
    rep = build_report(run, records=records)
    assert rep.stragglers and rep.stragglers[0].task == "worker:417"  # the run has what the hash covers
    assert _hashes(run, rep) == (GOLDEN / "bigrun512.sha256").read_text()
    # the records a caller read once (cmd_report: the report and its page) give the report of a fresh read
    assert _hashes(run, build_report(run)) == _hashes(run, rep)


def test_the_cli_prints_the_saved_text(tmp_path):
    run = _recorded(tmp_path)
    res = run_cli("report", str(run.path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.replace(str(run.path), "RUN") == (GOLDEN / "recorded.txt").read_text()


def _write() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run = _recorded(tmp)
        for name, last_s in (("recorded", None), ("recorded_last20", 20.0)):
            rep = build_report(run, last_s=last_s)
            (GOLDEN / f"{name}.json").write_text(_json(run, rep) + "\n")
            (GOLDEN / f"{name}.txt").write_text(_text(run, rep) + "\n")
        big = RunDir(big_run(tmp / "big", 512))
        (GOLDEN / "bigrun512.sha256").write_text(_hashes(big, build_report(big)))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _write()
