"""What to do about a diagnosis: the remedy shown beside it, live and in `report`. Pure.

One owner for the wording, so the live straggler event, `report`'s advice and `scale`'s advice say the
same thing. The input pipeline's remedies are tf.data's own (the "Better performance with the tf.data
API" guide): overlap producing a batch with training on the last one (prefetch), parallelise the
per-example work (map), do the expensive work once (cache), read files in parallel (interleave), and,
when the host's CPUs cannot keep up at all, move the preprocessing to other machines (tf.data service).
"""

from __future__ import annotations

INPUT_PIPELINE = (
    "end its tf.data pipeline with .prefetch(tf.data.AUTOTUNE); .map(fn, num_parallel_calls=tf.data.AUTOTUNE) "
    "for the per-example work; .cache() after the expensive steps when the result fits in memory or on local "
    "disk; read sharded files in parallel with .interleave(..., num_parallel_calls=tf.data.AUTOTUNE); when its "
    "host's CPUs cannot keep up, move the preprocessing to other machines with the tf.data service "
    "(tf.data.experimental.service.distribute)"
)

#: Remedies by straggler cause (``stragglers.StragglerFinding.cause``); a cause not here has none to give.
BY_CAUSE = {"input pipeline": INPUT_PIPELINE}


def remedy(cause: str | None) -> str | None:
    """The remedy for a straggler's cause, or None."""
    return BY_CAUSE.get(cause or "")


def with_remedy(text: str, cause: str | None) -> str:
    """``text`` followed by the remedy for ``cause`` (unchanged when there is none)."""
    r = remedy(cause)
    return f"{text}. Remedy: {r}" if r else text
