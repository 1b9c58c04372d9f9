"""The scaling model of `tfcluster predict`: a step at N workers from measured inputs. Pure.

    step(n) = own + wait(n) + allreduce(n)
    allreduce(n) = packs · 2(n-1) · alpha  +  2(n-1)/n · S / B         (ring; 0 at one worker)
    wait(n) = sigma · g(n)                                               (straggler allowance)

``own``: a worker's own work per step (the step clock's ``pre_collective_ms``: everything outside the
collectives), which weak scaling keeps (same per-worker batch); ``S``: the gradient bytes one step
all-reduces, as the strategy sees them (``grad_bytes``), in ``packs`` all-reduces
(``CommunicationOptions.bytes_per_pack``: each pack a ring of its own, so each pays the latency);
``alpha``/``B``: the per-hop latency and the slowest link's bandwidth (`tfcluster check`, or given). The
bandwidth term is nccl-tests' ring all-reduce (doc/PERFORMANCE.md: ``t = S/B · 2(n-1)/n``, so
``busbw = algbw · 2(n-1)/n`` = B); the latency term is the ring's 2(n-1) sequential hops.
``g(n)``: the expected maximum of n standard normal draws less their median — every step waits for
the slowest worker's own work; ``sigma``: the per-step spread of that work, fitted to the wait measured
at a size > 1, or from the spread of one worker's windows.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, replace
from statistics import NormalDist

#: Per-worker batch multipliers the advice tries (own work and its spread scale with the batch).
BATCH_FACTORS = (2, 4, 8, 16)
#: The efficiency the advice aims at.
TARGET_EFFICIENCY = 0.8
#: Above this share of a step the all-reduce is what the advice is about.
COMM_SHARE = 0.3


@dataclass(frozen=True)
class Network:
    """alpha (seconds per ring hop) and B (bytes/s of the slowest link), and where they come from."""

    latency_s: float
    bandwidth_Bps: float
    source: str = "given"


@dataclass(frozen=True)
class Inputs:
    """What the model starts from, every figure measured (``source`` says where)."""

    own_ms: float  # a worker's own work per step (median worker)
    sigma_ms: float  # per-step spread of a worker's own work
    grad_bytes: int
    packs: int = 1
    per_worker_batch: float | None = None
    implementation: str = "auto"
    measured_workers: int = 1
    sources: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=4096)
def expected_max_excess(n: int) -> float:
    """E[max of n standard normals] - their median (0 at n = 1), by numerical integration
    (E[max] = ∫ x · n · φ(x) · Φ(x)^(n-1) dx; the median of the draws is 0 for a symmetric law)."""
    if n <= 1:
        return 0.0
    nd = NormalDist()
    steps = 4000
    lo, hi = -8.0, 8.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        w = 0.5 if i in (0, steps) else 1.0
        total += w * x * n * nd.pdf(x) * nd.cdf(x) ** (n - 1)
    return total * h


def ring_allreduce_s(n: int, nbytes: float, net: Network, packs: int = 1) -> float:
    """Seconds of one step's ring all-reduce of ``nbytes`` over ``n`` workers in ``packs`` packs."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return max(1, packs) * 2 * (n - 1) * net.latency_s + 2 * (n - 1) / n * nbytes / net.bandwidth_Bps


def fit_allreduce(rounds: list[dict], links: Network) -> Network | None:
    """alpha and B as TensorFlow's own all-reduce measured them (`tfcluster check`'s rounds: ``bytes``,
    ``latency_s``, ``ranks``), or None with fewer than two sizes at one rank count >= 2. A least-squares line
    t = a + b·S through the rounds gives a = 2(n-1)·alpha and b = 2(n-1)/n / B. On busy CPUs the ring's
    copies, reductions and gRPC threads wait for a core too: the links alone predicted 119 ms where the
    all-reduce took 202 ms (issue 32); the rounds measure that wait, the links cannot."""
    pts = [
        (int(r["ranks"]), float(r["bytes"]), float(r["latency_s"]))
        for r in rounds
        if isinstance(r, dict) and all(isinstance(r.get(k), int | float) for k in ("ranks", "bytes", "latency_s"))
    ]
    n = max((p[0] for p in pts), default=0)
    xs = [(b, t) for r, b, t in pts if r == n and b > 0 and t > 0 and math.isfinite(t)]
    if n < 2 or len({b for b, _ in xs}) < 2:
        return None
    mb, mt = sum(b for b, _ in xs) / len(xs), sum(t for _, t in xs) / len(xs)
    slope = sum((b - mb) * (t - mt) for b, t in xs) / sum((b - mb) ** 2 for b, _ in xs)
    if slope <= 0:
        return None
    a = max(0.0, mt - slope * mb)
    sizes = ", ".join(f"{b / 1024:,.0f} KiB {t * 1e3:.1f} ms" for b, t in sorted(xs))
    return Network(
        latency_s=max(links.latency_s, a / (2 * (n - 1))),
        bandwidth_Bps=min(links.bandwidth_Bps, 2 * (n - 1) / n / slope),
        source=f"{links.source.split(' (')[0]} (TensorFlow's all-reduce measured at {n} ranks: {sizes})",
    )


