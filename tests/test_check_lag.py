"""A check whose deadline passes while one host is starved names that host alone: every node reports the
phases it reaches (``TFCLUSTER_CHECK_PHASE``), and of the tasks without figures only those that did not
reach the phase most tasks reached are named ("did not finish importing TensorFlow within 60 s; the
others waited for it"); the ones that waited are listed, not named. Where nothing tells them apart (the
same phase everywhere, two hosts, a minority claiming more) every task without figures is named, as
before. Crafted per-task phase records, then through the real ``Job`` with fake nodes (unit tier)."""

from __future__ import annotations

import json

from fakecheck import check_through_job
from fakenode import FakeNode

from orchestrator.job.checkclaims import node_phase
from orchestrator.job.checkjudge import check_text, judge
from orchestrator.job.checklag import behind
from worker_entry import protocol as p
from worker_entry.protocol.checkline import PHASE_PREFIX, PHASES

HOSTS = {f"worker:{i}": f"10.0.0.{i + 1}" for i in range(3)}
DEADLINE = {"error": "the check's deadline (60 s) passed", "links": []}


def _timed_out(tasks=HOSTS) -> dict[str, dict]:
    return {t: {"task": t, **DEADLINE} for t in tasks}


def _named(check) -> list[tuple[str, str | None]]:
    return [(f["code"], f["task"]) for f in check["findings"]]


def test_the_host_still_importing_tensorflow_is_named_alone_and_the_others_waited():
    phases = {"worker:0": "strategy", "worker:1": "links", "worker:2": "strategy"}
    check = judge(_timed_out(), HOSTS, phases, 60.0)
    assert _named(check) == [("no_result", "worker:1")]
    what = check["findings"][0]["what"]
    assert "10.0.0.2 (worker:1): it did not finish importing TensorFlow within 60 s; the others waited for it" in what
    assert "2 task(s) reached 'strategy'" in what and "the check's deadline (60 s) passed" in what
    assert [(w["task"], w["phase"]) for w in check["waited"]] == [("worker:0", "strategy"), ("worker:2", "strategy")]
    text = check_text(check)
    assert "named: no figures from 10.0.0.2 (worker:1)" in text
    assert "not named: 10.0.0.1 (worker:0) waited for it (it reached 'strategy')" in text


def test_a_host_that_never_reported_a_phase_is_named_for_not_starting():
    phases = {"worker:0": "started", "worker:1": None, "worker:2": "started"}
    check = judge(_timed_out(), HOSTS, phases, 15.0)
    assert _named(check) == [("no_result", "worker:1")]
    assert (
        "did not finish starting its check (the interpreter, worker_entry) within 15 s" in check["findings"][0]["what"]
    )


def test_a_host_slow_in_the_compute_is_named_while_the_others_wait_in_the_all_reduce():
    phases = {"worker:0": "compute", "worker:1": "compute", "worker:2": "joined"}
    check = judge(_timed_out(), HOSTS, phases, 60.0)
    assert _named(check) == [("no_result", "worker:2")]
    assert "did not finish the compute benchmark" in check["findings"][0]["what"]


def test_without_a_distinction_every_host_is_named_as_before():
    # every task stopped at the same phase
    same = judge(_timed_out(), HOSTS, dict.fromkeys(HOSTS, "strategy"), 60.0)
    assert _named(same) == [("no_result", t) for t in HOSTS] and same["waited"] == []
    assert "no figures from 10.0.0.1 (worker:0): the check's deadline (60 s) passed" in same["findings"][0]["what"]
    # no phases at all (an older node)
    assert _named(judge(_timed_out(), HOSTS)) == [("no_result", t) for t in HOSTS]
    # two hosts: one host's word against the other's
    two = {t: HOSTS[t] for t in ("worker:0", "worker:1")}
    pair = judge(_timed_out(two), two, {"worker:0": "strategy", "worker:1": "links"}, 60.0)
    assert _named(pair) == [("no_result", "worker:0"), ("no_result", "worker:1")]


