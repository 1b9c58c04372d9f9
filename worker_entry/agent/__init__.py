"""The node agent: the process ``python -m worker_entry`` starts on every node.

It owns the training process (its own session and process group, the stop, the orphan sweep), turns its
output and progress records into protocol frames, samples the host and its GPUs, and answers the
launcher's hand-over and transfers. It runs under the node's system Python rules: standard library
only (psutil, NVML and cryptography are optional and imported where used), and it never imports
TensorFlow or anything of ``worker_entry.instrument`` — those run inside the user's interpreter, a
different process (``tests/test_architecture.py`` enforces both).

``modes/`` is how the agent is started: over SSH (``run``, the default), or dialling back to the
supervisor under a scheduler (``connect``, ``slurm``), or as a pod's main process (``kubernetes``).
"""
