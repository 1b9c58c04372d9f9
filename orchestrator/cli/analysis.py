"""`tfcluster report` and `tfcluster scale`: why a job does (not) scale, from one run or a sweep."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from ..core.errors import UsageError
from ..core.terminal import safe_text
from .exitcodes import EXIT_OK, exit_code_for_sweep


def cmd_report(args: argparse.Namespace) -> int:
    """`tfcluster report RUN`: why a run does (not) scale, from its run directory alone (text, --json, --html).
    The whole run's report is RUN/summary.json's when the run's end wrote one that matches the run's
    files (``views.runsummary``), else built from the records."""
    from ..views.logs import parse_duration
    from ..views.records import heartbeat_records
    from ..views.report import build_report, report_text
    from ..views.runsummary import read_summary
    from .commands import resolved_run

    last_s = parse_duration(args.last, "--last") if args.last else None
    run = resolved_run(args)
    summary = read_summary(run) if last_s is None else None  # the run's end wrote it: used when it matches
    if summary is not None:
        report, records, series = summary.report, None, summary.series
    else:
        records = heartbeat_records(run.heartbeats_jsonl)  # read once: the report and its page (--html) both use them
        gc.freeze()  # they live until this command exits: the collector need not walk them on every later pass
        report, series = build_report(run, last_s=last_s, records=records), None
    text = report_text(report)
    data = report.to_dict()  # --json: the model's one JSON shape
    if args.html:
        from ..views.pages import report_page

        page, pngs = report_page(run, report, text, records=records, series=series)
        data.update(html=str(page), pngs=[str(p) for p in pngs])
    print(json.dumps(data, indent=2) if args.json else safe_text(text))  # hosts and causes come from nodes
    if args.html and not args.json:
        print(f"\nwrote {data['html']} and {', '.join(os.path.basename(p) for p in data['pngs'])}")
    return EXIT_OK


def cmd_scale(args: argparse.Namespace) -> int:
    """`tfcluster scale SPEC`: one bounded launch per size, then the sweep measured and compared (scale.json,
    page, PNGs); the exit code is the first size that did not succeed."""
    from ..job.scale import SizeRun, SweepOptions, parse_sizes, run_sweep
    from ..runs import check_new_dir, write_json_atomic
    from ..schedulers import scheduler_for
    from ..spec import load_spec
    from ..views.pages import sweep_page
    from ..views.scale import sweep_summary, sweep_text
    from .commands import after_run, run_bound

    loaded = load_spec(args.spec)
    scheduler = scheduler_for(loaded.spec)
    scheduler.check_sweep(loaded)
    hosts = len(loaded.spec.hosts or [])
    sizes = parse_sizes(args.workers, hosts) if args.workers else _default_sizes(hosts)
    if args.steps is None and args.duration is None and args.examples is None:
        args.duration = "60s"
    bound = dataclasses.replace(run_bound(args.steps, args.duration, ("--steps", "--duration")), examples=args.examples)
    net = None
    if getattr(args, "check", None) or getattr(args, "network", None):
        from ..views.predict import network_of

        net = network_of(args.check, args.network)  # before any size runs: a bad value stops here
    root = Path(args.run_dir or os.path.join("runs", f"scale-{loaded.spec.name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"))
    if check_new_dir(root):
        raise UsageError(f"--run-dir {root}: already exists and is not empty; choose another")
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UsageError(f"--run-dir {root}: cannot create it: {exc.strerror or exc}") from None
    opts = SweepOptions(sizes, bound, root, strong=args.strong, preflight=not args.no_preflight, echo_logs=args.verbose)
    say = sys.stderr
    print(
        f"tfcluster scale: {', '.join(map(str, sizes))} workers, {bound.describe()} each; sweep directory {root}",
        file=say,
    )

    def on_size(run: SizeRun) -> None:
        after_run(run.run_dir)
        print(f"tfcluster scale: {run.workers} worker(s): {run.state} in {run.wall_s:.0f}s ({run.run_dir})", file=say)

    runs, interrupted = run_sweep(loaded, opts, scheduler, on_size)
    summary = sweep_summary([r.to_dict() for r in runs], args.strong, target=args.to_loss)
    summary.update(
        spec=loaded.path, sweep_dir=str(root), bound=bound.describe(), interrupted=interrupted, examples=args.examples
    )
    text = sweep_text(summary)
    if net is not None:
        from ..views.predict import sweep_prediction

        summary["prediction"], lines = sweep_prediction(summary, net)
        text += "\n\n" + "\n".join(lines)
    try:
        page, pngs = sweep_page(summary, text, root)
        summary.update(html=str(page), pngs=[str(p) for p in pngs])
    except UsageError as exc:  # no matplotlib: the table and JSON still stand
        summary.update(html=None, pngs=[], pictures_error=str(exc))
    write_json_atomic(root / "scale.json", summary)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(safe_text(text))
        where = (
            f"{summary['html']} (pictures: {len(summary['pngs'])} PNGs)"
            if summary.get("html")
            else summary["pictures_error"]
        )
        print(f"\nwrote {root / 'scale.json'} and {where}")
    return exit_code_for_sweep([r.state for r in runs], interrupted)


def _default_sizes(hosts: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the spec's hosts, and the spec's hosts itself."""
    sizes, n = [], 1
    while n < hosts:
        sizes.append(n)
        n *= 2
    return (*sizes, hosts) if hosts else (1,)
