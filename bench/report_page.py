"""`report --html` of a 1,000-task run: seconds to build the report and to draw its page, from the
synthetic run directory the tests use (tests/bigrun.py: 1,000 copies of the recorded run's workers,
46,000 heartbeat records). Usage: python bench/report_page.py [TASKS] [REPEATS]."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bigrun import big_run

from orchestrator.runs import RunDir
from orchestrator.views.pages import report_page
from orchestrator.views.report import build_report, report_text


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="example: python bench/report_page.py 1000 3"
    )
    ap.add_argument("tasks", nargs="?", type=int, default=1000, help="tasks in the synthetic run (default 1000)")
    ap.add_argument("repeats", nargs="?", type=int, default=3, help="timed repeats (default 3)")
    args = ap.parse_args()
    n, repeats = args.tasks, args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir(big_run(Path(tmp) / "run", n))
        builds, pages = [], []
        for i in range(repeats):
            t0 = time.perf_counter()
            rep = build_report(run)
            t1 = time.perf_counter()
            page, pngs = report_page(run, rep, report_text(rep), out=Path(tmp) / f"page{i}")
            pages.append(time.perf_counter() - t1)
            builds.append(t1 - t0)
        size = page.stat().st_size
    print(
        f"{n} tasks: build_report median {statistics.median(builds):.2f} s, report page (3 PNGs + HTML) median "
        f"{statistics.median(pages):.2f} s, page {size / 1e3:.0f} kB, {len(pngs)} pictures ({repeats} runs)"
    )


if __name__ == "__main__":
    main()
