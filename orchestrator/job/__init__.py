"""Stage 9: the job. Connect, run attempts under the supervisor with the attempt policy, hand over each
attempt's files, and return the result (``tfcluster launch``); ``scale`` runs one bounded job per size.
What differs per scheduler comes in from ``orchestrator/schedulers`` as objects (backend, scheduling)."""

from .job import Job, LaunchOptions, launch
from .policy import Action, AttemptPolicy, Decision, Exclusion, Members, Reshape, RestartPolicy
from .scheduling import RunScheduling

__all__ = [
    "Action",
    "AttemptPolicy",
    "Decision",
    "Exclusion",
    "Job",
    "LaunchOptions",
    "Members",
    "Reshape",
    "RestartPolicy",
    "RunScheduling",
    "launch",
]
