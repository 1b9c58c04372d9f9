"""Hostile nodes against `tfcluster check` (issue 31, items 1-3).

Items 1-2: every check line goes through the real ``Job`` with ``CheckScheduling`` (fake nodes on the
real supervisor, decoder, log router and judgement; unit tier): a malformed or absurd line is that
node's ``no_result`` with the field it got wrong, never an internal error (result.json and check.json
written); a node that claims links it did not measure, or inflates its own figures, gets no honest
host named, and ``without_named_hosts`` never leaves an honest host out.

Item 3: the probe server for real on loopback (stdlib sockets, three tasks' link rounds in threads):
a stranger on a task's port is refused at its first line and cannot end a round, and 2,000 idle
connections cost no thread.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
from fakecheck import check_through_job
from fakenode import FakeNode, make_plan
from waiting import wait_for

from orchestrator.core.errors import UsageError
from orchestrator.job.check import check_spec, without_hosts
from orchestrator.plan.record import PlanRecord
from orchestrator.schedulers.ssh import ssh_plan
from worker_entry import protocol as p
from worker_entry.check.links import link_rounds
from worker_entry.check.probeserver import ProbeServer, sign

GB = 1e9


def _honest(n: int) -> dict[str, dict]:
    """What n honest nodes print: 100 GFLOP/s each, 1 GB/s links (0-1, 1-2, 0-2, ...), each server's view."""
    tasks = [f"worker:{i}" for i in range(n)]
    lines = {
        t: {
            "task": t,
            "rank": i,
            "hostname": f"h{i}",
            "gflops": 100.0,
            "device": "CPU",
            "gpus": [],
            "workers": n,
            "communication": "ring",
            "links": [],
            "served": [],
            "allreduce": [{"bytes": 65536, "latency_s": 0.001}],
        }
        for i, t in enumerate(tasks)
    }
    pairs = [(i, i + 1) for i in range(n - 1)] + ([(0, n - 1)] if n > 2 else [])
    for rnd, (a, b) in enumerate(pairs, 1):
        ta, tb = tasks[a], tasks[b]
        lines[ta]["links"].append({"a": ta, "b": tb, "round": rnd, "latency_s": 2e-5, "bandwidth_Bps": GB})
        lines[tb]["served"].append({"a": ta, "b": tb, "round": rnd, "up_Bps": GB})
    return lines


def _prints(text: str):
    def script(n: FakeNode) -> None:
        n.hello()
        if not isinstance(n.wait_for(p.Go), p.Go):
            n.exited(None, not_started=True, reason="stopped before the go")
            return
        n.send(p.Spawned(pid=5))
        n.send(p.Started(how="strategy"))
        n.log("TFCLUSTER_CHECK " + text)
        n.exited(0)

    return script


def _check(tmp_path, lines: dict[str, str | dict], n: int = 3):
    """The check through a real Job: each node prints its line; (check.json, result.json, loaded spec)."""
    scripts = {t: _prints(v if isinstance(v, str) else json.dumps(v)) for t, v in lines.items()}
    check, result, loaded, _ = check_through_job(tmp_path, scripts, n)
    return check, result, loaded


def _named(check) -> list[tuple[str, str | None]]:
    return [(f["code"], f["task"]) for f in check["findings"]]


