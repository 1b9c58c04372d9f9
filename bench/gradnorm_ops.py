#!/usr/bin/env python3
"""The gradient noise scale's ops in a traced step, counted (no timing: the same on any machine).

    python bench/gradnorm_ops.py

Traces ``bench/stamp_cost.py``'s step (two replicas on two logical CPUs, MWMS's ``CollectiveAllReduce``,
one pack per replica) with the step clock's stamps, with and without the norms (``TFCLUSTER_GRADNOISE``),
and prints the ops under ``tfcluster_gns`` by type and device. A device other than the row's
(``/cpu:0``) means a copy per step: on a GPU, a device-to-host copy.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stamp_cost  # sets the repository on sys.path and TensorFlow's environment


def graph_ops(f, batch) -> list[tuple[str, str, str]]:
    """(name, type, device) of every op of the traced function and the functions it calls."""
    out = []

    def walk(graph) -> None:
        for op in graph.get_operations():
            out.append((op.name, op.type, op.device))
        for fn in getattr(graph, "_functions", {}).values():
            if hasattr(fn, "graph"):
                walk(fn.graph)

    walk(f.get_concrete_function(batch).graph)
    return out


def main() -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    variants, it = stamp_cost.build(tf, False, 32)
    batch = next(it)
    with_norms, without = graph_ops(variants["stamps"], batch), graph_ops(variants["stamps - norms"], batch)
    gns = [o for o in with_norms if "tfcluster_gns" in o[0] and o[1] != "Const"]
    print(f"ops in the step: {len(with_norms)} with the norms, {len(without)} without")
    print(f"the norms' ops (constants left out): {len(gns)}: {dict(collections.Counter(t for _, t, _ in gns))}")
    for name, kind, device in gns:
        print(f"  {kind:<8} {device:<48} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
