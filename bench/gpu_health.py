#!/usr/bin/env python3
"""What tfcluster's heartbeats read from NVML on this host, idle, under a GPU load and with a GPU shared,
and what tfcluster's judgement names: one command to check the GPU-health path on a GPU host (this
project's machines have no GPU; TensorFlow is not needed).

    python bench/gpu_health.py [--seconds 20] [--load torch|none] [--size 8192] [--no-share] [--json]

Samples ``worker_entry.agent.nvml.Nvml().sample()`` — exactly what worker_entry puts in every heartbeat — once
per second: a few idle samples, ``--seconds`` under a load (``torch``: an fp16 matmul loop on every
visible GPU, in a child process), idle again, then (unless ``--no-share``) ``--seconds`` with two such
processes on GPU 0: the first counts as "the task", the second as another program. Prints per GPU the
SM clock against its maximum, the clock-event reasons, temperature, power against the enforced and the
board's default limit, memory, PCIe generation/width against their maximum, active NVLinks, ECC and XID
errors and the other programs' processes; each load process's matmuls/s; and what
``orchestrator.supervise.gpus`` names in each phase. On a healthy GPU: nothing under load (power cap is
normal), the shared GPU with the other process's PID and memory. docs/benchmarks.md ("GPU health") has
an H100's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LOAD = r"""
import json, sys, time, torch
n, seconds = int(sys.argv[1]), float(sys.argv[2])
devices = [int(d) for d in sys.argv[3].split(",")] if len(sys.argv) > 3 else range(torch.cuda.device_count())
xs = [torch.randn(n, n, device=f"cuda:{i}", dtype=torch.float16) for i in devices]
for x in xs:
    x @ x
torch.cuda.synchronize()
count, start = 0, time.time()
while time.time() < start + seconds:
    for x in xs:
        y = x @ x
    torch.cuda.synchronize()
    count += 1
print(json.dumps({"matmul_per_s": count / (time.time() - start)}), flush=True)
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


def load(size: int, seconds: float, devices: str | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-c", LOAD, str(size), str(seconds), *([devices] if devices else [])]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def rate(child: subprocess.Popen, timeout: float) -> float | None:
    out, _ = child.communicate(timeout=timeout)
    try:
        return round(float(json.loads(out.strip().splitlines()[-1])["matmul_per_s"]), 1)
    except (ValueError, IndexError, KeyError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds under load (and shared)")
    ap.add_argument("--load", choices=("torch", "none"), default="torch")
    ap.add_argument("--size", type=int, default=8192, help="matrix size of the load")
    ap.add_argument("--no-share", action="store_true", help="skip the phase with two processes on GPU 0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from orchestrator.supervise.gpus import judge_gpus
    from worker_entry.agent.gpuowner import TaskTree
    from worker_entry.agent.nvml import Nvml

    nv = Nvml()
    if not nv.available:
        print("no NVIDIA driver/NVML on this host: nothing to sample (run this on a GPU host)", file=sys.stderr)
        return 2
    print(json.dumps({"inventory": nv.inventory()}))
    samples: list[dict[str, Any]] = []
    task = [os.getpid()]  # whose processes are "the task": this script and its first load

    def sample(phase: str) -> None:
        t0 = time.perf_counter()
        gpus = nv.sample(TaskTree(*task))
        cost_ms = (time.perf_counter() - t0) * 1000
        named = [p.text() for p in judge_gpus({"this host": [gpus]}).problems]
        samples.append(
            {"phase": phase, "t": round(time.time(), 1), "gpus": gpus, "named": named, "ms": round(cost_ms, 2)}
        )
        if not args.json:
            for g in gpus:
                print(phase, " ".join(f"{k}={g.get(k)}" for k in ("index", *FIELDS) if k in g), flush=True)

    def phase(name: str, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(1)
            sample(name)

    for _ in range(3):
        sample("idle")
        time.sleep(1)
    rates: dict[str, Any] = {}
    if args.load == "torch":
        alone = load(args.size, args.seconds)
        phase("load", args.seconds)
        rates["alone"] = rate(alone, args.seconds + 120)
    phase("after", 3)
    if args.load == "torch" and not args.no_share:
        first, second = load(args.size, args.seconds, "0"), load(args.size, args.seconds, "0")
        task[:] = [first.pid]  # the task is the first load; the second is "another program" on its GPU 0
        phase("shared", args.seconds)
        rates["shared"] = [rate(first, args.seconds + 120), rate(second, args.seconds + 120)]
        rates["other_pid"] = second.pid
    nv.close()
    costs = sorted(s["ms"] for s in samples)
    summary = {
        "rates": rates,
        "sample_ms_median": costs[len(costs) // 2] if costs else None,
        "named": {
            p: sorted({d for s in samples if s["phase"] == p for d in s["named"]})
            for p in ("idle", "load", "after", "shared")
        },
    }
    if args.json:
        print(json.dumps({"samples": samples, **summary}))
        return 0
    print(f"\none sample of every GPU took {summary['sample_ms_median']} ms (median)")
    if rates.get("alone") is not None:
        print(f"one load process alone: {rates['alone']} matmuls/s")
    if rates.get("shared"):
        print(
            f"two load processes on GPU 0: {rates['shared']} matmuls/s (the second, PID {rates['other_pid']}, is 'another program')"
        )
    for name, named in summary["named"].items():
        print(f"{name}: tfcluster would name:", "; ".join(named) or "nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
