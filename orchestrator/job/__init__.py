"""Stage 9: the job. Connect, run attempts under the supervisor with the restart policy, sync the
chief's backup between attempts, gather, and return the result (``tfcluster launch``, ``preflight``)."""

from .job import Job, LaunchOptions, launch
from .preflight import PreflightReport, preflight_text, run_preflight
from .regather import gather_run

__all__ = ["Job", "LaunchOptions", "PreflightReport", "gather_run", "launch", "preflight_text", "run_preflight"]
