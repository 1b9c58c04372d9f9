"""The commonest MWMS mistake (the Keras tutorial's order): the dataset first, then the strategy. Every
worker fails with "Collective ops must be configured at program startup". Plain TensorFlow."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

dataset = tf.data.Dataset.range(64).batch(8)
strategy = tf.distribute.MultiWorkerMirroredStrategy()  # line 11: too late
print("never reached", flush=True)
