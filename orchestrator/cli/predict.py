"""`tfcluster predict RUN --workers 2,4,8`: the scaling model on a measured run (views.predict)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..core.errors import UsageError
from ..core.terminal import safe_text
from .exitcodes import EXIT_OK


def parse_workers(text: str) -> list[int]:
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 1 << 20:
            raise UsageError(f"--workers {text!r}: expected worker counts like 2,4,8,16,64 (each 1 to 1048576)")
        out.add(int(part))
    return sorted(out)


def _durations(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """--mtbf and --save-cost in seconds (None: measured in the run), refused before anything is read."""
    from ..views.logs import parse_duration

    mtbf = parse_duration(args.mtbf, "--mtbf") if getattr(args, "mtbf", None) else None
    cost = parse_duration(args.save_cost, "--save-cost") if getattr(args, "save_cost", None) else None
    if mtbf is not None and mtbf <= 0:
        raise UsageError(f"--mtbf {args.mtbf!r}: must be more than 0")
    return mtbf, cost


def _backup_interval(path: Path, args: argparse.Namespace) -> dict | None:
    """The Young-Daly advice: the save cost and MTBF measured in the run (a run directory), or given."""
    from ..views.backup_interval import backup_advice
    from ..views.records import event_records

    mtbf, cost = _durations(args)
    events = event_records(path / "events.jsonl") if (path / "events.jsonl").is_file() else []
    stamps = [e.ts for e in events]
    wall = max(stamps) - min(stamps) if stamps else 0.0
    return backup_advice(events, wall, mtbf_s=mtbf, save_s=cost)


def cmd_predict(args: argparse.Namespace) -> int:
    """Predicted step time, examples/s, speed-up and efficiency per size (text, --json, --html/--png)."""
    from ..runs import resolve_run
    from ..views.predict import SCALE_JSON, build_prediction, network_of, prediction_text

    sizes = parse_workers(args.workers)
    _durations(args)
    if args.network:
        network_of(None, args.network)  # a bad value is named before anything is read
    path = Path(args.run)
    if not os.path.lexists(path / SCALE_JSON):  # (a planted link or FIFO there is refused by name, not skipped)
        path = resolve_run(args.run, args.runs_dir).path
    net = network_of(args.check, args.network, near=[path, path.parent])
    pred = build_prediction(path, sizes, net)
    text = prediction_text(pred)
    advice = _backup_interval(path, args)
    if advice is not None:
        from ..views.backup_interval import advice_lines

        pred["backup_interval"] = advice
        text += "\n\n" + "\n".join(advice_lines(advice))
    if args.html or args.png:
        from ..views.predict_plot import curve, page

        if args.html:
            html, png = page(pred, text, Path(args.html))
            pred.update(html=str(html), png=str(png))
        else:
            pred["png"] = str(curve(pred, Path(args.png)))
    print(json.dumps(pred, indent=2) if args.json else safe_text(text))
    if not args.json and pred.get("png"):
        print(f"\nwrote {pred.get('html') or pred['png']}")
    return EXIT_OK