def test_the_secret_for_the_probes_travels_in_the_environment_and_is_redacted(tmp_path):
    loaded, _ = make_plan(3)
    checked = check_spec(loaded, 30)
    plan = ssh_plan(checked.spec, run_id="check-run", local_user="me", ssh_lookup=None)
    secret = plan.nodes[0].env[p.Env.CHECK_SECRET]
    assert len(secret) == 64 and all(n.env[p.Env.CHECK_SECRET] == secret for n in plan.nodes)
    assert secret not in " ".join(plan.nodes[0].argv) and secret not in PlanRecord.from_plan(plan).to_json()


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"gflops": "fast"}, "gflops: expected a number, got 'fast'"),
        ({"links": [1]}, "links[0]: expected a mapping, got 1"),
        ({"links": [{"a": "worker:1", "latency_s": 1e-5, "bandwidth_Bps": 1e9}]}, "links[0].b: required field"),
        ({"allreduce": "abc"}, "allreduce: expected a list, got 'abc'"),
        ({"workers": "many"}, "workers: expected an integer, got 'many'"),
        ({"gflops": float("nan")}, "gflops: expected a number, got nan"),
        ({"gflops": 1e400}, "gflops: expected a number, got inf"),
        ({"gflops": 1e30}, "gflops: expected a value in [0, 100000000.0]"),
        ({"gpus": [{"device": "x", "gflops": -1}]}, "gpus[0].gflops: expected a value in [0"),
    ],
)
def test_a_malformed_check_line_is_that_nodes_no_result_never_an_internal_error(tmp_path, bad, says):
    lines = _honest(3)
    lines["worker:1"] = {**lines["worker:1"], **bad}
    check, result, _ = _check(tmp_path, lines)
    assert result["state"] == "succeeded"
    (finding,) = check["findings"]
    assert (finding["code"], finding["task"]) == ("no_result", "worker:1")
    assert "its check line is invalid: " + says in finding["what"], finding["what"]
    assert [h["gflops"] for h in check["hosts"]] == [100.0, None, 100.0]


def test_a_line_that_is_not_an_object_or_not_json_is_no_result(tmp_path):
    lines = {**_honest(3), "worker:1": "[1, 2]", "worker:2": "{bad"}
    check, _, _ = _check(tmp_path, lines)
    assert _named(check) == [("no_result", "worker:1"), ("no_result", "worker:2")]
    assert "expected a JSON object" in check["findings"][0]["what"]
    assert "not JSON" in check["findings"][1]["what"]


def test_links_between_other_tasks_or_outside_the_plan_are_ignored_and_the_claimant_named(tmp_path):
    lines = _honest(4)
    forged = [
        {"a": "worker:2", "b": "worker:3", "round": 1, "latency_s": 1e-6, "bandwidth_Bps": 1e13},
        {"a": "worker:0", "b": "worker:9", "round": 1, "latency_s": 1e-6, "bandwidth_Bps": 1e13},
        {"a": "worker:0", "b": "worker:0", "round": 1, "latency_s": 1e-6, "bandwidth_Bps": 1e13},
    ]
    lines["worker:0"]["links"] += forged
    lines["worker:0"]["served"].append({"a": "worker:2", "b": "worker:3", "round": 1, "up_Bps": 1e13})
    check, _, loaded = _check(tmp_path, lines, n=4)
    assert _named(check) == [("bad_claim", "worker:0")], check["findings"]
    assert "a link measured by 'worker:2'" in check["findings"][0]["what"]
    assert all(x["bandwidth_Bps"] == GB for x in check["links"]), check["links"]
    assert check["nodes"]["worker:0"]["ignored"][2].startswith("a link measured to 'worker:0'")
    kept = without_hosts(loaded, check, lambda _: None)  # the liar is left out, every honest host kept
    assert [h.address for h in kept.spec.hosts] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]


def test_a_line_speaking_for_another_task_counts_for_nothing(tmp_path):
    lines = _honest(3)
    lines["worker:2"] = {**lines["worker:0"], "gflops": 1.0}  # worker:2 prints worker:0's line, slower
    check, _, _ = _check(tmp_path, lines)
    assert _named(check) == [("no_result", "worker:2")]
    assert "speaks for 'worker:0'" in check["findings"][0]["what"]


