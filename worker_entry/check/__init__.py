"""``python -m worker_entry.check``: what ``tfcluster check`` runs on every node instead of the job's
command — the host's compute (``main``), then every link and the all-reduce (``links``), one JSON line
on stdout. It runs in the job's interpreter with TensorFlow, like a training script."""
