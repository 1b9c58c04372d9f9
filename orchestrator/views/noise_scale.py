"""The gradient noise scale of a run and what it implies for more workers: statistical efficiency. Pure.

Each worker's step-clock window carries, per step, S = the mean over its replicas of |g_i|² (a replica's
gradient, batch b) and T = |R/d|² (the reduced gradient, batch N·b, on the same scale), as means over the
window (``protocol.GradNoise``). From E|g_B|² = |G|² + tr(Σ)/B (McCandlish et al. 2018, "An Empirical
Model of Large-Batch Training", appendix A):

    |G|² ≈ (N·T - S) / (N - 1)        tr(Σ) ≈ N·b·(S - T) / (N - 1)        B_simple = tr(Σ) / |G|²

Both estimates are unbiased and linear in S and T, so a window's mean gives them over its steps. The
numerator and the denominator are smoothed apart — bias-corrected exponential moving averages over steps
(decay ``DECAY`` per step, as Pollux/AdaptDL does, Qiao et al. OSDI '21) — and only then divided: the
ratio of two noisy means, never a mean of noisy ratios. The standard error comes from the windows'
per-step (co)variances, carried through the same weights and the delta method; the workers' windows of a
round are averaged (each worker's estimate is unbiased on its own: no extra communication), their
variance taken as one worker's (the workers share T: conservative).

What it means: B_simple approximates the critical batch B_crit of the empirical model: steps to a loss
S(B) ≈ S_min·(1 + B_noise/B), so the statistical efficiency of a global batch M against M₀ is
E(M) = (B + M₀)/(B + M) and the steps to the same loss at M are (1 + B/M)/(1 + B/M₀) times those at M₀.
B_simple assumes an isotropic Hessian and usually overestimates B_noise; the predictions are therefore
bounds: **at least** that many steps, never a promise (docs/benchmarks.md measures where they mislead).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker_entry.protocol.training import adaptive

from .lossmodel import NoiseScale

#: Pollux's per-step decay of the moving averages (a memory of ~1000 steps).
DECAY = 0.999
#: Standard errors for "distinguishable from zero" (≈95 %).
Z = 2.0
MAX_WINDOWS = 400  # windows kept in --json (evenly thinned past this)
ONE_REPLICA = "one replica in all: the noise scale needs two batch sizes — measure at 2 or more replicas"


@dataclass(frozen=True)
class Round:
    """The workers' windows of one round, averaged: per step |G|², tr(Σ) and their (co)variances."""

    ts: float
    step: int | None
    steps: float
    replicas: int
    batch: float | None
    g2: float
    tr: float | None
    var_g2: float | None
    var_tr: float | None
    cov: float | None
    loss: float | None
    every: int = 1  # the norms on every k-th step: ``steps`` counts the sampled ones


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def window_terms(noise: Mapping[str, Any]) -> dict[str, float | None] | None:
    """One worker's window → per-step |G|², tr(Σ) (examples of the global batch: None when the batch is
    unknown) and their per-step (co)variances; None with one replica (no second batch size)."""
    n, s, t = _num(noise.get("replicas")), _num(noise.get("local_sq")), _num(noise.get("total_sq"))
    if n is None or s is None or t is None or n < 2:
        return None
    k = n - 1
    batch = _num(noise.get("batch"))
    vs, vt, c = _num(noise.get("var_local")), _num(noise.get("var_total")), _num(noise.get("cov"))
    out: dict[str, float | None] = {"g2": (n * t - s) / k, "tr": None, "var_g2": None, "var_tr": None, "cov": None}
    if batch:
        out["tr"] = batch * (s - t) / k
    if vs is not None and vt is not None and c is not None:
        out["var_g2"] = max(0.0, (n * n * vt + vs - 2 * n * c) / (k * k))
        if batch:
            out["var_tr"] = max(0.0, batch * batch * (vs + vt - 2 * c) / (k * k))
            out["cov"] = batch * ((n + 1) * c - n * vt - vs) / (k * k)
    return out


def _measured(windows: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], dict[str, float | None]]]:
    """One worker's windows that carry gradient norms, each with its per-step terms."""
    out = []
    for w in windows:
        terms = window_terms(w["noise"]) if isinstance(w.get("noise"), Mapping) else None
        if terms is not None:
            out.append((w, terms))
    return out


