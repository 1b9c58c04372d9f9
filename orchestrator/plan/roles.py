"""What each role's failure and end mean to the job: one table, as data (pure).

MultiWorkerMirroredStrategy: chief and workers are one collective — any failure tears the job down,
and the job has trained when every one of them exited 0. The sidecar evaluator is outside it: it
never holds the go, is not judged for progress or as a straggler, its failure is reported while the
training goes on, and it is stopped once the training ended.

ParameterServerStrategy: the chief runs the ClusterCoordinator; the job has trained when it exits 0.
A worker that dies is tolerated by the coordinator (it reschedules the closures) and rejoins when
started again, so tfcluster restarts it alone, in place. A ps holds variables nobody else has: its
failure is fatal, like the chief's. Workers and ps never exit by themselves: they are stopped once
the chief is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OnFailure = Literal["teardown", "restart", "report"]


@dataclass(frozen=True)
class RoleRule:
    on_failure: OnFailure  # teardown: the job fails with it as root cause; restart: it alone, in place; report
    trains: bool  # the job has trained when every task of a training role exited 0
    collective: bool  # judged as a member of the training: startup deadline, progress, stragglers
    holds_go: bool  # the go waits for it (and a start that never comes fails the job)

    def to_dict(self) -> dict[str, object]:
        return {
            "on_failure": self.on_failure,
            "trains": self.trains,
            "collective": self.collective,
            "holds_go": self.holds_go,
        }


_MEMBER = RoleRule("teardown", trains=True, collective=True, holds_go=True)
_SIDECAR = RoleRule("report", trains=False, collective=False, holds_go=False)

#: strategy -> role -> rule (``tensorflow.strategy``; which roles a strategy allows: spec.roles.ALLOWED)
RULES: dict[str, dict[str, RoleRule]] = {
    "multi_worker_mirrored": {"chief": _MEMBER, "worker": _MEMBER, "evaluator": _SIDECAR},
    "parameter_server": {
        # the coordinator: its steps are the job's progress, its exit 0 the job's end
        "chief": RoleRule("teardown", trains=True, collective=True, holds_go=True),
        # tf.distribute.Server: no steps of their own (the coordinator's closures run there)
        "worker": RoleRule("restart", trains=False, collective=False, holds_go=True),
        "ps": RoleRule("teardown", trains=False, collective=False, holds_go=True),
        "evaluator": _SIDECAR,
    },
}


def rule_of(strategy: str, task: str) -> RoleRule:
    """The rule of a task named ``type:index`` under ``strategy``."""
    return RULES[strategy][task.partition(":")[0]]


def rules_table(strategy: str) -> dict[str, dict[str, object]]:
    """The table as plan.json and ``report`` show it."""
    return {role: r.to_dict() for role, r in RULES[strategy].items()}


_ON_FAILURE = {
    "teardown": "its failure tears the job down",
    "restart": "restarted alone, in place, when it fails",
    "report": "its failure is reported, training goes on",
}


def role_lines(strategy: str) -> list[str]:
    """One line per role for ``tfcluster plan``."""
    out = []
    for role, r in RULES[strategy].items():
        end = (
            "trains: the job ends once every training task exited 0" if r.trains else "stopped when the training ended"
        )
        go = "" if r.holds_go else "; never holds the go"
        out.append(f"  {role:<10} {_ON_FAILURE[r.on_failure]}; {end}{go}")
    return out