def test_inflated_own_links_are_held_to_the_partners_view_and_name_no_honest_host(tmp_path):
    """The issue's case: forged 10 TB/s links got honest hosts named slow_link. Now the client's claim
    is capped by what each partner timed, and one partner alone cannot pin a slow link on a host."""
    lines = _honest(4)
    for link in lines["worker:0"]["links"]:
        link["bandwidth_Bps"] = 1e13
    check, _, _ = _check(tmp_path, lines, n=4)
    assert check["findings"] == []
    assert max(x["bandwidth_Bps"] for x in check["links"]) == pytest.approx(1.5 * GB)


def test_a_server_understating_what_it_saw_gets_no_honest_host_named(tmp_path):
    lines = _honest(4)
    for s in lines["worker:3"]["served"]:
        s["up_Bps"] = 1.0  # worker:3 says every upload to it crawled
    lines["worker:3"]["links"] = []
    check, _, loaded = _check(tmp_path, lines, n=4)
    honest = {"worker:0", "worker:1", "worker:2"}
    assert not any(f["task"] in honest for f in check["findings"]), check["findings"]
    kept = without_hosts(loaded, check, lambda _: None) if check["findings"] else loaded
    assert {"10.0.0.1", "10.0.0.2", "10.0.0.3"} <= {h.address for h in kept.spec.hosts}


def test_an_inflated_gflops_among_three_names_nobody(tmp_path):
    lines = _honest(3)
    lines["worker:0"]["gflops"] = 1e7
    check, _, _ = _check(tmp_path, lines)
    assert check["findings"] == []


def test_with_two_hosts_an_inflated_gflops_names_the_pair_and_launch_refuses(tmp_path):
    """The issue's case: with two hosts one inflated figure named the other slow, and launch --check
    with without_named_hosts started without it. Now the pair is named, and the launch refuses."""
    lines = _honest(2)
    lines["worker:0"]["gflops"] = 1e7
    check, _, loaded = _check(tmp_path, lines, n=2)
    (f,) = check["findings"]
    assert (f["code"], f["task"], f["subject"]) == ("slow_host", None, "10.0.0.2<->10.0.0.1")
    assert "cannot tell" in f["what"]
    with pytest.raises(UsageError, match="not one host"):
        without_hosts(loaded, check, lambda _: None)


def test_a_garbage_flood_of_claims_is_bounded(tmp_path):
    lines = _honest(3)
    lines["worker:1"]["links"] = [dict(lines["worker:0"]["links"][0])] * 65  # more links than any check makes
    check, _, _ = _check(tmp_path, lines)
    assert _named(check) == [("no_result", "worker:1")] and "links: too long (65 > 64)" in check["findings"][0]["what"]


# --- item 3: the probe server ----------------------------------------------------------------------


def _ports(n: int) -> list[int]:
    from tfcluster_testbed.net import _pick_tf_ports

    return _pick_tf_ports(n, None)


def _rounds(peers, secret=b"s" * 32, deadline_s=30.0):
    found: dict[int, object] = {}

    def run(r: int) -> None:
        try:
            found[r] = link_rounds(peers, r, time.monotonic() + deadline_s, secret)
        except Exception as exc:  # reported by the test
            found[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(peers))]
    for t in threads:
        t.start()
    return threads, found


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    def listens() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_for(listens, timeout, f"a listener on port {port}", interval=0.02)


def test_a_stranger_cannot_report_for_every_rank_nor_end_a_round(tmp_path):
    """The issue's case: a stranger answered for every rank and ended round 1 early. Its reports carry
    no valid MAC: each is closed unheard, the rounds complete with the tasks' own reports."""
    peers = [(f"worker:{i}", "127.0.0.1", port) for i, port in enumerate(_ports(3))]
    threads, found = _rounds(peers)
    _wait_listening(peers[0][2])
    answers = []
    for rank in range(3):
        with socket.create_connection(("127.0.0.1", peers[0][2]), timeout=5) as s:
            f = s.makefile("rb")
            nonce = json.loads(f.readline())["nonce"]
            head = {"op": "report", "rank": rank, "round": 1, "links": []}
            s.sendall(json.dumps({**head, "mac": sign(b"guessed", nonce, head)}).encode() + b"\n")
            answers.append(f.readline())  # closed at once: no answer
    for t in threads:
        t.join(60)
    assert answers == [b"", b"", b""]
    assert all(isinstance(r, dict) for r in found.values()), found
    assert sorted((x["a"], x["b"]) for r in found.values() for x in r["links"]) == [
        ("worker:0", "worker:1"),
        ("worker:0", "worker:2"),
        ("worker:1", "worker:2"),
    ]
    assert found[0]["probe_refused"] >= 3


