"""Slurm spares without a Slurm (issue 34 item 6): the plan of an allocation with spare nodes, the
reshaped attempt's plan and where its step runs, and what depends on the Slurm version."""

from __future__ import annotations

import pytest

from orchestrator.job import Exclusion
from orchestrator.job.reshaping import members_of
from orchestrator.runs import RunDir
from orchestrator.schedulers.slurm import versions as sv
from orchestrator.schedulers.slurm.allocation import SlurmScheduling
from orchestrator.schedulers.slurm.plan import sbatch_argv, slurm_plan
from orchestrator.schedulers.slurm.state import SlurmState
from orchestrator.schedulers.slurm.step import step_placement
from orchestrator.spec import load_spec_text

ALLOC = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[1-4]"}


def spec(slurm: str = "{nodes: 3, spare_nodes: 1}", restart: str = "{max_restarts: 3}"):
    text = (
        f"version: 1\nname: sp\nscheduler: slurm\nslurm: {slurm}\nrestart: {restart}\njob:\n  command: [python, t.py]\n"
    )
    return load_spec_text(text).spec


def scheduling(s, tmp_path, env=ALLOC) -> SlurmScheduling:
    return SlurmScheduling(RunDir(tmp_path), SlurmState(run_id="r"), s, batch=True, env=env)


def test_the_allocation_holds_the_spares_and_survives_a_node_failure():
    s = spec()
    argv = sbatch_argv(s, "runs/r", "runs/r/slurm/job.sh", "r")
    assert "--nodes=4" in argv and "--no-kill" in argv  # 3 + 1 spare; a failed node keeps the allocation
    plain = sbatch_argv(spec("{nodes: 3}"), "runs/r", "runs/r/slurm/job.sh", "r")
    assert "--nodes=3" in plain and "--no-kill" not in plain


def test_the_first_plan_runs_on_the_first_nodes_and_lists_the_spare():
    plan = slurm_plan(spec(), run_id="r", node_names=["n1", "n2", "n3", "n4"])
    assert [n.host for n in plan.nodes] == ["n1", "n2", "n3"]
    assert plan.spares == ("n4",) and plan.members == ("n1", "n2", "n3") and plan.extras["nodes"] == 3
    login = slurm_plan(spec(), run_id="r")  # from a login node: labels only, nothing to reshape there
    assert login.spares == ("node3",) and login.members == ()
    no_spare_alloc = slurm_plan(spec(), run_id="r", node_names=["n1", "n2", "n3"])  # the user's salloc without it
    assert no_spare_alloc.spares == ()


def test_a_node_lost_for_good_is_replaced_by_the_spare_in_the_allocations_order(tmp_path):
    s = spec()
    sch = scheduling(s, tmp_path)
    assert sch.reshapes
    plan = slurm_plan(s, run_id="r", node_names=sch.nodes)
    members = members_of(plan, s, sch.reshapes)
    assert members.elastic
    nxt, reshape = members.without(Exclusion("n1", "lost", 0, 1.0, str(plan.nodes[0].task)))
    assert reshape.spare_in == "n4" and nxt.hosts == ("n4", "n2", "n3")
    new = sch.replan(plan, nxt)
    assert new is not None and new.run_id == "r"
    # srun gives ranks in the allocation's order: the plan says so (rank 0 on n2 now, its first node)
    assert [n.host for n in new.nodes] == ["n2", "n3", "n4"] and new.spares == ()
    assert [str(n.task) for n in new.nodes] == [str(n.task) for n in plan.nodes]  # dense indices
    assert step_placement(sch.nodes, [n.host for n in new.nodes], s) == ["--nodelist=n2,n3,n4", "--exclude=n1"]
    # no spare left: one fewer, while restart.min_workers allows
    shrink = spec(restart="{max_restarts: 3, min_workers: 2}")
    sch2 = scheduling(shrink, tmp_path)
    m2 = members_of(new, shrink, sch2.reshapes, nxt.excluded)
    m3, r3 = m2.without(Exclusion("n3", "hung", 1, 2.0, str(new.nodes[1].task)))
    assert (r3.spare_in, r3.workers_after, m3.hosts) == (None, 2, ("n2", "n4"))
    smaller = sch2.replan(new, m3)
    assert smaller is not None and [n.host for n in smaller.nodes] == ["n2", "n4"] and smaller.planned_workers == 3
    assert step_placement(sch2.nodes, ["n2", "n4"], shrink) == ["--nodelist=n2,n4", "--exclude=n1,n3"]
    assert "below restart.min_workers" in members_of(smaller, shrink, True).without(Exclusion("n2", "lost", 2, 3.0))


