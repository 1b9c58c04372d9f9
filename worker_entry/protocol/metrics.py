"""The bounds of an evaluator's metrics (``messages.Evaluation``), shared by the node that trims what it
sends (``progress.report_evaluation``, in the user's process: this module is light on purpose) and the
launcher that validates what it receives."""

from __future__ import annotations

#: At most ``METRICS_MAX`` metrics, names of 1 to ``METRIC_NAME_MAX`` characters, finite numbers within
#: the schema's float limit; the node drops the rest and says how many. A checkpoint's path is kept to
#: its last ``CHECKPOINT_MAX`` characters (the tail names it).
METRICS_MAX = 32
METRIC_NAME_MAX = 64
METRIC_LIMIT = 1e300
CHECKPOINT_MAX = 512


def check_metric_names(metrics: dict[str, float]) -> None:
    """The schema bounds a mapping's size and values; a metric's name is bounded here."""
    from .frames import ProtocolError

    for name in metrics:
        if not name or len(name) > METRIC_NAME_MAX:
            raise ProtocolError(
                f"metrics: expected names of 1 to {METRIC_NAME_MAX} characters, got {name[:80]!r}", "metrics"
            )