def test_two_thousand_idle_connections_cost_no_thread_and_the_rounds_complete(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 6000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    peers = [(f"worker:{i}", "127.0.0.1", port) for i, port in enumerate(_ports(3))]
    threads_before = threading.active_count()
    threads, found = _rounds(peers)
    idle = []
    try:
        for i in range(2000):  # on every task's port, the coordinator's too, as the rounds start
            port = peers[i % 3][2]
            if i < 3:
                _wait_listening(port)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            idle.append(s)
        during = threading.active_count()
        for t in threads:
            t.join(60)
    finally:
        for s in idle:
            s.close()
    # three rounds' threads and their three servers' loops: nothing per connection
    assert during <= threads_before + 6, (threads_before, during)
    assert all(isinstance(r, dict) and len(r["links"]) + len(r["served"]) == 2 for r in found.values()), found


def test_a_probe_ending_as_the_server_closes_keeps_its_served_view():
    """The last round's client says ``q`` just before its report, and the round can end before the
    server's loop read it (a loaded host, a flood to accept): close() waits for the open probe, so the
    server's own view of the upload is kept (it was lost: ``served`` short, the test above flaky)."""
    secret = b"s" * 32
    (port,) = _ports(1)
    server = ProbeServer("127.0.0.1", port, secret, "worker:1", ["worker:0", "worker:1"], None, time.monotonic() + 30)
    head = {"op": "probe", "rank": 0, "round": 1}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        f = s.makefile("rb")
        nonce = json.loads(f.readline())["nonce"]
        s.sendall(json.dumps({**head, "mac": sign(secret, nonce, head)}).encode() + b"\n")
        s.sendall(b"u" + struct.pack("!Q", 4 << 20) + bytes(4 << 20))  # more than one read: timed
        assert f.read(1) == b"k"
        threading.Timer(0.3, lambda: s.sendall(b"q")).start()  # the q comes after close() began
        server.close()
    assert [(x["a"], x["b"], x["round"]) for x in server.served] == [("worker:0", "worker:1", 1)]


def test_a_flood_cannot_evict_a_task_between_its_nonce_and_its_answer():
    """A task's connection between the nonce it got and the head it sends looks like an idle stranger's:
    a flood made room by closing it (the oldest), so a loaded task lost its probe. Now a newcomer is
    closed unheard (a task's dialer retries that) while every idle one is younger than GRACE_S."""
    secret = b"s" * 32
    (port,) = _ports(1)
    server = ProbeServer(
        "127.0.0.1", port, secret, "worker:1", ["worker:0", "worker:1"], None, time.monotonic() + 30, 2
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as task:
            f = task.makefile("rb")
            nonce = json.loads(f.readline())["nonce"]
            strangers = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(6)]
            heard = [s.recv(4096) for s in strangers]  # the first gets a nonce; the others are closed
            assert [bool(h) for h in heard] == [True] + [False] * 5
            head = {"op": "probe", "rank": 0, "round": 1}
            task.sendall(json.dumps({**head, "mac": sign(secret, nonce, head)}).encode() + b"\n")
            task.sendall(b"p" + bytes(63))
            assert f.read(64)[-1:] == b"p"  # still served: the flood did not take its place
            task.sendall(b"q")
            for s in strangers:
                s.close()
    finally:
        server.close()
    assert server.refused == 5