def test_no_reshape_with_several_tasks_per_node_roles_or_outside_an_allocation(tmp_path):
    assert not scheduling(spec("{nodes: 2, tasks_per_node: 2, spare_nodes: 1}"), tmp_path).reshapes
    assert not scheduling(spec(), tmp_path, env={"SLURM_JOB_ID": "41"}).reshapes
    s = spec("{nodes: 2, tasks_per_node: 2, spare_nodes: 1}")
    plan = slurm_plan(s, run_id="r", node_names=["n1", "n2", "n3"])
    assert not members_of(plan, s, True).elastic  # several tasks per node: restarts in place, as before


def test_the_first_step_keeps_off_the_spare_nodes():
    s = spec()
    assert step_placement(["n1", "n2", "n3", "n4"], ["n1", "n2", "n3"], s) == ["--nodelist=n1,n2,n3", "--exclude=n4"]
    assert step_placement(["n1", "n2", "n3"], ["n1", "n2", "n3"], s) == []  # the whole allocation
    # labels that are not the allocation's names (no node names known): its first nodes, as before
    assert step_placement(["n1", "n2", "n3", "n4"], ["node0", "node1", "node2"], s) == ["--nodelist=n1,n2,n3"]


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("slurm 22.05.8\n", (22, 5, 8)),  # Debian 12's slurm-wlm, this machine
        ("slurm-wlm 22.05.8\n", (22, 5, 8)),
        ("slurm 23.02.7", (23, 2, 7)),
        ("slurm 24.11.0-0rc1", (24, 11, 0)),
        ("slurm 25.11.1", (25, 11, 1)),
        ("slurm 25.11", (25, 11, 0)),
        ("sinfo: error: something", None),
        ("", None),
    ],
)
def test_slurm_versions_as_the_commands_print_them(text, version):
    assert sv.parse_version(text) == version


def test_expedited_requeue_only_from_25_11_on():
    assert sv.requeue_option(True, (22, 5, 8)) == "--requeue"
    assert sv.requeue_option(True, (25, 5, 3)) == "--requeue"
    assert sv.requeue_option(True, None) == "--requeue"  # unknown: never assume a newer feature
    assert sv.requeue_option(True, (25, 11, 0)) == "--requeue=expedite"
    assert sv.requeue_option(True, (26, 5, 0)) == "--requeue=expedite"
    assert sv.requeue_option(False, (25, 11, 0)) == "--no-requeue"
    assert sv.avoid_nodes_argv("41", ["n1", "n3"]) == ["scontrol", "update", "JobId=41", "ExcNodeList=n1,n3"]


def test_the_version_is_asked_once_of_sinfo_then_scontrol(monkeypatch):
    asked = []

    def fake_run(argv, **kw):
        asked.append(argv[0])
        if argv[0] == "sinfo":
            raise sv.sc.SlurmError("sinfo: not found")
        return "slurm 25.11.2\n"

    monkeypatch.setattr(sv.sc, "run", fake_run)
    sv.slurm_version.cache_clear()
    try:
        assert sv.slurm_version() == (25, 11, 2) and sv.slurm_version() == (25, 11, 2)
        assert asked == ["sinfo", "scontrol"]
    finally:
        sv.slurm_version.cache_clear()


def test_after_its_own_requeue_the_job_asks_slurm_to_avoid_the_lost_nodes(tmp_path, monkeypatch):
    from orchestrator.schedulers.slurm import allocation as al

    s = spec()
    sch = scheduling(s, tmp_path)
    plan = slurm_plan(s, run_id="r", node_names=sch.nodes)
    nxt, _ = members_of(plan, s, True).without(Exclusion("n2", "lost", 0, 1.0))
    assert sch.replan(plan, nxt) is not None and sch.lost_nodes == ["n2"]
    ran, warned = [], []
    monkeypatch.setattr(al.sc, "run", lambda argv, **kw: ran.append(argv) or "")

    class Job:
        class bus:  # a stand-in for the job's event bus
            emit = staticmethod(warned.append)

    sch._avoid_lost_nodes(Job)
    assert ran == [["scontrol", "update", "JobId=41", "ExcNodeList=n2"]] and warned == []
    assert sch._exclude() == ["--exclude=n2"]

    def refuse(argv, **kw):
        raise al.sc.SlurmError("scontrol failed (exit 1): Job is no longer pending execution")

    monkeypatch.setattr(al.sc, "run", refuse)
    sch._avoid_lost_nodes(Job)
    assert "may get n2 again" in warned[0].message
    assert scheduling(s, tmp_path)._exclude() == []  # nothing lost: nothing asked
