"""Stage 2: the plan. A pure, printable function of the spec (and ~/.ssh/config): the task, TF_CONFIG,
environment and ``NodeConfig`` of every node. ``tfcluster plan`` prints exactly what ``launch`` uses."""

from .build import SshLookup, build_plan, resolve_communication
from .kubernetes import PodNames, kubernetes_plan, pod_names
from .load import default_run_id, load_plan, plan_loaded, run_id_for_dir
from .model import NodePlan, Plan, Runtime, SshTarget, TaskId, bracket
from .policy import StragglerPolicy
from .secrets import REDACTED, redact_env
from .slurm import slurm_plan  # registers the slurm planner with build_plan

__all__ = [
    "REDACTED",
    "NodePlan",
    "Plan",
    "PodNames",
    "Runtime",
    "SshLookup",
    "SshTarget",
    "StragglerPolicy",
    "TaskId",
    "bracket",
    "build_plan",
    "default_run_id",
    "kubernetes_plan",
    "load_plan",
    "plan_loaded",
    "pod_names",
    "redact_env",
    "resolve_communication",
    "run_id_for_dir",
    "slurm_plan",
]
