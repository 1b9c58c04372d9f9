#!/usr/bin/env python3
"""What the gradient noise scale's two squared norms per step cost on a GPU (a GPU host's check).

    python bench/gradnorm_gpu.py [--json] [--params 25.6e6] [--tensors 161] [--rounds 200]

The step clock computes, per gradient all-reduce, Σ|t|² of the gradients before it and of the reduced
ones after it: per tensor a cast to float32, a square and a sum on the replica's device, then one add
over the tensors (``worker_entry/instrument/stepclock/gradnorms.py``). This times exactly that arithmetic
on gradient-sized tensors (default: ResNet-50's 25.6 M parameters in 161 tensors, one pack) in float32
and bfloat16 — per pack (what the step clock does: the flat tensor the all-reduce concatenates) and, for
comparison, per tensor — with TensorFlow when it sees a GPU (the very ops), else with PyTorch (the same reads and
arithmetic; TensorFlow with CUDA is not installed on every GPU host) — and, for scale, one bf16 matmul
of 8192³ (≈1.1 TFLOP, a fraction of one ResNet-50 training step at batch 256). Prints µs per step for the
two norms and that matmul's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def shapes(params: int, tensors: int) -> list[int]:
    """``tensors`` sizes adding up to ``params``: a few large ones and many small, like a CNN's."""
    weights = [1.0 / (1 + (i % 7)) for i in range(tensors)]
    total = sum(weights)
    sizes = [max(1, int(params * w / total)) for w in weights]
    sizes[0] += params - sum(sizes)
    return sizes


def with_torch(sizes: list[int], rounds: int) -> dict:
    import torch

    dev = torch.device("cuda")
    out: dict = {"framework": f"torch {torch.__version__}", "device": torch.cuda.get_device_name(0)}

    def timed(fn) -> float:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(rounds):
            fn()
        end.record()
        torch.cuda.synchronize()
        return round(start.elapsed_time(end) * 1e3 / rounds, 1)

    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        grads = [torch.randn(n, device=dev, dtype=dtype) for n in sizes]
        flat = torch.cat(grads)  # the pack the all-reduce concatenates anyway

        def per_pack(flat=flat) -> None:  # what gradnorms does: one fused reduction in and one out
            x = flat if flat.dtype == torch.float32 else flat.float()
            torch.dot(x, x)
            torch.dot(x, x)

        def per_tensor(grads=grads) -> None:  # the alternative: a reduction per gradient tensor
            for _ in range(2):
                torch.stack([torch.sum(torch.square(g.float())) for g in grads]).sum()

        out[f"two_norms_per_pack_us_{name}"] = timed(per_pack)
        out[f"two_norms_per_tensor_us_{name}"] = timed(per_tensor)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    out["matmul_8192_bf16_us"] = timed(lambda: a @ a)
    return out


def with_tensorflow(sizes: list[int], rounds: int) -> dict | None:
    try:
        import tensorflow as tf
    except ImportError:
        return None
    if not tf.config.list_physical_devices("GPU"):
        return None
    out: dict = {"framework": f"tensorflow {tf.__version__}", "device": "GPU:0"}
    for dtype in (tf.float32, tf.bfloat16):
        with tf.device("/GPU:0"):
            flat = tf.cast(tf.random.normal([sum(sizes)]), dtype)

        @tf.function
        def norms(flat=flat):
            with tf.device("/GPU:0"):
                x = flat if flat.dtype == tf.float32 else tf.cast(flat, tf.float32)
                return tf.nn.l2_loss(x) + tf.nn.l2_loss(x)

        for _ in range(10):
            norms().numpy()
        t0 = time.perf_counter()
        for _ in range(rounds):
            norms()
        norms().numpy()
        out[f"two_norms_per_pack_us_{dtype.name}"] = round((time.perf_counter() - t0) * 1e6 / rounds, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--params", type=float, default=25.6e6)
    ap.add_argument("--tensors", type=int, default=161)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    sizes = shapes(int(args.params), args.tensors)
    out = with_tensorflow(sizes, args.rounds)
    if out is None:
        try:
            out = with_torch(sizes, args.rounds)
        except Exception as exc:  # no CUDA PyTorch either
            print(f"no GPU framework: TensorFlow sees no GPU and PyTorch failed ({exc!r})", file=sys.stderr)
            return 2
    out.update(params=int(args.params), tensors=args.tensors)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
