"""What one step all-reduces, read from the traced gradients by the step clock (real TensorFlow on
CPU): exact bytes of known models, hand-computed — Keras fit, a custom loop, IndexedSlices counted
apart, explicit packs, and a one-worker MWMS where TF reduces nothing but the step is still timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e  # launches TensorFlow


def _run(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCLUSTER_") and k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "workloads" / "grad_bytes_cases.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[0][7:])


DENSE_10_16_1 = (10 * 16 + 16 + 16 * 1 + 1) * 4  # 193 float32 parameters: 772 bytes, 4 tensors


def test_gradient_bytes_of_known_models_exactly():
    got = _run()
    for case in ("fit", "loop"):
        assert got[case]["grad_bytes"] == DENSE_10_16_1 and got[case]["grad_tensors"] == 4, got[case]
        assert got[case]["grad_packs"] == 1 and got[case]["grad_sparse"] == 0 and got[case]["bytes_per_pack"] == 0
    # Embedding(50, 4) → Flatten → Dense(40→1): the embedding's gradient is IndexedSlices (all-gathered)
    emb = got["loop embedding"]
    assert emb["grad_bytes"] == (40 + 1) * 4 and emb["grad_tensors"] == 2 and emb["grad_sparse"] == 1, emb
    # Dense 10→300→1 in float32 with bytes_per_pack=1000 — packed in reverse order: [4 + 1200 B], [1200 B],
    # [12000 B] — and a (3, 5) float64 in a second all-reduce: 14404 + 120 bytes, 3 + 1 packs
    packed = got["packed loop"]
    assert packed["grad_bytes"] == (10 * 300 + 300 + 300 + 1) * 4 + 15 * 8 and packed["grad_tensors"] == 5, packed
    assert packed["grad_packs"] == 4 and packed["bytes_per_pack"] == 1000, packed


def test_one_worker_mwms_has_a_step_time_and_its_gradient_bytes():
    got = _run("solo")
    assert got["counted"] == 30 and got["examples"] == 30 * 32, got  # every fit step, each batch of 32
    assert got["step_ms"] > 0 and got["collective_ms"] == 0 and got["pre_collective_ms"] == got["step_ms"], got
    assert got["grad_bytes"] == DENSE_10_16_1 and got["grad_tensors"] == 4, got
    assert got["allreduce_impl"] == "ring", got  # AUTO asked for, on CPUs: what TensorFlow runs
