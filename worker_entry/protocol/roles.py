"""The roles a task can have and which of them are members of TensorFlow's cluster (stdlib only: the
planner and the nodes share it)."""

from __future__ import annotations

#: Every role, in rank order: the plan numbers tasks chief first, then workers, parameter servers,
#: and the evaluator last (it is not part of the training cluster).
ROLES = ("chief", "worker", "ps", "evaluator")
#: The roles TF_CONFIG's ``cluster`` lists. An evaluator is left out, as TensorFlow's docs do
#: (``multi_worker_util`` treats a task outside the cluster as the evaluator).
CLUSTER_ROLES = ("chief", "worker", "ps")
STRATEGIES = ("multi_worker_mirrored", "parameter_server")


def role_order(counts: dict[str, int]) -> list[tuple[str, int]]:
    """(type, index) of each rank of a job given by role counts: every chief, worker, ps, then the
    evaluator (the planner's ``role_slots`` numbers tasks the same way)."""
    return [(role, i) for role in ROLES for i in range(counts.get(role, 0))]
