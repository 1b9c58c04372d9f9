"""Example training scripts (plain TensorFlow: they run with and without tfcluster)."""
