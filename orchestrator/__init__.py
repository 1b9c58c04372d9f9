"""tfcluster: launch, supervise and explain multi-machine TensorFlow MWMS jobs over SSH."""

__version__ = "0.1.0"
