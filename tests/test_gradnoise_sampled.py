"""The gradient noise scale's norms on every k-th step only (``TFCLUSTER_GRADNOISE_EVERY``, issue 30's
≤ 1 % of a step): the rows of the other steps carry no norms (-1) and are skipped — never read as 0 —,
a sampled run's estimate is the unsampled estimator's on the same steps (each sample decayed as k steps
are), its standard error reflects the fewer samples, and the graph takes the norms on executions 0, k,
2k, ... of each all-reduce (real TensorFlow, in process)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.views import noise_scale as ns
from worker_entry.instrument.stepclock import gradnorms
from worker_entry.instrument.stepclock.ring import RUN, Row
from worker_entry.instrument.stepclock.timeline import StepSplit, Timeline, noise
from worker_entry.protocol import GradNoise, ProtocolError

K = 8


def per_step(g, cov, workers=2, local=2, b=16, steps=4000, seed=0):
    """Per worker, per local replica, one StepSplit per step with its (|g_i|², |R/d|²): per-example gradients
    ~ N(G, Σ), each replica the mean of b, the all-reduce the mean of the N replicas (the loss scaled by 1/N)."""
    rng = np.random.default_rng(seed)
    chol = np.linalg.cholesky(cov)
    n = workers * local
    out = [[[] for _ in range(local)] for _ in range(workers)]
    for _ in range(steps):
        replica = (g + rng.standard_normal((n, b, len(g))) @ chol.T).mean(axis=1) / n
        total = float(np.sum((replica.sum(axis=0) / n) ** 2))
        for w in range(workers):
            for r in range(local):
                sq = (float(np.sum(replica[w * local + r] ** 2)), total)
                out[w][r].append(StepSplit(1, 0.0, 1.0, {}, examples=b * n / local, sq=sq))
    return out


def records(steps, window, every, keep=lambda i: True):
    """Each worker's profile records, one per ``window`` steps, of the steps ``keep`` admits."""
    out = {}
    n = sum(len(w) for w in steps)
    for w, replicas in enumerate(steps):
        recs = []
        for start in range(0, len(replicas[0]), window):
            win = [[s for i, s in enumerate(r[start : start + window], start) if keep(i)] for r in replicas]
            rec = noise(win)
            if rec is None:
                continue
            rec.update(replicas=n, step=start + window, every=every)
            GradNoise.from_dict(rec)  # what the protocol accepts
            recs.append({"ts": float(start), "noise": rec})
        out[f"worker:{w}"] = recs
    return out


def masked(steps, k):
    """The steps with the norms of all but every k-th removed (sq None), as the reader sees them."""
    return [
        [
            [
                s if i % k == 0 else StepSplit(s.fn, s.end, s.step_ms, s.parts, examples=s.examples)
                for i, s in enumerate(r)
            ]
            for r in w
        ]
        for w in steps
    ]


def problem(d=12, seed=1):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(d) * 0.3
    a = rng.standard_normal((d, d)) / np.sqrt(d)
    cov = a @ a.T + np.diag(rng.uniform(0.1, 1.0, d))
    return g, cov, float(np.trace(cov) / np.sum(g**2))


def test_rows_without_norms_are_skipped_not_read_as_zero():
    tl = Timeline(lambda fn: frozenset({0}), lambda fn: True)
    rows = []
    for i in range(16):  # norms on steps 0 and 8 only, as the graph writes them with k = 8
        sq = (4.0 + i, 1.0 + i / 8) if i % K == 0 else (-1.0, -1.0)
        rows.append(Row(0, RUN, 1, 1, i, i + 0.1, i + 0.3, ((0, i + 0.15, i + 0.2),), 32.0, *sq))
    steps = tl.feed(rows)
    assert [i for i, s in enumerate(steps) if s.sq is not None] == [0, 8]
    assert not any(s.sq_bad for s in steps)  # a step not sampled is not a non-finite one
    rec = noise([steps])
    assert rec["local_sq"] == (4.0 + 12.0) / 2 and rec["total_sq"] == (1.0 + 2.0) / 2  # zeros would halve it
    assert rec["steps"] == 2 and rec["nonfinite"] == 0 and rec["batch"] == 32.0
    assert rec == noise([[s for s in steps if s.sq is not None]])  # the window is its sampled steps
    # two local replicas, one of whose windows ended before the sampled step the other took: still two
    # replicas (the batch of a step is both replicas' examples), the samples taken as they are
    other = steps[:8]
    two = noise([steps, other])
    assert two["batch"] == 64.0 and two["steps"] == 1 and two["local_sq"] == (4.0 + 12.0 + 4.0) / 3
    assert noise([[s for s in steps if s.sq is None]]) is None  # a window without a sampled step: no record


