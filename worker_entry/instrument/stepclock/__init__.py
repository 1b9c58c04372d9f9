"""The step clock: where step time and its split are measured, with no callback and no edit.

``stamps`` and ``collectives`` wrap what MWMS calls while a ``tf.function`` is traced, so the graph
itself writes a time stamp row per replica function and per all-reduce into a ``ring``; ``devsync``
makes a GPU tensor's stamp wait for its value; the ``reader`` thread drains the rings and turns rows
into steps, and ``timeline`` into one window's trimmed split (input, compute, collective, update, host,
other), sent as a ``profile`` progress record.
"""
