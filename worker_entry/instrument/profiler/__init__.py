"""The opt-in TF profiler sampler (``TFCLUSTER_PROFILER=1``): trace windows parsed into the same
``profile`` records the step clock sends (``sampler``, ``trace_events``)."""
