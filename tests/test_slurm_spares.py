"""Slurm spares without a Slurm (issue 34 item 6): the plan of an allocation with spare nodes, the
reshaped attempt's plan and where its step runs, and what depends on the Slurm version."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import jsonl

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


def test_a_node_with_two_tasks_leaves_with_both_for_the_spare_or_shrinks_by_two(tmp_path):
    s = spec("{nodes: 3, tasks_per_node: 2, spare_nodes: 1}", "{max_restarts: 3, min_workers: 2}")
    sch = scheduling(s, tmp_path)
    assert sch.reshapes
    plan = slurm_plan(s, run_id="r", node_names=sch.nodes)
    assert plan.members == ("n1", "n1", "n2", "n2", "n3", "n3")
    members = members_of(plan, s, sch.reshapes, fixed=sch.fixed_hosts())
    assert members.hosts == ("n1", "n2", "n3") and members.workers == 6 and members.elastic
    nxt, reshape = members.without(Exclusion("n2", "lost", 0, 1.0, "worker:3"))  # worker:3 runs on n2
    assert (reshape.out.host, reshape.spare_in, reshape.workers_before, reshape.workers_after) == ("n2", "n4", 6, 6)
    new = sch.replan(plan, nxt)
    assert new is not None and [n.host for n in new.nodes] == ["n1", "n1", "n3", "n3", "n4", "n4"]
    assert [str(n.task) for n in new.nodes] == [f"worker:{i}" for i in range(6)]
    assert step_placement(sch.nodes, [n.host for n in new.nodes], s) == ["--nodelist=n1,n3,n4", "--exclude=n2"]
    # no spare left: the node's two workers out, 6 -> 4, then 4 -> 2, then below min_workers
    m2 = members_of(new, s, True, nxt.excluded)
    m3, r3 = m2.without(Exclusion("n1", "lost", 1, 2.0, "worker:0"))
    assert (r3.spare_in, r3.workers_after, m3.hosts) == (None, 4, ("n3", "n4"))
    smaller = sch.replan(new, m3)
    assert smaller is not None and [n.host for n in smaller.nodes] == ["n3", "n3", "n4", "n4"]
    assert smaller.common.env["TFCLUSTER_NUM_WORKERS"] == "4" and smaller.planned_workers == 6
    m4, r4 = members_of(smaller, s, True, m3.excluded).without(Exclusion("n3", "lost", 2, 3.0))
    assert (r4.workers_after, m4.hosts) == (2, ("n4",))
    end = members_of(sch.replan(smaller, m4), s, True, m4.excluded).without(Exclusion("n4", "lost", 3, 4.0))
    assert (
        end
        == "host n4 is out (lost) and no spare host is left: 0 worker(s) would remain, below restart.min_workers (2)"
    )


def test_with_roles_a_node_leaves_only_for_a_spare_and_outside_an_allocation_never(tmp_path):
    s = spec("{nodes: 2, spare_nodes: 1, roles: {chief: 1, worker: 1}}")
    sch = scheduling(s, tmp_path)
    plan = slurm_plan(s, run_id="r", node_names=sch.nodes[:3])
    members = members_of(plan, s, sch.reshapes, fixed=sch.fixed_hosts())
    nxt, reshape = members.without(Exclusion("n1", "lost", 0, 1.0, "chief:0"))
    assert reshape.spare_in == "n3"
    new = sch.replan(plan, nxt)
    # the chief's node lost: the allocation's first node left (n2) runs rank 0, the chief
    assert new is not None and [(str(n.task), n.host) for n in new.nodes] == [("chief:0", "n2"), ("worker:0", "n3")]
    end = members_of(new, s, True, nxt.excluded, sch.fixed_hosts()).without(Exclusion("n3", "lost", 1, 2.0))
    assert isinstance(end, str) and end.startswith("host n3 is out (lost) and no spare host is left: slurm.roles fill")
    # min_workers (validate warns: not used) does not make it elastic: with no spare, a restart in place
    no_spare = spec("{nodes: 2, roles: {chief: 1, worker: 1}}", "{max_restarts: 3, min_workers: 1}")
    sch = scheduling(no_spare, tmp_path)
    plan = slurm_plan(no_spare, run_id="r", node_names=sch.nodes[:2])
    assert not members_of(plan, no_spare, sch.reshapes, fixed=sch.fixed_hosts()).elastic
    assert not scheduling(spec(), tmp_path, env={"SLURM_JOB_ID": "41"}).reshapes  # no node names: no reshape


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
    show = ["scontrol", "show", "job", "-o", "41"]  # what the job excludes already is kept
    assert ran == [show, ["scontrol", "update", "JobId=41", "ExcNodeList=n2"]] and warned == []
    assert sch._exclude() == ["--exclude=n2"]

    def refuse(argv, **kw):
        raise al.sc.SlurmError("scontrol failed (exit 1): Job is no longer pending execution")

    monkeypatch.setattr(al.sc, "run", refuse)
    sch._avoid_lost_nodes(Job)
    assert "may get n2 again" in warned[0].message
    assert scheduling(s, tmp_path)._exclude() == []  # nothing lost: nothing asked


# ----------------------------------------------------------------------------- Slurm's own requeue after a node failure

SINFO = "n1|idle\nn2|down*\nn3|mix*\nn4|drain\nn5|alloc\nn6|fail\nn7|idle~\n"


def test_the_failed_nodes_are_those_not_responding_down_drained_or_failing():
    from orchestrator.schedulers.slurm import avoid as av

    assert av.failed_nodes(SINFO, ["n1", "n2", "n3", "n4", "n5", "n6"]) == ["n2", "n3", "n4", "n6"]
    assert av.failed_nodes(SINFO, ["n1", "n5"]) == []
    assert av.failed_nodes(SINFO, ["n9"]) == []  # a node sinfo does not list is not guessed at
    assert av.excluded_of("JobId=7 JobState=PENDING ExcNodeList=n[2-3],gpu7 Features=(null)") == ["n2", "n3", "gpu7"]
    assert av.excluded_of("JobId=7 ExcNodeList=(null)") == [] and av.excluded_of("JobId=7") == []


def test_the_follower_names_the_allocation_lost_once_when_the_job_goes_back_to_the_queue():
    from orchestrator.schedulers.slurm import avoid as av

    watch = av.RequeueWatch()
    assert watch.see("PENDING", "") == []  # the first wait: nothing was lost
    assert watch.see("RUNNING", "n[1-3]") == []
    assert watch.see("COMPLETING", "n[1-3]") == []
    assert watch.see("PENDING", "") == ["n1", "n2", "n3"]  # requeued
    assert watch.see("PENDING", "") == []  # once
    assert watch.see("RUNNING", "n[2-4]") == [] and watch.see("COMPLETED", "") == []  # ended: not a requeue


def test_after_slurms_requeue_the_failed_nodes_join_what_the_job_already_excludes(monkeypatch):
    from orchestrator.schedulers.slurm import avoid as av

    ran: list[list[str]] = []

    def fake_run(argv, **kw):
        ran.append(list(argv))
        if argv[0] == "sinfo":
            return SINFO
        if argv[:3] == ["scontrol", "show", "job"]:
            return "JobId=41 JobState=PENDING ExcNodeList=n9"  # the user's own --exclude
        return ""

    monkeypatch.setattr(av.sc, "run", fake_run)
    assert av.avoid_failed("41", ["n1", "n2", "n3"]) == ["n2", "n3"]
    assert ran[0] == ["sinfo", "-h", "-N", "-n", "n1,n2,n3", "-o", "%N|%t"]
    assert ran[-1] == ["scontrol", "update", "JobId=41", "ExcNodeList=n9,n2,n3"]
    ran.clear()
    assert av.avoid_failed("41", ["n1", "n5"]) == [] and [a[0] for a in ran] == ["sinfo"]  # none failed: no update
    ran.clear()
    assert av.exclude_more("41", ["n9"]) == [] and ran == [["scontrol", "show", "job", "-o", "41"]]  # no change


def test_the_follower_asks_once_when_slurm_puts_the_job_back_in_the_queue(tmp_path, monkeypatch):
    import io

    from orchestrator.schedulers.slurm import follow as fo
    from orchestrator.schedulers.slurm.commands import JobInfo

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    seen = iter([JobInfo("41", "RUNNING", nodes="n[1-2]"), JobInfo("41", "PENDING", "BeginTime")] * 2)
    monkeypatch.setattr(fo, "job_info", lambda r: next(seen))
    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(fo, "avoid_failed", lambda job, nodes: asked.append((job, nodes)) or ["n2"][: len(asked) - 1])
    err = io.StringIO()
    plan = SimpleNamespace(nodes=("n1", "n2"))  # the follower asks the plan only how many tasks
    follower = fo.Follower(run, plan, out=io.StringIO(), err=err)  # type: ignore[arg-type]
    for _ in range(4):
        follower._poll_slurm()
    assert asked == [("41", ["n1", "n2"]), ("41", ["n1", "n2"])]  # each requeue once; the 1st: nothing failed
    assert err.getvalue().count("after node n2 failed: the next allocation leaves it out") == 1
    warnings = [e for e in jsonl(run.events_jsonl) if e["event"] == "warning"]
    assert len(warnings) == 1 and "ExcNodeList" in warnings[0]["message"]
