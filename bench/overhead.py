#!/usr/bin/env python3
"""Training overhead: steps/s of the same 3-worker MWMS job under tfcluster vs started by hand,
for Keras fit and for a custom training loop.

    python bench/overhead.py [--quick] [--json] [--repeat N] [--epochs 8] [--steps 100] [--only fit,loop]

Loopback test bed, 3 workers, two workloads with the same model and data (Dense 32-64-1, batch 64 per
worker, Adam): ``fit`` = bench/workloads/mwms_steps.py (Keras ``model.fit``), ``loop`` =
bench/workloads/mwms_loop_steps.py (a custom loop: strategy.run, tape.gradient, apply_gradients,
strategy.reduce). Two warm-up epochs, then --epochs measured epochs of --steps steps; each task prints
its own steps/s, the chief's figure is used. Variants per workload, run in ABBA order (drift cancels):

* by hand: three local processes with the TF_CONFIGs built from `tfcluster plan --json` (no tfcluster);
* tfcluster default: instrumentation on: the step clock (stamps at every collective and replica
  function, the reader thread: progress and a profile record every heartbeat.profile_interval_s),
  host evidence in every heartbeat;
* tfcluster, profiling off (fit only): heartbeat.profile_interval_s: 0 (stamps still count steps);
* tfcluster, instrument off: job.instrument: false (liveness heartbeats only);
* tfcluster, gradient noise off: the command under ``env TFCLUSTER_GRADNOISE=0`` (the step clock without
  the gradient noise scale's two squared norms per step: default / this is their cost).

The nodes run this checkout's worker_entry (job.python is a wrapper putting it first on PYTHONPATH).
The launcher, every worker_entry and sshd share the machine's 2 cores with the 3 workers: their CPU is
part of the overhead measured. Ratios printed last: tfcluster default / by hand (target >= 0.98).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PY,
    REPO,
    Report,
    base_parser,
    launcher_argv,
    launcher_env,
    median,
    run_measured,
    say,
    set_verbose,
    testbed,
)

from worker_entry.protocol.cluster import tf_config

WARMUP = 2
WORKLOADS = {
    "fit": REPO / "bench" / "workloads" / "mwms_steps.py",
    "loop": REPO / "bench" / "workloads" / "mwms_loop_steps.py",
}
# name -> (workload, spec sections; None = by hand)
VARIANTS = {
    "fit: by hand": ("fit", None),
    "fit: tfcluster default": ("fit", {}),
    "fit: tfcluster profiling off": ("fit", {"heartbeat": {"profile_interval_s": 0}}),
    "fit: tfcluster instrument off": ("fit", {"job": {"instrument": False}}),
    "fit: tfcluster gradient noise off": ("fit", {}),  # the command under `env TFCLUSTER_GRADNOISE=0` (NOISE_OFF)
    "loop: by hand": ("loop", None),
    "loop: tfcluster default": ("loop", {}),
    "loop: tfcluster instrument off": ("loop", {"job": {"instrument": False}}),
    "loop: tfcluster gradient noise off": ("loop", {}),
}
# job.env may not set TFCLUSTER_ names (the spec reserves them): the command itself runs under env
NOISE_OFF = ["env", "TFCLUSTER_GRADNOISE=0"]
# --diagnose: by-hand runs that each apply one thing tfcluster's instrumentation does (worker_entry/strategy.py).
DIAGNOSE = {
    # the default is null since TF 2.21 leaks one thread per collective with a timeout set
    "tfcluster collective_timeout_s: 120": {"tensorflow": {"collective_timeout_s": 120}},
    "by hand + CommunicationOptions(RING, timeout 120 s)": ["--comm-impl", "ring", "--comm-timeout", "120"],
    "by hand + CommunicationOptions(RING, no timeout)": ["--comm-impl", "ring"],
    "by hand + coordination heartbeat 10 s": ["--coord-heartbeat-s", "10"],
}
RESULT_RE = re.compile(r"RESULT (\{.*\})")
AB_RE = re.compile(r"^AB (\{.*\})", re.M)
EPOCH_RE = re.compile(r"^(\S+): epoch (\d+) ([\d.]+) steps/s", re.M)
# A worker whose thread count passes this is stopped (the run is marked): TensorFlow leaks one thread per
# collective while a collective timeout is set, and the box's pid_max (32768 here) is shared by everyone.
THREAD_LIMIT = 3000


def chief_rate(texts: list[str], steps: int) -> dict | None:
    """The chief's steps/s: its RESULT line, else (run stopped or crashed) its completed measured epochs."""
    for t in texts:
        for m in RESULT_RE.finditer(t):
            r = json.loads(m.group(1))
            if r["task"] == "worker:0":
                return {"steps_per_s": r["steps_per_s"], "epochs": r["steps"] // steps, "complete": True}
    rates = [
        float(m.group(3))
        for t in texts
        for m in EPOCH_RE.finditer(t)
        if m.group(1) == "worker:0" and int(m.group(2)) >= WARMUP
    ]
    if not rates:
        return None
    return {"steps_per_s": len(rates) / sum(1 / r for r in rates), "epochs": len(rates), "complete": False}


class ThreadWatch(threading.Thread):
    """Polls the thread count of the job's processes; past THREAD_LIMIT calls `abort` once."""

    def __init__(self, procs: Callable[[], list[psutil.Process]], abort: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.procs, self.abort = procs, abort
        self.max_threads = 0
        self.aborted = False
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for p in self.procs():
                with contextlib.suppress(psutil.Error):
                    if p.is_running():  # is_running() also rules out a reused pid (create time)
                        self.max_threads = max(self.max_threads, p.num_threads())
            if self.max_threads > THREAD_LIMIT and not self.aborted:
                self.aborted = True
                self.abort()


def job_pythons(tb) -> list[psutil.Process]:
    out = []
    for procs in tb.processes_by_host().values():
        for p in procs:
            with contextlib.suppress(psutil.Error):
                if "mwms_" in " ".join(p.cmdline()):
                    out.append(p)
    return out


def node_python(work: Path) -> str:
    """job.python: this checkout's worker_entry on the nodes (an editable install elsewhere would win
    from the login directory)."""
    path = work / "python-this-repo"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {PY} "$@"\n')
    path.chmod(0o755)
    return str(path)


def run_tfcluster(tb, work: Path, tag: str, sections: dict, argv: list[str], steps: int) -> dict:
    import copy

    sec = copy.deepcopy(sections)
    sec.setdefault("job", {})["remote_dir"] = str(tb.dir / "remote")
    sec["job"].setdefault("python", node_python(work))
    spec = tb.write_spec(work / f"{tag}.yaml", "overhead", argv, **sec)
    run_dir = work / f"run-{tag}"
    watch: list[ThreadWatch] = []

    found: list[psutil.Process] = []

    def workers() -> list[psutil.Process]:
        # Scan /proc (costly) only until the 3 training processes exist; then poll just those.
        if len(found) < 3:
            found[:] = job_pythons(tb)
        return found

    def on_start(p: subprocess.Popen) -> None:
        w = ThreadWatch(workers, lambda: p.send_signal(signal.SIGTERM))
        w.start()
        watch.append(w)

    m = run_measured(
        launcher_argv(tb, "launch", str(spec), "--run-dir", str(run_dir), "-q", "--no-gather"),
        env=launcher_env(),
        timeout=600,
        on_start=on_start,
    )
    watch[0].stop.set()
    texts = [(run_dir / "logs" / f"worker-{i}.log").read_text() for i in range(3)]
    rate = chief_rate(texts, steps)
    ab = [json.loads(m.group(1)) for t in texts for m in AB_RE.finditer(t)]
    out: dict = {"launcher_cpu_s": m.cpu_s, "wall_s": m.wall_s, "max_threads": watch[0].max_threads}
    if rate:
        out.update(rate)
    if watch[0].aborted:
        out["note"] = f"stopped at {watch[0].max_threads} threads"
    elif m.rc != 0:
        rc = json.loads((run_dir / "result.json").read_text()).get("root_cause") or {}
        out["note"] = f"rc {m.rc}: {rc.get('task')} {rc.get('message')}; " + " | ".join(
            (rc.get("last_lines") or [])[-2:]
        )
    if ab:
        out["ab"] = ab
    elif not rate:
        out["failed"] = out.get("note", "no steps/s in the output")
    return out


def run_hand(tb, work: Path, tag: str, tf_configs: list[dict], argv: list[str], steps: int) -> dict:
    procs, files = [], []
    t0 = time.monotonic()
    for i in range(3):
        env = dict(os.environ)
        env.update({"TF_CONFIG": json.dumps(tf_configs[i]), "TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"})
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        f = open(work / f"{tag}-{i}.log", "w+")  # noqa: SIM115
        files.append(f)
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env))

    def kill_all() -> None:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()

    ps = [psutil.Process(p.pid) for p in procs]
    watch = ThreadWatch(lambda: ps, kill_all)
    watch.start()
    try:
        for p in procs:
            p.wait(timeout=600)
    finally:
        watch.stop.set()
        kill_all()
        for p in procs:
            p.wait()
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read())
        f.close()
    rate = chief_rate(texts, steps)
    out: dict = {"wall_s": time.monotonic() - t0, "max_threads": watch.max_threads}
    if rate:
        out.update(rate)
    if watch.aborted:
        out["note"] = f"stopped at {watch.max_threads} threads"
    elif any(p.returncode != 0 for p in procs):
        out["note"] = f"exit codes {[p.returncode for p in procs]}: {texts[0][-300:]}"
    if not rate:
        out["failed"] = out.get("note", "no steps/s in the output")
    return out


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--epochs", type=int, default=None, help="measured epochs (default 8, quick 4)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--diagnose", action="store_true", help="add by-hand variants applying one tfcluster option each")
    ap.add_argument("--only", default="", help="comma-separated names or substrings: run only those variants")
    ap.add_argument(
        "--ab",
        type=int,
        default=0,
        help="also: the loop under tfcluster, stamps on/off alternating in one job (rounds)",
    )
    args = ap.parse_args()
    set_verbose(args.verbose)
    reps = args.repeat or (1 if args.quick else 2)
    epochs = args.epochs or (4 if args.quick else 8)
    jobs = {
        w: [PY, str(path), "--warmup-epochs", str(WARMUP), "--epochs", str(epochs), "--steps", str(args.steps)]
        for w, path in WORKLOADS.items()
    }
    job = jobs["fit"]
    names = list(VARIANTS) + (list(DIAGNOSE) if args.diagnose else [])
    if args.only:
        wanted = [o.strip() for o in args.only.split(",") if o.strip()]
        # an entry equal to a variant's name selects just that one; otherwise it is a substring
        names = [n for n in names if any(o == n or (o not in names and o in n) for o in wanted)]
    results: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as wd, testbed(3, mode="loopback") as tb:
        work = Path(wd)
        spec = tb.write_spec(work / "plan.yaml", "overhead", job)
        plan = subprocess.run(
            [PY, "-m", "orchestrator", "plan", str(spec), "--json"],
            capture_output=True,
            text=True,
            env=launcher_env(),
            cwd=str(REPO),
            check=True,
        )
        record = json.loads(plan.stdout)  # the plan record: the cluster once, each task's TF_CONFIG from it
        tasks = [t["task"].partition(":") for t in record["tasks"]]
        tf_configs = [tf_config(record["cluster"], kind, int(index)) for kind, _, index in tasks]
        order = []
        for rep in range(reps):
            order += names if rep % 2 == 0 else names[::-1]  # ABCD DCBA ...: linear drift cancels
        for k, name in enumerate(order):
            tag = f"{k}-{name.replace(' ', '_').replace(':', '')}"
            if name in DIAGNOSE and isinstance(DIAGNOSE[name], dict):
                r = run_tfcluster(tb, work, tag, DIAGNOSE[name], job, args.steps)
            elif name in DIAGNOSE:
                r = run_hand(tb, work, tag, tf_configs, job + DIAGNOSE[name], args.steps)
            else:
                workload, sections = VARIANTS[name]
                if sections is None:
                    r = run_hand(tb, work, tag, tf_configs, jobs[workload], args.steps)
                else:
                    argv = [*NOISE_OFF, *jobs[workload]] if "gradient noise off" in name else jobs[workload]
                    r = run_tfcluster(tb, work, tag, sections, argv, args.steps)
            results[name].append(r)
            if "failed" in r:
                say(f"{k + 1}/{len(order)} {name}: FAILED {r['failed'][:300]}")
            else:
                extra = f" ({r['note'][:200]})" if r.get("note") else ""
                say(f"{k + 1}/{len(order)} {name}: {r['steps_per_s']:.1f} steps/s over {r['epochs']} epochs{extra}")
    ok = {n: [r for r in rs if "failed" not in r] for n, rs in results.items()}

    def base_of(name: str) -> float:
        """The by-hand steps/s of the variant's workload (the DIAGNOSE variants are Keras fit)."""
        workload = VARIANTS[name][0] if name in VARIANTS else "fit"
        return median([r["steps_per_s"] for r in ok.get(f"{workload}: by hand", [])])

    ab_runs = []
    if args.ab:
        with tempfile.TemporaryDirectory(prefix="bench-overhead-ab-") as wd, testbed(3, mode="loopback") as tb:
            for k in range(reps):
                r = run_tfcluster(tb, Path(wd), f"ab{k}", {}, [*jobs["loop"], "--ab", str(args.ab)], args.steps)
                ab_runs.append(r)
                say(f"ab {k + 1}/{reps}: {r.get('ab') or r.get('failed')}")
    report = Report(
        f"training overhead: steps/s of 3 MWMS workers, tfcluster vs by hand (loopback, {epochs}x{args.steps} steps)",
        [
            ("variant", "variant"),
            ("runs", "runs"),
            ("steps_per_s", "steps/s (median)"),
            ("each", "each run"),
            ("ratio", "vs by hand"),
            ("launcher_cpu_s", "launcher CPU s"),
            ("threads", "chief max threads"),
            ("failed", "runs stopped/failed"),
        ],
    )
    failures = []
    for name in names:
        rs = ok[name]
        failures += [f"{name}: {r['note']}" for r in results[name] if r.get("note")]
        sps = median([r["steps_per_s"] for r in rs])
        report.rows.append(
            {
                "variant": name,
                "runs": len(rs),
                "failed": sum(1 for r in results[name] if r.get("note")),
                "threads": max((r.get("max_threads") or 0 for r in results[name]), default=None),
                "steps_per_s": sps,
                "each": " ".join(
                    "FAIL" if "failed" in r else f"{r['steps_per_s']:.1f}" + ("" if r["complete"] else "*")
                    for r in results[name]
                ),
                "ratio": sps / base_of(name),
                "launcher_cpu_s": median([r["launcher_cpu_s"] for r in rs if "launcher_cpu_s" in r]) if rs else None,
            }
        )
    report.notes.append(
        f"order {' / '.join(order)}; the chief's own steps/s over the measured epochs (after {WARMUP} warm-up epochs)"
    )
    for f in failures:
        report.notes.append(f"run stopped or failed: {f[:300]}")
    if failures:
        report.notes.append(
            f"* = run did not finish (a worker passed {THREAD_LIMIT} threads and the benchmark stopped it, or it "
            "crashed): steps/s of its completed measured epochs"
        )
    report.data = {"raw": results, "order": order, "warmup_epochs": WARMUP}
    if ab_runs:
        pairs = [a for r in ab_runs for a in r.get("ab", [])]
        report.data["ab"] = pairs
        ratios = [a["ratio"] for a in pairs]
        report.notes.append(
            "in one job (custom loop under tfcluster, stamps on/off traced twice, alternating blocks of 20 steps, "
            f"{args.ab} rounds): steps/s with stamps / without, per worker: "
            + ", ".join(f"{a['task']} {a['ratio']:.4f} ({a['on_ms']:.2f} vs {a['off_ms']:.2f} ms)" for a in pairs)
            + (f"; median {median(ratios):.4f}" if ratios else "")
        )
    ratios = {
        w: median([r["steps_per_s"] for r in ok.get(f"{w}: tfcluster default", [])]) / base_of(f"{w}: by hand")
        for w in WORKLOADS
        if ok.get(f"{w}: tfcluster default") and ok.get(f"{w}: by hand")
    }
    norms = {
        w: median([r["steps_per_s"] for r in ok[f"{w}: tfcluster default"]])
        / median([r["steps_per_s"] for r in ok[f"{w}: tfcluster gradient noise off"]])
        for w in WORKLOADS
        if ok.get(f"{w}: tfcluster default") and ok.get(f"{w}: tfcluster gradient noise off")
    }
    if norms:
        report.notes.append(
            "the gradient noise scale's norms: tfcluster default / gradient noise off steps/s: "
            + ", ".join(f"{w} {r:.3f}" for w, r in norms.items())
            + " (1 - this is their cost in % of a step; target <= 1 %)"
        )
        report.data["norms_ratio"] = norms
    ratio = min(ratios.values()) if ratios else float("nan")
    label = ", ".join(f"{w} {r:.3f}" for w, r in ratios.items())
    report.set_ratio(f"tfcluster default / by hand steps/s (worst of: {label})", ratio, ">= 0.98", ratio >= 0.98)
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
