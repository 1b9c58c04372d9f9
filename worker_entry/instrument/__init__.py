"""Instrumentation inside the user's training process (loaded by ``worker_entry/_site/sitecustomize.py``).

Different rules from the agent: it runs in the user's interpreter, patches private TensorFlow APIs, and
must never raise into the user's code (every hook turns a failure into one ``tfcluster:`` warning).
It imports only the standard library and, lazily, TensorFlow; it reaches its siblings and the protocol
through relative imports only, because it may be loaded under a private package name where the
user's interpreter does not have tfcluster installed.

- ``hooks``: ``install()``, the post-import hooks (MWMS constructor, ``Model.fit``/``evaluate``);
- ``progress``: the records written to the agent's progress pipe, and the public ``report_*`` calls;
- ``keras_callback``, ``strategy``, ``sweep``: Keras callbacks, ``make_strategy``, ``sweep_batch_size``;
- ``stepclock/``: where step time is measured (stamps at MWMS's collectives → rows → steps → windows);
- ``profiler/``: the opt-in TF profiler sampler, an alternative source of the same windows.
"""