def test_a_sampled_runs_estimate_is_the_unsampled_estimator_on_the_same_steps():
    g, cov, truth = problem()
    steps = per_step(g, cov, steps=4000)
    window = 200
    sampled_recs = records(masked(steps, K), window, every=K)
    subset = records(steps, window, every=1, keep=lambda i: i % K == 0)  # the same steps, no others
    # the node's windows: the same means, (co)variances, steps and batch — only ``every`` differs
    for task in subset:
        for a, b in zip(sampled_recs[task], subset[task], strict=True):
            assert {**a["noise"], "every": 1} == b["noise"]
            assert a["noise"]["steps"] == window // K
    # the launcher: the same smoothing of the same samples, each decayed as K steps (d^K per sample)
    one, other = ns.Smoothed(), ns.Smoothed(ns.DECAY**K)
    for r in ns.rounds(sampled_recs):
        assert r.every == K
        one.add(r)
    for r in ns.rounds(subset):
        other.add(r)
    a, b = one.estimate(), other.estimate()
    for key in ("g2", "tr_sigma", "g2_se", "tr_se", "b_simple", "stderr"):
        assert a[key] == pytest.approx(b[key], rel=1e-9), key
    # against every step's norms: the same quantity, and a standard error ~sqrt(K) wider
    out, full = ns.noise_scale(sampled_recs), ns.noise_scale(records(steps, window, every=1))
    assert out["every"] == K and full["every"] == 1 and out["steps"] == 4000 // K and full["steps"] == 4000
    assert abs(out["b_simple"] - truth) < 4 * out["stderr"], (out, truth)
    assert abs(out["b_simple"] - full["b_simple"]) < 4 * out["stderr"]
    assert 0.6 * np.sqrt(K) < out["stderr"] / full["stderr"] < 1.6 * np.sqrt(K), (out["stderr"], full["stderr"])
    text = "\n".join(ns.noise_lines(ns.noise_report(sampled_recs)))
    assert f"{4000 // K} steps sampled, 1 in {K}" in text, text


def test_windows_with_one_sampled_step_take_the_pooled_variance():
    """Windows of 12 steps at k = 8 hold one or two sampled steps: with one replica per worker (as on the
    bed) a window with one has no variance of its own; the standard error is still given (its steps take
    the pooled per-step variances) and honest."""
    g, cov, truth = problem(seed=2)
    hits = 0
    for seed in range(6):
        recs = records(masked(per_step(g, cov, workers=3, local=1, steps=1200, seed=seed), K), 12, every=K)
        lone = [r for rs in recs.values() for r in rs if "var_local" not in r["noise"]]
        assert lone, "some windows have a single sampled step"
        out = ns.noise_scale(recs)
        assert out["b_simple"] is not None and out["stderr"] is not None and out["stderr"] > 0, out
        hits += abs(out["b_simple"] - truth) < 2 * out["stderr"]
    assert hits >= 4, hits  # ~95 % coverage expected; 4 of 6 leaves room for chance


def test_the_sampling_period_from_the_environment_and_the_protocol():
    assert gradnorms.every({}) == gradnorms.DEFAULT_EVERY == 8
    assert gradnorms.every({"TFCLUSTER_GRADNOISE_EVERY": " 1 "}) == 1
    assert gradnorms.every({"TFCLUSTER_GRADNOISE_EVERY": "64"}) == 64
    for bad in ("0", "-3", "x", "2.5", str(1 << 20)):
        assert gradnorms.every({"TFCLUSTER_GRADNOISE_EVERY": bad}) == gradnorms.DEFAULT_EVERY, bad
    ok = {"steps": 3, "replicas": 2, "local_sq": 1.0, "total_sq": 0.5}
    assert GradNoise.from_dict(ok).every == 1  # a node before sampling: every step
    assert GradNoise.from_dict({**ok, "every": 8}).every == 8
    for bad in (0, -1, 1 << 20):
        with pytest.raises(ProtocolError):
            GradNoise.from_dict({**ok, "every": bad})


def test_the_graph_takes_the_norms_on_executions_0_k_2k_of_each_all_reduce(monkeypatch):
    tf = pytest.importorskip("tensorflow")
    monkeypatch.setenv("TFCLUSTER_GRADNOISE_EVERY", "3")
    x, y = tf.constant([1.0, 2.0, 2.0]), tf.constant([3.0, 0.0, 4.0])  # |x|² = 9, |y|² = 25

    @tf.function
    def step():
        return gradnorms.norms(tf, [("/cpu:0", x, y)], 5, (990001, 0, 0))  # group 5: |y/5|² = 1

    got = [tuple(float(v) for v in step()) for _ in range(7)]
    assert got == [(9.0, 1.0) if i % 3 == 0 else (-1.0, -1.0) for i in range(7)], got
    assert gradnorms.traced_every() == 3

    @tf.function
    def both(a, b):
        return gradnorms.add(tf, [a, b])

    f64 = lambda *v: tuple(tf.constant(u, tf.float64) for u in v)  # noqa: E731
    assert [float(v) for v in both(f64(2.0, 1.0), f64(3.0, 1.0))] == [5.0, 2.0]
    assert [float(v) for v in both(f64(2.0, 1.0), f64(-1.0, -1.0))] == [-1.0, -1.0]  # a step whole or not at all
    assert [float(v) for v in both(f64(-1.0, -1.0), f64(-1.0, -1.0))] == [-1.0, -1.0]
    monkeypatch.setenv("TFCLUSTER_GRADNOISE_EVERY", "1")

    @tf.function
    def every_step():
        return gradnorms.norms(tf, [("/cpu:0", x, y)], 5, (990002, 0, 0))

    assert [tuple(float(v) for v in every_step()) for _ in range(3)] == [(9.0, 1.0)] * 3
