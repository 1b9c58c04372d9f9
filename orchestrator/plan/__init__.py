"""Stage 2: the plan. A pure, printable function of the spec: the task, TF_CONFIG, environment and
``NodeConfig`` of every node. The model and the parts every planner shares live here; each scheduler's
planner lives in its package (``orchestrator/schedulers/``). ``tfcluster plan`` prints exactly what
``launch`` uses."""

from .build import resolve_communication
from .load import default_run_id, run_id_for_dir, with_command
from .model import NodePlan, Plan, Runtime, SshTarget, TaskId, bracket
from .policy import StragglerPolicy
from .render import PlanNotes, plan_text
from .secrets import REDACTED, redact_env

__all__ = [
    "REDACTED",
    "NodePlan",
    "Plan",
    "PlanNotes",
    "Runtime",
    "SshTarget",
    "StragglerPolicy",
    "TaskId",
    "bracket",
    "default_run_id",
    "plan_text",
    "redact_env",
    "resolve_communication",
    "run_id_for_dir",
    "with_command",
]
