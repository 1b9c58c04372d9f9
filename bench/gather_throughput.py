#!/usr/bin/env python3
"""Gather throughput: MB/s of `tfcluster gather RUN` on a 1 GiB checkpoint directory vs `scp -r`.

    python bench/gather_throughput.py [--quick] [--json] [--repeat N] [--mib 1024]

Loopback test bed, 1 host (the chief). A checkpoint directory is generated once on the host: many
small files (1/8 of the volume, 32 KiB each, in 64 subdirectories) and four large ones (the rest),
random bytes. A trivial run (`launch --no-gather -- true`, checkpoint.dir pointing there) gives a
finished run directory; then, in ABBA order:

* tfcluster: `python -m orchestrator gather RUN` (RUN/checkpoints, gather-state.json and RUN/nodes
  removed first, so everything is copied again; the command's wall time, which includes its Python
  start, the SSH connection, the remote manifest and per-file sha256 + fsync);
* scp: `scp -r -q` of the same directory (OpenSSH, same key, strict host-key checking).

Both copies are verified afterwards against the sha256 of every generated file. Ratio printed last:
tfcluster MB/s / scp MB/s (target >= 0.8).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    Report,
    base_parser,
    launcher_argv,
    launcher_env,
    median,
    run_measured,
    say,
    set_verbose,
    testbed,
    write_ssh_config,
)

SMALL = 32 * 1024


def generate(root: Path, total: int) -> dict[str, str]:
    """Random files under root; returns {relative path: sha256}."""
    rng = random.Random(1234)
    sums: dict[str, str] = {}
    small_total = total // 8
    n_small = max(1, small_total // SMALL)
    for i in range(n_small):
        rel = f"shards/{i % 64:02d}/var-{i:05d}.bin"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(SMALL)
        p.write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    large = (total - n_small * SMALL) // 4
    for i in range(4):
        rel = f"ckpt-{i}.data-00000-of-00001"
        h = hashlib.sha256()
        with open(root / rel, "wb") as f:
            left = large
            while left:
                chunk = rng.randbytes(min(left, 8 << 20))
                f.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        sums[rel] = h.hexdigest()
    (root / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')
    sums["checkpoint"] = hashlib.sha256(b'model_checkpoint_path: "ckpt-3"\n').hexdigest()
    return sums


def verify(dest: Path, sums: dict[str, str]) -> int:
    """Number of files missing or different (0 = a perfect copy)."""
    bad = 0
    for rel, want in sums.items():
        p = dest / rel
        if not p.is_file():
            bad += 1
            continue
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        bad += h.hexdigest() != want
    extra = sum(1 for p in dest.rglob("*") if p.is_file()) - len(sums)
    return bad + max(0, extra)


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--mib", type=int, default=None, help="checkpoint size in MiB (default 1024, quick 256)")
    args = ap.parse_args()
    set_verbose(args.verbose)
    total = (args.mib or (256 if args.quick else 1024)) << 20
    reps = args.repeat or (1 if args.quick else 2)
    res: dict[str, list[dict]] = {"tfcluster gather": [], "scp -r": []}
    with tempfile.TemporaryDirectory(prefix="bench-gather-") as wd, testbed(1, mode="loopback") as tb:
        work = Path(wd)
        cfg = work / "ssh_config"
        write_ssh_config(tb, cfg)
        ckpt = tb.dir / "ckpt"  # "on the host": the chief's checkpoint dir (removed with the test bed)
        ckpt.mkdir()
        say(f"generating {total >> 20} MiB checkpoint ...")
        sums = generate(ckpt, total)
        nbytes = sum((ckpt / r).stat().st_size for r in sums)
        spec = tb.write_spec(
            work / "gather.yaml",
            "gather",
            ["true"],
            job={"remote_dir": str(tb.dir / "remote")},
            checkpoint={"dir": str(ckpt)},
        )
        run = work / "run"
        m = run_measured(
            launcher_argv(tb, "launch", str(spec), "--run-dir", str(run), "-q", "--no-gather"), env=launcher_env()
        )
        if m.rc != 0:
            raise RuntimeError(f"launch failed: {m.stderr[-1500:]}")
        order = []
        for rep in range(reps):
            order += ["scp -r", "tfcluster gather"] if rep % 2 == 0 else ["tfcluster gather", "scp -r"]
        for k, what in enumerate(order):
            if what == "tfcluster gather":
                for p in (run / "checkpoints", run / "nodes"):
                    shutil.rmtree(p, ignore_errors=True)
                (run / "gather-state.json").unlink(missing_ok=True)
                m = run_measured(launcher_argv(tb, "gather", str(run)), env=launcher_env(), timeout=900)
                dest = run / "checkpoints"
            else:
                dest = work / f"scp-{k}"
                m = run_measured(
                    ["scp", "-r", "-q", "-F", str(cfg), f"{tb.hosts[0].name}:{ckpt}", str(dest)], timeout=900
                )
            if m.rc != 0:
                raise RuntimeError(f"{what} failed ({m.rc}): {m.stderr[-1500:]}")
            bad = verify(dest, sums)
            if what == "scp -r":
                shutil.rmtree(dest, ignore_errors=True)
            res[what].append({"wall_s": m.wall_s, "cpu_s": m.cpu_s, "bad_files": bad, "box_cpu_s": m.box_cpu_s})
            say(f"{k + 1}/{len(order)} {what}: {nbytes / 2**20 / m.wall_s:.0f} MiB/s, {bad} bad files")
    rows = []
    for what, rs in res.items():
        wall = median([r["wall_s"] for r in rs])
        rows.append(
            {
                "method": what,
                "files": len(sums),
                "mib": nbytes / 2**20,
                "wall_s": wall,
                "each": " ".join(f"{r['wall_s']:.1f}" for r in rs),
                "mib_per_s": nbytes / 2**20 / wall,
                "cpu_s": median([r["cpu_s"] for r in rs]),
                "box_cpu_s": median([r["box_cpu_s"] for r in rs]),
                "bad": sum(r["bad_files"] for r in rs),
            }
        )
    report = Report(
        f"gather throughput: {nbytes / 2**20:.0f} MiB checkpoint directory ({len(sums)} files), loopback host",
        [
            ("method", "method"),
            ("files", "files"),
            ("wall_s", "wall s (median)"),
            ("each", "each run s"),
            ("mib_per_s", "MiB/s"),
            ("cpu_s", "client CPU s"),
            ("box_cpu_s", "box CPU s"),
            ("bad", "bad files"),
        ],
        rows=rows,
    )
    report.notes.append(
        f"median of {reps}, ABBA order; client CPU = the gather command / scp and its ssh (os.wait4 rusage); "
        "box CPU = all processes on the machine during the copy (sshd, worker_entry send, others' load)"
    )
    report.data = {"raw": res, "bytes": nbytes, "files": len(sums)}
    ratio = rows[0]["mib_per_s"] / rows[1]["mib_per_s"]
    ok = rows[0]["bad"] == 0 and rows[1]["bad"] == 0
    report.set_ratio("tfcluster gather / scp -r MiB/s", ratio, ">= 0.8, both copies verified", ratio >= 0.8 and ok)
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
