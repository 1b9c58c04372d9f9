#!/usr/bin/env python3
"""A thousand-task job that loses a host every 2 minutes: what each policy costs (issue 34, item 9).

    python3 bench/elastic_sim.py [--tasks 1024] [--loss-every 120] [--hours 4] [--seeds 20] [--quick] [--json]
                                 [--save-s 10] [--detect-s 10] [--recover-s 8] [--startup-s 30]

Simulated time (``bench/elastic_model.py``: nothing sleeps), with the launcher's real attempt policy
deciding after every failure (``RestartPolicy.decide`` on the job's ``Members``). Scenarios, each at the
backup interval ``report`` advises (Young-Daly √(2 · save cost · MTBF)):

* ``in place``: no spare, ``min_workers`` = the plan (what the launcher did before issue 34);
* ``8 spares``: ``hosts[].spare`` x 8, no shrinking;
* ``min_workers``: no spare, ``restart.min_workers`` = half the plan;
* ``8 spares + min_workers``: both.

Then the backup interval swept from a quarter to 4 x the advice (``8 spares + min_workers``, and the same
at a 30-minute MTBF with a 30-s save, where the first-order model should hold): is the advice at the
measured goodput optimum? The restart costs default to what bench/elastic.py measured on the namespace
bed (docs/benchmarks.md §16: the launcher's part 7-8 s, TensorFlow's restart 24-38 s).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Report, base_parser, say, set_verbose
from elastic_model import SimConfig, simulate, sweep, young_daly_s

FACTORS = (0.25, 0.35, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0, 2.8, 4.0)


def scenarios(base: SimConfig) -> dict[str, SimConfig]:
    half = base.tasks // 2
    return {
        "in place": replace(base, spares=0, min_workers=None),
        "8 spares": replace(base, spares=8, min_workers=None),
        "min_workers": replace(base, spares=0, min_workers=half),
        "8 spares + min_workers": replace(base, spares=8, min_workers=half),
    }


def row(name: str, cfg: SimConfig, seeds: int) -> dict:
    runs = [simulate(cfg, s) for s in range(seeds)]
    again = [x for r in runs for x in r.loss_to_training_s]
    redone = [x for r in runs for x in r.redone_s]
    return {
        "scenario": name,
        "goodput": round(statistics.fmean(r.goodput for r in runs), 3),
        "losses": round(statistics.fmean(r.losses for r in runs), 1),
        "reshapes": round(statistics.fmean(r.reshapes for r in runs), 1),
        "failed_runs": sum(r.state == "failed" for r in runs),
        "survived_h": round(statistics.fmean(_ended(r, cfg) for r in runs) / 3600, 2),
        "workers_end": round(statistics.fmean(r.workers for r in runs)),
        "again_mean_s": round(statistics.fmean(again), 1) if again else None,
        "again_max_s": round(max(again), 1) if again else None,
        "redone_mean_s": round(statistics.fmean(redone), 1) if redone else None,
        "why": next((r.ended_why for r in runs if r.ended_why), "")[:90],
    }


def _ended(r, cfg: SimConfig) -> float:
    """How long the run trained on: the horizon, or where the policy ended it (its last loss)."""
    return r.ended_at if r.ended_at is not None else cfg.horizon_s


def check(cfg: SimConfig, seeds: int) -> tuple[list[dict], dict]:
    rows = sweep(cfg, FACTORS, seeds)
    best = max(rows, key=lambda r: r["goodput"])
    at = next(r for r in rows if r["factor"] == 1.0)
    return rows, {
        "mtbf_s": cfg.loss_every_s,
        "save_s": cfg.save_s,
        "advice_s": round(young_daly_s(cfg.save_s, cfg.loss_every_s), 1),
        "best_interval_s": best["interval_s"],
        "best_factor": best["factor"],
        "goodput_at_advice": at["goodput"],
        "goodput_best": best["goodput"],
        "shortfall_pct": round(100 * (best["goodput"] - at["goodput"]) / best["goodput"], 2)
        if best["goodput"]
        else None,
    }


def live_table(n: int, losses: int, every_s: float, timeout_s: float) -> tuple[str, list, list]:
    """The real supervisor (``elastic_live``) at ``n`` tasks: 8 spares, then no spare with min_workers."""
    import tempfile

    import elastic_live

    rows = []
    with tempfile.TemporaryDirectory(prefix="elastic-live-") as tmp:
        for name, spares, min_workers in (("8 spares", 8, None), ("min_workers", 0, n // 2)):
            say(f"live {name} at {n} tasks")
            where = Path(tmp) / name.replace(" ", "-")
            r = elastic_live.run(n, spares, min_workers, losses, every_s, where, timeout_s=timeout_s)
            r.pop("run_dir")
            rows.append({"scenario": name, **r})
    return (
        f"the real launcher at {n} load-generator tasks, a host lost every {every_s:g} s of training "
        f"(heartbeat 1 s, timeout {rows[0]['timeout_s']:g} s)",
        [
            ("scenario", "scenario"),
            ("state", "state"),
            ("hosts_lost", "hosts lost"),
            ("reshapes", "reshapes"),
            ("workers_end", "workers at end"),
            ("again_mean_s", "loss->training mean s"),
            ("again_max_s", "max s"),
            ("wall_s", "wall s"),
        ],
        rows,
    )


def main() -> int:
    ap = base_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1024)
    ap.add_argument("--loss-every", type=float, default=120.0, help="simulated seconds between host losses (MTBF)")
    ap.add_argument("--hours", type=float, default=4.0, help="simulated wall time of each run")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--save-s", type=float, default=10.0)
    ap.add_argument("--detect-s", type=float, default=10.0, help="the heartbeat timeout")
    ap.add_argument("--recover-s", type=float, default=8.0, help="teardown, decision, new plan, reconnect")
    ap.add_argument("--startup-s", type=float, default=30.0, help="TensorFlow's start and restore")
    ap.add_argument(
        "--live",
        type=int,
        default=0,
        metavar="N",
        help="also run the launcher's real Job/supervisor at N load-generator tasks losing hosts for good",
    )
    ap.add_argument("--live-losses", type=int, default=4, help="hosts lost in each live run")
    ap.add_argument("--live-every", type=float, default=10.0, help="real seconds of training between live losses")
    ap.add_argument("--live-timeout", type=float, default=15.0, help="the live runs' heartbeat timeout")
    args = ap.parse_args()
    set_verbose(args.verbose)
    seeds = 3 if args.quick else args.seeds
    base = SimConfig(
        tasks=args.tasks,
        loss_every_s=args.loss_every,
        save_s=args.save_s,
        detect_s=args.detect_s,
        recover_s=args.recover_s,
        startup_s=args.startup_s,
        horizon_s=args.hours * 3600,
    )
    base = replace(base, backup_every_s=young_daly_s(base.save_s, base.loss_every_s))
    rep = Report(
        f"elastic simulation: {args.tasks} tasks, a host lost every {args.loss_every:g} s, {args.hours:g} h, "
        f"{seeds} seeds",
        [
            ("scenario", "scenario"),
            ("goodput", "goodput"),
            ("losses", "hosts lost"),
            ("reshapes", "reshapes"),
            ("failed_runs", "runs ended"),
            ("survived_h", "ran h"),
            ("workers_end", "workers at end"),
            ("again_mean_s", "loss->training mean s"),
            ("again_max_s", "max s"),
            ("redone_mean_s", "redone mean s"),
        ],
    )
    for name, cfg in scenarios(base).items():
        say(f"scenario {name}")
        rep.rows.append(row(name, cfg, seeds))
    sweeps = {
        f"MTBF {base.loss_every_s:g} s, save {base.save_s:g} s": replace(base, spares=8, min_workers=base.tasks // 2),
        "MTBF 1800 s, save 30 s": replace(
            base, spares=8, min_workers=base.tasks // 2, loss_every_s=1800.0, save_s=30.0, horizon_s=24 * 3600.0
        ),
    }
    checks = []
    for name, cfg in sweeps.items():
        say(f"sweep {name}")
        rows, verdict = check(cfg, seeds)
        checks.append({"sweep": name, **verdict})
        rep.extra_tables.append(
            (
                f"backup interval sweep, {name} (8 spares + min_workers; advice √(2·C·M) = {verdict['advice_s']} s)",
                [("factor", "x advice"), ("interval_s", "interval s"), ("goodput", "goodput")],
                rows,
            )
        )
    rep.extra_tables.append(
        (
            "Young-Daly check",
            [
                ("sweep", "sweep"),
                ("advice_s", "advice s"),
                ("best_interval_s", "best s"),
                ("goodput_at_advice", "goodput at advice"),
                ("goodput_best", "best goodput"),
                ("shortfall_pct", "shortfall %"),
            ],
            checks,
        )
    )
    rep.data = {"config": base.__dict__, "why_ended": {r["scenario"]: r["why"] for r in rep.rows}}
    rep.notes += [
        f"costs per failure: detection {base.detect_s:g} s (heartbeat timeout) + recovery {base.recover_s:g} s + "
        f"startup {base.startup_s:g} s; save {base.save_s:g} s every {base.backup_every_s:.1f} s of training (the advice)",
        "goodput = work done in seconds of the planned job's training / wall time; a shrunk job keeps the global "
        "batch, so n of N workers progress at n/N",
    ]
    if args.live:
        rep.extra_tables.append(live_table(args.live, args.live_losses, args.live_every, args.live_timeout))
    worst = max(c["shortfall_pct"] or 0.0 for c in checks)
    rep.set_ratio("goodput shortfall at the advice vs the swept best (%)", worst, "<= 2 %", worst <= 2.0)
    rep.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
