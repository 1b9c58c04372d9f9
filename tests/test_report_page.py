"""`report --html` as a page: real tables, advice as wrapped text, goodput as a bar, plots on zero-based
axes with their spread stated; at 1,000 workers the distribution and the outliers, not 1,000 rows or
bars (a synthetic 1,000-task run directory made from tests/data/recorded_run)."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest
from bigrun import SLOW, STRAGGLER, big_run

from orchestrator.runs import RunDir
from orchestrator.views import plots
from orchestrator.views.pages import report_page, sweep_page
from orchestrator.views.report import build_report, report_text

RECORDED = Path(__file__).parent / "data" / "recorded_run"
pytest.importorskip("matplotlib")


def _page(run_path: Path, out: Path) -> tuple[str, list[Path], dict]:
    run = RunDir(run_path)
    rep = build_report(run)
    page, pngs = report_page(run, rep, report_text(rep), out=out)
    return page.read_text(), pngs, rep


def _rows(doc: str) -> list[str]:
    body = doc.split("<h2>Workers", 1)[1].split("</table>", 2)
    return re.findall(r"<tr(?: class=\"flag\")?><td>(worker:\d+)</td>", body[0] + body[1])


def test_the_report_page_is_a_page_not_the_text_in_a_pre(tmp_path):
    doc, pngs, rep = _page(RECORDED, tmp_path)
    assert [p.name for p in pngs] == ["step_times.png", "time_split.png"]
    assert "<table><thead><tr><th>task</th><th>host</th>" in doc and _rows(doc) == ["worker:0", "worker:1", "worker:2"]
    advice = re.search(r"<h2>Advice</h2>\s*<ul>(.*?)</ul>", doc, re.S).group(1)
    assert advice.count("<li>") == len(rep.advice) and html.escape(rep.advice[0]) in advice
    assert "pre{" in doc and "white-space:pre-wrap" in doc and "overflow-wrap:anywhere" in doc  # wrapped, not cut
    bar = re.search(r'<div class="bar"[^>]*>(.*?)</div>', doc).group(1)
    widths = [float(w) for w in re.findall(r"width:([\d.]+)%", bar)]
    assert abs(sum(widths) - 100) < 1 and widths[0] == pytest.approx(
        100 * rep.goodput.seconds["productive_s"] / rep.goodput.wall_s, abs=0.01
    )
    assert "goodput 67.0% of 31.0 s wall time" in doc
    assert doc.count("data:image/png;base64,") == 2
    assert "<details><summary>the text report" in doc  # the text stays, folded away


def test_the_step_time_axis_starts_at_zero_and_states_the_spread(tmp_path, monkeypatch):
    seen = {}
    real = plots._save

    def keep(fig, plt, path):
        ax = fig.axes[0]
        seen[path.name] = (ax.get_ylim() if path.name == "step_times.png" else ax.get_xlim(), ax.get_title())
        return real(fig, plt, path)

    monkeypatch.setattr(plots, "_save", keep)
    series = {"worker:0": [(0.0, 128.0), (1.0, 135.0), (2.0, 142.0)]}  # the 5 % wobble
    plots.step_times(series, [], tmp_path / "step_times.png")
    (lo, hi), title = seen["step_times.png"]
    assert lo == 0 and hi >= 142
    assert "min 128.0 ms, median 135.0 ms, max 142.0 ms (spread 10% of the median)" in title
    plots.histogram({"a": 9.0, "b": 9.5, "c": 27.0}, tmp_path / "h.png", named=["c"])
    (lo, _), title = seen["h.png"]
    assert lo == 0 and "max 27.0 ms" in title


def test_a_thousand_task_report_shows_the_distribution_and_the_outliers(tmp_path):
    run = big_run(tmp_path / "run")
    doc, pngs, rep = _page(run, tmp_path / "page")
    assert len(rep.to_dict()["workers"]) == 1000
    assert [p.name for p in pngs] == ["step_times.png", "step_hist.png", "time_split.png"]
    rows = _rows(doc)
    assert 10 <= len(rows) <= 12 and set(SLOW) <= set(rows) and STRAGGLER in rows  # the outliers, not 1,000 rows
    assert '<tr class="flag"><td>worker:417</td>' in doc  # the straggler's row stands out
    assert "<td>of all workers</td>" not in doc and "<th>of all workers</th><th>p0</th>" in doc
    assert re.search(r"<td>step ms</td><td class=\"n\">9\.\d</td>.*<td class=\"n\">27\.9</td></tr>", doc)
    assert "1000 workers; below, the 5 slowest and 5 fastest" in doc
    assert "the slowest in red" in doc and "How many workers take how long per step" in doc
    assert doc.count("<tr") < 40 and len(doc) < 1_000_000


def test_a_sweep_page_of_a_thousand_workers_draws_their_distribution(tmp_path):
    run = big_run(tmp_path / "run")
    rep = build_report(RunDir(run))
    summary = {
        "sizes": [
            {
                "workers": 1000,
                "run_dir": str(run),
                "throughput": 20213.0,
                "efficiency": 0.3,
                "per_worker": rep.to_dict()["workers"],
                "split": None,
            }
        ],
        "advice": [{"advice": "give the workers the CPU they need " * 8}],
    }
    page, pngs = sweep_page(summary, "SIZE  WORKERS\n1000 …", tmp_path)
    assert [p.name for p in pngs] == ["scaling.png", "step_times_1000.png", "step_hist_1000.png", "time_split_1000.png"]
    doc = page.read_text()
    assert re.search(r"<h2>Advice</h2>\s*<ul><li>give the workers", doc) and doc.count("data:image/png;base64,") == 4


def test_every_value_on_the_page_is_escaped(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    plan = (run / "plan.json").read_text().replace('"10.248.107.3"', '"<script>alert(1)</script>"', 1)
    (run / "plan.json").write_text(plan)
    doc, _, _ = _page(run, tmp_path / "page")
    assert "<script>" not in doc
