"""The toy's ``Scheduler``: its planner (placements for the core's one plan builder), what ``tfcluster plan``
says about it, and one command of its own. It launches nothing."""

from __future__ import annotations

import argparse

from orchestrator.backends import Backend
from orchestrator.core.errors import UsageError
from orchestrator.plan import Plan, PlanNotes
from orchestrator.plan.build import Placement, assign_tasks, build_plan, job_dirs, resolve_communication, role_slots
from orchestrator.schedulers.base import Scheduler
from orchestrator.schedulers.command import SchedulerCommand
from orchestrator.spec import LoadedSpec


class ToyScheduler(Scheduler):
    name = "toy"

    def plan(self, loaded: LoadedSpec, run_id: str) -> Plan:
        spec = loaded.spec
        toy = spec.toy
        roles = dict(toy.roles or {})
        tasks = (
            [t for _, t, _ in role_slots([roles])] if roles else assign_tasks(len(toy.machines), spec.tensorflow.chief)
        )
        if len(tasks) != len(toy.machines):
            raise UsageError(f"toy: {len(tasks)} tasks by role for {len(toy.machines)} machines")
        placements = [
            Placement(task=t, host=m, tf_address=m, tf_port=toy.port, gpus=toy.gpus, endpoint=f"{m}:{toy.port}")
            for t, m in zip(tasks, toy.machines, strict=True)
        ]
        root, checkpoints, backups = job_dirs(spec, run_id)
        return build_plan(
            spec,
            run_id,
            placements,
            entry=("toy",),
            task_root=root,
            dirs=(checkpoints, backups),
            communication=resolve_communication(spec.tensorflow.communication, toy.gpus),
            warnings=[],
            extras={"machines": len(toy.machines)},
        )

    def plan_notes(self, plan: Plan) -> PlanNotes:
        return PlanNotes(started_by=lambda n: "  started by: the toy (nothing runs)")

    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend:
        raise UsageError("scheduler: toy plans jobs; it launches nothing")


SCHEDULER = ToyScheduler()


def _hello(args: argparse.Namespace) -> None:
    print(f"toy says hello to {args.who}")


COMMANDS = [
    SchedulerCommand(
        name="toy-hello",
        summary="The toy scheduler's own command.",
        example="tfcluster toy-hello world",
        arguments=lambda p: p.add_argument("who"),
        run=_hello,
    )
]