def rounds(windows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Round]:
    """The k-th window of every worker (their profile records' ``noise``, in order) as round k.

    A round's ``steps`` is its windows' steps summed over the workers that measured any, so the rounds'
    steps add up to the steps one worker measured (their mean). Each worker closes its windows on its
    own clock: when one splits the same steps into one window more than another, the averaging over only
    the workers present in a round counted the extra round's steps twice (CI saw 202 sampled steps of
    200)."""
    per_task = [_measured(ws) for ws in windows.values()]
    measured = sum(1 for ws in per_task if ws)
    out = []
    for k in range(max((len(ws) for ws in per_task), default=0)):
        here = [ws[k] for ws in per_task if k < len(ws)]  # never empty: k is below the longest list
        weights = [float(w["noise"].get("steps") or 1) for w, _ in here]
        total = sum(weights)

        def mean(key: str, here=here, weights=weights, total=total) -> float | None:
            vals = [terms[key] for _, terms in here]
            if any(v is None for v in vals):
                return None
            return sum(wt * v for wt, v in zip(weights, vals, strict=True)) / total  # type: ignore[operator]

        nz = [w["noise"] for w, _ in here]
        losses = [x for x in (_num(z.get("loss")) for z in nz) if x is not None]
        batches = [x for x in (_num(z.get("batch")) for z in nz) if x is not None]
        out.append(
            Round(
                ts=max(_num(w.get("ts")) or 0.0 for w, _ in here),
                step=max((int(z["step"]) for z in nz if isinstance(z.get("step"), int)), default=None),
                steps=total / measured,
                replicas=int(max(z.get("replicas") or 1 for z in nz)),
                batch=sum(batches) / len(batches) if batches else None,
                g2=mean("g2") or 0.0,
                tr=mean("tr"),
                var_g2=mean("var_g2"),
                var_tr=mean("var_tr"),
                cov=mean("cov"),
                loss=sum(losses) / len(losses) if losses else None,
                every=int(max(z.get("every") or 1 for z in nz)),
            )
        )
    return out


class Smoothed:
    """Bias-corrected exponential moving averages over steps of |G|² and tr(Σ), apart, and the variance
    of each average (Σ w² s² / (Σw)²) from the rounds' per-step variances.

    Norms taken on every k-th step only (``Round.every``): each sampled step weighs what k steps would
    (decay d^k per sample: the same memory in training steps), and the variance counts the samples, not
    the steps — fewer samples, a wider standard error. A round with one sampled step has no variance of
    its own: its steps take the per-step (co)variances pooled over the rounds that have one."""

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self.w1 = 0.0  # Σw (= 1 - decay^steps: the bias correction)
        self.m_g2 = self.m_tr = 0.0  # Σ w·x
        self.v_g2 = self.v_tr = self.v_cov = 0.0  # Σ w²·s²
        self.w2_pooled = 0.0  # Σ w² of the steps whose (co)variances are the pooled ones
        self.pool = [0.0, 0.0, 0.0, 0.0]  # Σ n·s² of g2, tr, cov over the rounds with variances, Σ n
        self.steps = 0.0

    def add(self, r: Round) -> None:
        n, d = max(1.0, r.steps), self.decay ** max(1, r.every)
        keep, keep2 = d**n, d ** (2 * n)
        new = 1.0 - keep
        new2 = (1 - d) ** 2 * (1 - keep2) / (1 - d * d)  # Σ w² of the round's n steps
        self.w1 = keep * self.w1 + new
        self.m_g2 = keep * self.m_g2 + new * r.g2
        self.m_tr = keep * self.m_tr + new * (r.tr or 0.0)
        self.v_g2, self.v_tr, self.v_cov = keep2 * self.v_g2, keep2 * self.v_tr, keep2 * self.v_cov
        self.w2_pooled *= keep2
        if r.var_g2 is None or r.var_tr is None or r.cov is None:
            self.w2_pooled += new2
        else:
            self.v_g2 += new2 * r.var_g2
            self.v_tr += new2 * r.var_tr
            self.v_cov += new2 * r.cov
            self.pool = [a + n * b for a, b in zip(self.pool, (r.var_g2, r.var_tr, r.cov, 1.0), strict=True)]
        self.steps += r.steps

    def estimate(self) -> dict[str, float | None]:
        """|G|², tr(Σ), their standard errors, B_simple and its standard error (delta method)."""
        w = self.w1 or 1.0
        g2, tr = self.m_g2 / w, self.m_tr / w
        out: dict[str, float | None] = {"g2": g2, "tr_sigma": tr, "g2_se": None, "tr_se": None}
        out["b_simple"] = tr / g2 if g2 > 0 else None
        out["stderr"] = None
        if self.pool[3] > 0:  # some round had (co)variances: the others' steps take their pooled values
            pg, pt, pc = (x / self.pool[3] * self.w2_pooled for x in self.pool[:3])
            vg, vt, cv = (self.v_g2 + pg) / w**2, (self.v_tr + pt) / w**2, (self.v_cov + pc) / w**2
            out["g2_se"], out["tr_se"] = math.sqrt(vg), math.sqrt(vt)
            if g2 > 0 and tr > 0:
                rel = vt / tr**2 + vg / g2**2 - 2 * cv / (tr * g2)
                out["stderr"] = (tr / g2) * math.sqrt(max(0.0, rel))
        return out


