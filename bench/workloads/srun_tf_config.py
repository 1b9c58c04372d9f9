"""The by-hand baseline of bench/slurm.py: a task of a plain `srun` builds TF_CONFIG itself, then runs the job.

    srun -N3 -n3 python bench/workloads/srun_tf_config.py python tests/workloads/mwms_job.py ...

What a user writes without tfcluster (TensorFlow's SlurmClusterResolver needs GPUs and gives the
virtual nodes of this machine one port): nodes from `scontrol show hostnames`, their NodeAddr from
`scontrol show node`, one port per rank (every slurmd here shares 127.0.0.1), rank = SLURM_PROCID.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys


def main() -> int:
    nodelist = os.environ["SLURM_STEP_NODELIST"]
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    ).stdout.split()
    info = subprocess.run(
        ["scontrol", "show", "node", "-o", nodelist], capture_output=True, text=True, check=True
    ).stdout
    addr = dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)", info))
    per_node = int(os.environ["SLURM_STEP_NUM_TASKS"]) // len(nodes)
    base = 20000 + int(os.environ["SLURM_JOB_ID"]) % 5000 * 4
    workers = [
        f"{addr.get(nodes[r // per_node], nodes[r // per_node])}:{base + r}" for r in range(len(nodes) * per_node)
    ]
    rank = int(os.environ["SLURM_PROCID"])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