def test_a_minority_claiming_more_cannot_get_honest_hosts_named():
    # one node says it got to the all-reduce rounds, the honest two wait to join: nothing splits them
    liar = judge(_timed_out(), HOSTS, {"worker:0": "allreduce", "worker:1": "strategy", "worker:2": "strategy"})
    assert _named(liar) == [("no_result", t) for t in HOSTS]
    # four hosts, two claiming "joined": no majority past "strategy"
    four = {f"worker:{i}": f"10.0.0.{i + 1}" for i in range(4)}
    phases = {"worker:0": "joined", "worker:1": "joined", "worker:2": "strategy", "worker:3": "strategy"}
    assert behind(phases, list(four)) == (None, [])
    assert len(judge(_timed_out(four), four, phases)["findings"]) == 4


def test_one_failed_host_among_finished_ones_keeps_its_own_reason():
    results = {t: {"task": t, "gflops": 100.0, "device": "CPU", "links": []} for t in ("worker:0", "worker:2")}
    results["worker:1"] = {"task": "worker:1", "error": "RuntimeError: boom"}
    check = judge(results, HOSTS, {"worker:0": "allreduce", "worker:1": "tensorflow", "worker:2": "allreduce"})
    assert _named(check) == [("no_result", "worker:1")]
    assert check["findings"][0]["what"] == "no figures from 10.0.0.2 (worker:1): RuntimeError: boom"


def test_phase_lines_are_validated_and_the_last_valid_one_counts():
    good = PHASE_PREFIX + json.dumps({"phase": "links", "t_s": 1.5})
    assert node_phase(f"noise\n{PHASE_PREFIX}{json.dumps({'phase': 'started', 't_s': 0.1})}\n{good}\nmore\n") == "links"
    bad = [
        PHASE_PREFIX + json.dumps({"phase": "flying", "t_s": 1.0}),  # not a phase
        PHASE_PREFIX + json.dumps({"phase": "joined", "t_s": -1}),  # out of range
        PHASE_PREFIX + "{not json",
        PHASE_PREFIX + "[1]",
    ]
    assert node_phase("\n".join([good, *bad]) + "\n") == "links"  # garbage after it does not move it
    assert node_phase("TFCLUSTER_CHECK {}\n") is None
    assert PHASES[0] == "started" and PHASES[-1] == "allreduce"


# ------------------------------------------------------------------ through the real Job, fake nodes


def _node(phases: list[str]):
    def script(n: FakeNode) -> None:
        n.hello()
        if not isinstance(n.wait_for(p.Go), p.Go):
            n.exited(None, not_started=True, reason="stopped before the go")
            return
        n.send(p.Spawned(pid=5))
        for i, ph in enumerate(phases):
            n.log(PHASE_PREFIX + json.dumps({"phase": ph, "t_s": float(i)}))
        n.log("TFCLUSTER_CHECK " + json.dumps({"error": "the check's deadline (30 s) passed", "links": []}))
        n.exited(3)

    return script


def test_through_the_job_the_starved_host_alone_is_named_in_check_json_and_its_event(tmp_path):
    waiting = ["started", "links", "tensorflow", "strategy"]
    scripts = {"worker:0": _node(waiting), "worker:1": _node(["started", "links"]), "worker:2": _node(waiting)}
    check, _, _, run = check_through_job(tmp_path, scripts, deadline_s=30.0)
    assert _named(check) == [("no_result", "worker:1")], check["findings"]
    assert "did not finish importing TensorFlow within 30 s; the others waited for it" in check["findings"][0]["what"]
    assert sorted(w["task"] for w in check["waited"]) == ["worker:0", "worker:2"]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    found = [e for e in events if e["event"] == "check_finding"]
    assert [(e["code"], e["task"]) for e in found] == [("no_result", "worker:1")]
