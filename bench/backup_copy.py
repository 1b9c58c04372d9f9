#!/usr/bin/env python3
"""The chief's backup copied off its host (issue 34.4): what one pass of the launcher's copy costs.

    python bench/backup_copy.py [--quick] [--json] [--mib 256]

Loopback test bed, 1 host (the chief), real SSH and a real worker_entry on the other end; the copy is
``transfer.backupcopy.CopyStore.take``, as the backup keeper runs it while an attempt trains. The backup
is laid out like tf_keras' BackupAndRestore under MWMS (``chief/checkpoint``, ``ckpt-N.index`` and the
data in 8 shards ``ckpt-N.data-0000K-of-00008``), random bytes. Rows:

* first copy: everything crosses;
* nothing new: one listing, no copy (what each idle pass costs);
* a new save (the TF pattern: new ckpt-N files, the old ones deleted): every data file crosses again;
* one shard changed (a save that rewrote 1 of 8 files in place): only it crosses, 7 are hard-linked.

Baseline: ``scp -r`` of the same directory (same key and host), after the first copy. Each copy is
verified against the sha256 of the generated files. Ratio printed last: a new save's copy MB/s over
scp's (target >= 0.8, as for the gather; the copy never blocks training, it only bounds how fresh
the copy is).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import subprocess

from common import Report, base_parser, say, set_verbose, testbed, write_ssh_config

SHARDS = 8


def save(chief: Path, epoch: int, total: int, only_shard: int | None = None) -> None:
    """A save of epoch ``epoch`` (``only_shard``: rewrite that shard of the current files in place)."""
    chief.mkdir(parents=True, exist_ok=True)
    if only_shard is not None:
        (chief / f"ckpt-{epoch}.data-{only_shard:05d}-of-{SHARDS:05d}").write_bytes(os.urandom(total // SHARDS))
        return
    for k in range(SHARDS):
        (chief / f"ckpt-{epoch}.data-{k:05d}-of-{SHARDS:05d}").write_bytes(os.urandom(total // SHARDS))
    (chief / f"ckpt-{epoch}.index").write_bytes(os.urandom(4096))
    (chief / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{epoch}"\n')
    for old in chief.glob(f"ckpt-{epoch - 1}.*"):
        old.unlink()


def sums(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def main() -> int:
    ap = base_parser(__doc__ or "")
    ap.add_argument("--mib", type=int, default=None, help="backup size in MiB (default 256, quick 64)")
    args = ap.parse_args()
    set_verbose(args.verbose)
    total = (args.mib or (64 if args.quick else 256)) << 20

    from orchestrator.backends.ssh import close_all, connect_all
    from orchestrator.schedulers.ssh import ssh_plan
    from orchestrator.spec import load_spec
    from orchestrator.transfer.backupcopy import FILES, CopyStore

    rep = Report(
        "backup copy off the chief's host (loopback SSH, 1 host)",
        [
            ("case", "case"),
            ("mib", "MiB crossed"),
            ("fetched", "files fetched"),
            ("linked", "linked"),
            ("s", "s"),
            ("mbps", "MB/s"),
        ],
    )
    with tempfile.TemporaryDirectory(prefix="bench-backup-") as wd, testbed(1, mode="loopback") as tb:
        work = Path(wd)
        python = work / "python-this-repo"  # the nodes run this checkout's worker_entry
        repo = Path(__file__).resolve().parent.parent
        python.write_text(f'#!/bin/sh\nPYTHONPATH={repo}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        spec = load_spec(tb.write_spec(work / "spec.yaml", "bk", ["true"], job={"python": str(python)})).spec
        plan = ssh_plan(spec, run_id="bk-1", local_user=tb.user)
        conns, failures, _ = connect_all(plan.nodes)
        if failures:
            raise RuntimeError(f"cannot connect: {failures}")
        try:
            conn, python = conns[str(plan.chief.task)], plan.chief.argv[0]
            chief = tb.dir / "backup" / "chief"
            store = CopyStore(work / "run" / "backup")
            epoch = 1
            save(chief, epoch, total)

            def copy(case: str) -> None:
                t0 = time.monotonic()
                c = store.take(conn, python, str(chief), {})
                s = time.monotonic() - t0
                if c is None:
                    rep.rows.append({"case": case, "mib": 0, "fetched": 0, "linked": 0, "s": round(s, 3), "mbps": None})
                    return
                if sums(c.root / FILES) != sums(chief):
                    raise RuntimeError(f"{case}: the copy differs from the backup")
                fetched = sum(f.size for f in c.files) - sum(
                    f.size for f in c.files if os.stat(c.root / FILES / f.path).st_nlink > 1
                )
                rep.rows.append(
                    {
                        "case": case,
                        "mib": round(fetched / 2**20, 1),
                        "fetched": c.info["fetched"],
                        "linked": c.info["linked"],
                        "s": round(s, 3),
                        "mbps": round(fetched / 1e6 / s, 1),
                    }
                )
                say(f"{case}: {rep.rows[-1]}")

            copy("first copy")
            cfg = work / "ssh_config"
            write_ssh_config(tb, cfg)
            t0 = time.monotonic()
            dest = work / "scp"
            argv = ["scp", "-r", "-q", "-F", str(cfg), f"{tb.hosts[0].name}:{chief}", str(dest)]
            subprocess.run(argv, check=True, timeout=900)
            s = time.monotonic() - t0
            if sums(dest) != sums(chief):
                raise RuntimeError("scp's copy differs from the backup")
            mib = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            rep.rows.append(
                {
                    "case": "scp -r (baseline)",
                    "mib": round(mib / 2**20, 1),
                    "s": round(s, 3),
                    "mbps": round(mib / 1e6 / s, 1),
                }
            )
            copy("nothing new (one listing)")
            epoch += 1
            time.sleep(0.01)
            save(chief, epoch, total)
            copy("a new save (TF: new files)")
            time.sleep(0.01)
            save(chief, epoch, total, only_shard=3)
            copy("one shard of 8 changed")
        finally:
            close_all(conns)
    new = next(r for r in rep.rows if r["case"].startswith("a new save"))
    rep.notes.append(
        "a copy runs on the launcher beside training; only the listing (a short worker_entry) runs on the chief"
    )
    scp = next(r for r in rep.rows if r["case"].startswith("scp"))
    ratio = round(new["mbps"] / scp["mbps"], 3) if scp["mbps"] else None
    rep.set_ratio("a new save's copy MB/s / scp -r MB/s", ratio, ">= 0.8", None if ratio is None else ratio >= 0.8)
    rep.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
