"""RUN/summary.json (``views.runsummary``): the run's end writes the whole-run report once, and `report`
reads it instead of every heartbeat record — only while it is this code's and names the size and
SHA-256 of every file the report is built from. A missing, stale, damaged or hostile summary makes
`report` read the records as before: the same report, exit 0, no traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bigrun import big_run
from conftest import run_cli

from orchestrator.cli.commands import after_run
from orchestrator.runs import RunDir
from orchestrator.views import runsummary
from orchestrator.views.pages import step_series
from orchestrator.views.records import heartbeat_records
from orchestrator.views.report import build_report, report_text
from orchestrator.views.runsummary import read_summary, summarise

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "report_golden"
#: The cases also run through `tfcluster report` (the others check ``read_summary`` refuses them: the
#: command reads the records whenever it does, as these show).
CLI_CHECKED = {"a heartbeat appended", "result.json removed", "torn", "a string for a number", "deeply nested"}


def _recorded(tmp: Path) -> RunDir:
    shutil.copytree(DATA / "recorded_run", tmp / "run")
    return RunDir(tmp / "run")


def _cli_text(run: RunDir, *args: str) -> str:
    res = run_cli("report", str(run.path), *args)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return res.stdout.replace(str(run.path), "RUN")


def test_the_summary_is_the_report_of_the_records(tmp_path):
    run = RunDir(big_run(tmp_path / "big", 256))
    records = heartbeat_records(run.heartbeats_jsonl)
    rep = build_report(run, records=records)
    summarise(run)
    got = read_summary(run)
    assert got is not None
    assert got.report == rep  # every field, every type: the text and --json follow
    assert report_text(got.report) == report_text(rep) and got.report.to_dict() == rep.to_dict()
    assert got.series == step_series(run, records)


def test_the_run_end_writes_it_and_report_prints_the_saved_report_from_it(tmp_path):
    run = _recorded(tmp_path)
    assert not run.summary_json.exists()
    after_run(run.path)
    assert read_summary(run) is not None
    assert _cli_text(run) == (GOLDEN / "recorded.txt").read_text()
    moved = RunDir(Path(shutil.move(run.path, tmp_path / "moved")))  # the run's path is today's, not the writer's
    assert read_summary(moved).report.run_dir == str(moved.path)
    # --last narrows the records: never the summary's whole-run report
    assert _cli_text(moved, "--last", "20s") == (GOLDEN / "recorded_last20.txt").read_text()


def test_report_html_from_the_summary_draws_the_same_page(tmp_path):
    pytest.importorskip("matplotlib")
    run = _recorded(tmp_path)
    res = run_cli("report", str(run.path), "--html", "--json")
    assert res.returncode == 0, res.stderr
    before = json.loads(res.stdout)
    summarise(run)
    res = run_cli("report", str(run.path), "--html", "--json")
    assert res.returncode == 0, res.stderr
    after = json.loads(res.stdout)
    assert after == before  # the report, and the page's files by name
    assert (run.path / "report" / "report.html").stat().st_size > 0


def _changes(run: RunDir) -> dict[str, object]:
    """Ways a run's files change after its summary was written."""
    return {
        "a heartbeat appended": lambda: run.heartbeats_jsonl.open("a").write('{"task":"worker:0","ts":1}\n'),
        "an event appended": lambda: run.events_jsonl.open("a").write('{"ts":1,"event":"note"}\n'),
        "plan.json edited, same size": lambda: run.plan_json.write_text(run.plan_json.read_text().replace("0", "1", 1)),
        "result.json removed": lambda: run.result_json.unlink(),
        "heartbeats.jsonl removed": lambda: run.heartbeats_jsonl.unlink(),
    }


@pytest.mark.parametrize("change", list(_changes(RunDir(Path("/nonexistent")))))
def test_a_stale_summary_is_not_used(tmp_path, change):
    run = _recorded(tmp_path)
    summarise(run)
    assert read_summary(run) is not None
    _changes(run)[change]()
    assert read_summary(run) is None
    if change in CLI_CHECKED:  # the command itself, for a few (each is a process of a few seconds)
        assert _cli_text(run) == report_text(build_report(run)).replace(str(run.path), "RUN") + "\n"


def _doc(run: RunDir) -> dict:
    return json.loads(run.summary_json.read_text())


def _hostile(run: RunDir) -> dict[str, object]:
    """Summaries that are damaged or crafted: each must be refused whole."""

    def edit(fn):
        def apply():
            doc = _doc(run)
            fn(doc)
            run.summary_json.write_text(json.dumps(doc))

        return apply

    def worker(doc):
        return next(iter(doc["report"]["workers"].values()))

    return {
        "torn": lambda: run.summary_json.write_bytes(run.summary_json.read_bytes()[:-100]),
        "not JSON": lambda: run.summary_json.write_bytes(b"\xff\xfe not json"),
        "a list": lambda: run.summary_json.write_text("[]"),
        "another version": edit(lambda d: d.update(version=2)),
        "sources forged away": edit(lambda d: d["sources"].update({"heartbeats.jsonl": None})),
        "a string for a number": edit(lambda d: worker(d)["figures"].update(steps="many")),
        "a bool for an int": edit(lambda d: worker(d).update(profiles=True)),
        "a field missing": edit(lambda d: worker(d).pop("cpu_ms")),
        "a field added": edit(lambda d: worker(d).update(injected=1)),
        "advice not text": edit(lambda d: d["report"]["analysis"].update(advice=[{"x": 1}])),
        "a workers list": edit(lambda d: d["report"].update(workers=[1, 2])),
        "a series point of three": edit(lambda d: next(iter(d["series"].values())).append([1, 2, 3])),
        "a series of strings": edit(lambda d: d.update(series={"worker:0": "abc"})),
        "deeply nested": lambda: run.summary_json.write_text("[" * 100_000 + "]" * 100_000),
    }


@pytest.mark.parametrize("how", list(_hostile(RunDir(Path("/nonexistent")))))
def test_a_damaged_or_hostile_summary_is_refused_and_the_records_read(tmp_path, how):
    run = _recorded(tmp_path)
    summarise(run)
    _hostile(run)[how]()
    assert read_summary(run) is None
    if how in CLI_CHECKED:
        assert _cli_text(run) == (GOLDEN / "recorded.txt").read_text()


def test_a_planted_link_fifo_directory_or_oversized_summary_is_not_read(tmp_path, monkeypatch):
    run = _recorded(tmp_path)
    summarise(run)
    elsewhere = tmp_path / "elsewhere.json"
    os.replace(run.summary_json, elsewhere)
    os.symlink(elsewhere, run.summary_json)  # a valid summary, but reached through a link: not followed
    assert read_summary(run) is None
    run.summary_json.unlink()
    os.replace(elsewhere, run.summary_json)
    assert read_summary(run) is not None
    monkeypatch.setattr(runsummary, "MAX_BYTES", run.summary_json.stat().st_size - 1)
    assert read_summary(run) is None
    run.summary_json.unlink()
    os.mkfifo(run.summary_json)  # no writer: an open that waited for one would hang `report`
    assert read_summary(run) is None
    run.summary_json.unlink()
    run.summary_json.mkdir()
    assert read_summary(run) is None
