#!/usr/bin/env python3
"""What tfcluster's heartbeats read from NVML on this host, idle and under a GPU load: one command to
check the GPU-health path on a GPU host (this project's machines have no GPU).

    python bench/gpu_health.py [--seconds 20] [--load torch|none] [--size 8192] [--json]

Samples ``worker_entry.nvml.Nvml().sample()`` — exactly what worker_entry puts in every heartbeat — once
per second: a few idle samples, then ``--seconds`` under a load (``torch``: a matmul loop on every visible
GPU, in a child process; TensorFlow is not needed), then idle again. Prints per GPU the SM clock
against its maximum, the throttle reasons, temperature, power against its limit, memory, PCIe
generation/width against their maximum, active NVLinks, ECC and XID errors, the power limits and the
processes of other programs on each GPU, and what tfcluster's judgement (``orchestrator.supervise.gpus``)
names. docs/benchmarks.md ("GPU health") has an H100's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LOAD = r"""
import sys, time, torch
n = int(sys.argv[1]); until = time.time() + float(sys.argv[2])
xs = [torch.randn(n, n, device=f"cuda:{i}", dtype=torch.float16) for i in range(torch.cuda.device_count())]
while time.time() < until:
    for x in xs:
        y = x @ x
    torch.cuda.synchronize()
"""

FIELDS = (
    "util",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "throttle",
    "temp_c",
    "power_w",
    "power_limit_w",
    "power_default_limit_w",
    "mem_used_mb",
    "mem_total_mb",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "nvlink_active",
    "ecc_uncorrected",
    "xid_errors",
    "processes",
    "others",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds under load")
    ap.add_argument("--load", choices=("torch", "none"), default="torch")
    ap.add_argument("--size", type=int, default=8192, help="matrix size of the load")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from orchestrator.supervise.gpus import judge_gpus
    from worker_entry.gpuowner import TaskTree
    from worker_entry.nvml import Nvml

    nv = Nvml()
    if not nv.available:
        print("no NVIDIA driver/NVML on this host: nothing to sample (run this on a GPU host)", file=sys.stderr)
        return 2
    print(json.dumps({"inventory": nv.inventory()}))
    samples = []

    def sample(phase: str) -> None:
        gpus = nv.sample(TaskTree(os.getpid()))  # this script and its load are "the task"
        named = [p.text() for p in judge_gpus({"this host": [gpus]}).problems]
        samples.append({"phase": phase, "t": round(time.time(), 1), "gpus": gpus, "named": named})
        if not args.json:
            for g in gpus:
                print(phase, " ".join(f"{k}={g.get(k)}" for k in ("index", *FIELDS) if k in g), flush=True)

    for _ in range(3):
        sample("idle")
        time.sleep(1)
    child = None
    if args.load == "torch":
        child = subprocess.Popen([sys.executable, "-c", LOAD, str(args.size), str(args.seconds)])
    try:
        end = time.time() + args.seconds
        while time.time() < end:
            time.sleep(1)
            sample("load")
    finally:
        if child is not None:
            child.wait(timeout=args.seconds + 60)
    for _ in range(3):
        time.sleep(1)
        sample("after")
    nv.close()
    if args.json:
        print(json.dumps({"samples": samples}))
    else:
        loaded = [s for s in samples if s["phase"] == "load"]
        named = sorted({d for s in loaded for d in s["named"]})
        print("\nunder load, tfcluster would name:", "; ".join(named) or "nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