def noise_scale(windows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """``report --json``'s ``noise_scale``: B_simple now (the smoothed estimate at the last window), its
    standard error, the global batch, the steps measured, the windows; ``b_simple`` None with ``reason``
    (and ``at_least`` when |G|² is not distinguishable from 0: the job is far below its critical batch)."""
    rs = rounds(windows)
    out: dict[str, Any] = {"b_simple": None, "stderr": None, "global_batch": None, "steps": 0, "windows": []}
    records = [w["noise"] for ws in windows.values() for w in ws if isinstance(w.get("noise"), Mapping)]
    if not records:
        solo = any(w.get("grad_bytes") is not None for ws in windows.values() for w in ws)
        out["reason"] = (
            ONE_REPLICA + " (TensorFlow does not all-reduce at one replica)"
            if solo
            else "no gradient norms were recorded: the step clock measures them at MWMS's gradient all-reduce "
            "(a multi-worker MultiWorkerMirroredStrategy, steps in a tf.function, heartbeat.profile_interval_s > 0)"
        )
        return out
    optimizer = next((z.get("optimizer") for z in records if z.get("optimizer")), None)
    out.update(_notes(records, optimizer))
    if not rs:
        out["reason"] = ONE_REPLICA
        return out
    smooth = Smoothed()
    for r in rs:
        smooth.add(r)
        est = smooth.estimate()
        out["windows"].append(
            {
                "ts": round(r.ts, 3),
                "step": r.step,
                "loss": r.loss,
                "b_simple": _round(est["b_simple"]),
                "stderr": _round(est["stderr"]),
                "g2": r.g2,
                "tr_sigma": r.tr,
            }
        )
    out["windows"] = _thin(out["windows"])
    est = smooth.estimate()
    batches = [r.batch for r in rs if r.batch]
    out.update(
        global_batch=round(sum(batches) / len(batches), 1) if batches else None,
        steps=round(smooth.steps),
        every=max(r.every for r in rs),
        replicas=max(r.replicas for r in rs),
        g2=est["g2"],
        g2_se=est["g2_se"],
        tr_sigma=est["tr_sigma"],
        tr_se=est["tr_se"],
        loss=next((r.loss for r in reversed(rs) if r.loss is not None), None),
    )
    out.update(_verdict(est, out["global_batch"]))
    return out


def _verdict(est: Mapping[str, float | None], batch: float | None) -> dict[str, Any]:
    g2, tr, g_se, tr_se = est["g2"] or 0.0, est["tr_sigma"] or 0.0, est["g2_se"], est["tr_se"]
    if batch is None:
        return {"reason": "the examples per step are unknown (no batch dimension the step clock could read)"}
    if g_se is None or tr_se is None:
        return {"b_simple": _round(est["b_simple"]), "stderr": None}
    if tr - Z * tr_se <= 0 < tr + Z * tr_se or tr <= 0:
        return {
            "reason": "tr(Σ) is not distinguishable from 0: the replicas' gradients agree — do all replicas train on "
            "the same examples (a dataset not sharded), or couple them (SyncBatchNormalization)?",
        }
    if g2 - Z * g_se <= 0:
        upper = g2 + Z * g_se
        at_least = tr / upper if upper > 0 else None
        return {
            "reason": f"|G|² is not distinguishable from 0 ({g2:.3g} ± {g_se:.3g}): the gradient's noise swamps its "
            "signal at this batch — the job is far below its critical batch"
            + (f": B_simple > {at_least:.0f}" if at_least else ""),
            "at_least": _round(at_least),
        }
    return {"b_simple": _round(est["b_simple"]), "stderr": _round(est["stderr"])}


def _notes(records: Sequence[Mapping[str, Any]], optimizer: str | None) -> dict[str, Any]:
    """What the estimate is of: plain or preconditioned, dense gradients, skipped steps."""
    notes = []
    if adaptive(optimizer):
        notes.append(
            f"{optimizer} preconditions each gradient by its second moment: this is the plain noise scale of the raw "
            "gradients, not the preconditioned one its updates follow (which can be smaller)"
        )
    sparse = max(int(z.get("sparse") or 0) for z in records)
    if sparse:
        notes.append(f"{sparse} IndexedSlices gradient(s) per step (embeddings) left out: dense gradients only")
    skipped = sum(int(z.get("nonfinite") or 0) for z in records)
    if skipped:
        notes.append(f"{skipped} step(s) with a non-finite gradient norm left out (loss-scaling overflow?)")
    return {
        "optimizer": optimizer,
        "kind": "preconditioning not applied" if adaptive(optimizer) else "plain",
        "notes": notes,
    }


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def _thin(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(rows) <= MAX_WINDOWS:
        return rows
    step = len(rows) / MAX_WINDOWS
    return [rows[int(i * step)] for i in range(MAX_WINDOWS - 1)] + [rows[-1]]


# ------------------------------------------------------------------------------ what it implies


def efficiency(b_simple: float, m0: float, m: float) -> float:
    """Statistical efficiency of a global batch ``m`` against ``m0``: E(M) = (B + M₀)/(B + M)."""
    return (b_simple + m0) / (b_simple + m)


def steps_ratio(b_simple: float, m0: float, m: float) -> float:
    """Steps to the same loss at ``m`` over steps at ``m0``: (1 + B/M)/(1 + B/M₀) (a lower bound)."""
    return (1 + b_simple / m) / (1 + b_simple / m0)


def critical_workers(b_simple: float, per_worker_batch: float) -> float:
    """The workers whose global batch equals B_simple: past it each doubling cuts steps by < 1/3."""
    return b_simple / per_worker_batch


def best_workers(times: Iterable[tuple[int, float]]) -> tuple[int, bool]:
    """The worker count with the shortest predicted time to loss, and whether it is the largest tried
    (then time still falls there)."""
    ranked = sorted(times)
    best = min(ranked, key=lambda nt: (nt[1], nt[0]))
    return best[0], best[0] == ranked[-1][0]


def noise_report(windows: Mapping[str, Sequence[Mapping[str, Any]]]) -> NoiseScale:
    """``noise_scale`` as the report holds it (typed)."""
    return NoiseScale.of(noise_scale(windows))


def noise_lines(ns: NoiseScale) -> list[str]:
    """``report``'s text for the noise scale."""
    lines = ["gradient noise scale (McCandlish et al. 2018; an upper bound on the useful global batch):"]
    if ns.b_simple is not None:
        err = f" ± {ns.stderr:.0f}" if ns.stderr is not None else ""
        lines.append(
            f"  B_simple ≈ {ns.b_simple:.0f}{err} examples (global batch {_g(ns.global_batch)}, "
            f"{ns.replicas} replicas, {ns.steps} steps"
            + (f" sampled, 1 in {ns.every}" if ns.every > 1 else "")
            + (f", loss {ns.loss:.4g} at the last window" if ns.loss is not None else "")
            + ")"
        )
        gb = ns.global_batch
        if gb:
            e2 = efficiency(ns.b_simple, gb, 2 * gb)
            lines.append(
                f"  at twice the global batch ({2 * gb:.0f}) the steps to the same loss would be at least "
                f"{steps_ratio(ns.b_simple, gb, 2 * gb):.2f}x these (ideal 0.50x; statistical efficiency ≤ {e2:.0%}); "
                "B_simple grows as the loss falls"
            )
    else:
        lines.append(f"  not resolved: {ns.reason}")
    lines += [f"  note: {n}" for n in ns.notes]
    return lines


def _g(x: Any) -> str:
    return "?" if x is None else f"{x:g}"
