"""Public: what a training script calls to report its own progress (``report_step``,
``report_loss``, ``report_evaluation``, ``flush``). A re-export: the implementation is ``worker_entry.instrument.progress``
(one module, so its counters are shared with the instrumentation)."""

from .instrument.progress import flush, report_evaluation, report_loss, report_step

__all__ = ["flush", "report_evaluation", "report_loss", "report_step"]