def bus_bandwidth(n: int, nbytes: float, seconds: float) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw · 2(n-1)/n (bytes/s)."""
    return nbytes / seconds * 2 * (n - 1) / n


def predict_size(inp: Inputs, net: Network, n: int, batch_factor: float = 1.0) -> dict[str, float | int | None]:
    """One size: step time split into own work / wait / all-reduce, examples/s, speed-up and
    efficiency against one worker (whose step is its own work alone)."""
    own = inp.own_ms * batch_factor
    wait = inp.sigma_ms * batch_factor * expected_max_excess(n)
    ar = ring_allreduce_s(n, inp.grad_bytes, net, inp.packs) * 1e3
    step = own + wait + ar
    eff = own / step if step > 0 else None
    batch = inp.per_worker_batch * batch_factor if inp.per_worker_batch else None
    return {
        "workers": n,
        "step_ms": round(step, 3),
        "own_ms": round(own, 3),
        "waiting_for_slowest_ms": round(wait, 3),
        "allreduce_ms": round(ar, 3),
        "allreduce_share": round(ar / step, 3) if step > 0 else None,
        "examples_per_s": round(n * batch / step * 1e3, 1) if batch and step > 0 else None,
        "steps_per_s": round(1e3 / step, 3) if step > 0 else None,
        "speedup": round(n * eff, 3) if eff is not None else None,
        "efficiency": round(eff, 3) if eff is not None else None,
    }


def predict(inp: Inputs, net: Network, sizes: list[int]) -> list[dict[str, float | int | None]]:
    return [predict_size(inp, net, n) for n in sizes]


def advice(inp: Inputs, net: Network, sizes: list[dict[str, float | int | None]]) -> list[str]:
    """What the model implies, each line computed from it: for the largest size where the all-reduce
    dominates, the per-worker batch (and the link) that would bring efficiency up."""
    out: list[str] = []
    comm = [s for s in sizes if (s.get("allreduce_share") or 0) > COMM_SHARE]
    if comm:
        s = comm[-1]
        n, eff = int(s["workers"]), float(s["efficiency"] or 0)
        line = f"at {n} workers the all-reduce is {float(s['allreduce_share'] or 0):.0%} of a step"
        for k in BATCH_FACTORS:
            better = predict_size(inp, net, n, batch_factor=k)
            if (better["efficiency"] or 0) >= TARGET_EFFICIENCY or k == BATCH_FACTORS[-1]:
                line += (
                    f": a {k}x larger per-worker batch would bring efficiency from {eff:.0%} to "
                    f"{float(better['efficiency'] or 0):.0%}"
                )
                break
        faster = replace(net, bandwidth_Bps=net.bandwidth_Bps * 4)
        line += f"; a 4x faster slowest link, to {float(predict_size(inp, faster, n)['efficiency'] or 0):.0%}"
        out.append(line)
        lat = max(1, inp.packs) * 2 * (n - 1) * net.latency_s * 1e3
        if inp.packs > 1 and lat > 0.2 * float(s["allreduce_ms"] or 0):
            out.append(
                f"at {n} workers {inp.packs} packs pay the ring latency {inp.packs} times ({lat:.1f} ms): "
                "a larger CommunicationOptions.bytes_per_pack (or 0: one pack) saves most of it"
            )
    waits = [s for s in sizes if s["step_ms"] and float(s["waiting_for_slowest_ms"] or 0) > 0.2 * float(s["step_ms"])]
    if waits:
        s = waits[-1]
        out.append(
            f"at {s['workers']} workers waiting for the slowest worker is {float(s['waiting_for_slowest_ms'] or 0) / float(s['step_ms'] or 1):.0%} "
            "of a step (the measured spread of the workers' own work): even out the input and the hosts first"
        )
    if not out and sizes:
        top = sizes[-1]
        out.append(
            f"scales well up to {top['workers']} workers: own work dominates every step "
            f"(efficiency {float(top['efficiency'] or 0):.0%})"
        )
    return out


# ------------------------------------------------------------------------------------ --network

_RATE = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "tbit": 1e12 / 8,
    "b/s": 1,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "bps": 1 / 8,
    "kbps": 1e3 / 8,
    "mbps": 1e6 / 8,
    "gbps": 1e9 / 8,
}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_network(text: str) -> Network:
    """``25Gbit,5us`` (rate: bit, kbit, Mbit, Gbit, Tbit, or B/s, KB/s, MB/s, GB/s; latency: ns, us,
    ms, s) → Network; ValueError naming what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"--network {text!r}: expected RATE,LATENCY like 25Gbit,5us")
    rate_m = re.fullmatch(r"([0-9.]+(?:e[+-]?\d+)?)\s*([a-zA-Zµ/]+)", parts[0])
    lat_m = re.fullmatch(r"([0-9.]+(?:e[+-]?\d+)?)\s*([a-zA-Zµ]+)", parts[1])
    if not rate_m or rate_m.group(2).lower() not in _RATE:
        raise ValueError(
            f"--network {text!r}: rate {parts[0]!r}: a number and one of bit, kbit, Mbit, Gbit, Tbit, "
            "B/s, KB/s, MB/s, GB/s"
        )
    if not lat_m or lat_m.group(2).lower() not in _TIME:
        raise ValueError(f"--network {text!r}: latency {parts[1]!r}: a number and one of ns, us, ms, s")
    rate = float(rate_m.group(1)) * _RATE[rate_m.group(2).lower()]
    lat = float(lat_m.group(1)) * _TIME[lat_m.group(2).lower()]
    if not (rate > 0 and math.isfinite(rate)) or not (lat >= 0 and math.isfinite(lat)):
        raise ValueError(f"--network {text!r}: the rate must be > 0 and the latency >= 0")
    return Network(latency_s=lat, bandwidth_Bps=rate, source=f"--network {text}")
