"""Stage 6: supervision. Per-task sessions (bytes → typed messages), one decision loop (go, verdicts,
teardown), pure policy (monitor, stragglers, cross-host checks) and the status/result it reports."""

from .checks import evaluate, failed, finding
from .evidence import HostFinding, Scores, explain, host_suspect
from .gpus import GpuJudgement, GpuProblem, judge_gpus
from .inputs import Interrupt
from .monitor import Monitor
from .session import TaskSession
from .stragglers import StragglerFinding, find_straggler
from .supervisor import Supervisor
from .verdicts import Policy, Verdict

__all__ = [
    "GpuJudgement",
    "GpuProblem",
    "HostFinding",
    "Interrupt",
    "Monitor",
    "Policy",
    "Scores",
    "StragglerFinding",
    "Supervisor",
    "TaskSession",
    "Verdict",
    "evaluate",
    "explain",
    "failed",
    "find_straggler",
    "finding",
    "host_suspect",
    "judge_gpus",
]
