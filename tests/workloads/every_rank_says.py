"""Every worker says the same line at the same moment (right after an all-reduce), then one of its own.
Plain TensorFlow (its start-up banner included): the console collapses the first and hides the banner."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)  # every worker waits here
print(f"every rank says: {int(total)} replicas answered", flush=True)
print(f"only {task['type']}:{task['index']} says this", flush=True)
