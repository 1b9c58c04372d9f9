"""`tfcluster check`'s judgement on synthetic figures (scores, slow host vs slow link, nccl-tests' busbw),
its pairing rounds, the node line, the exit codes and the spec's check: section."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from orchestrator.cli.exitcodes import EXIT_CHECK_FINDINGS, EXIT_CONNECT, EXIT_JOB_FAILED, EXIT_OK, exit_code_for_check
from orchestrator.core.errors import SpecError
from orchestrator.events import EVENT_TYPES
from orchestrator.job.check import parse_line
from orchestrator.job.checkjudge import busbw_factor, check_text, judge
from orchestrator.spec import load_spec
from worker_entry.check.links import first_pairs, link_rounds, next_pairs
from worker_entry.check.main import peers_from_tf_config

HOSTS = {f"worker:{i}": f"10.0.0.{i + 1}" for i in range(4)}
GB = 1e9


def _node(task: str, gflops: float, links: list[tuple[str, float]] = (), **extra):
    return {
        "task": task,
        "gflops": gflops,
        "device": "CPU",
        "gpus": [],
        "workers": 4,
        "communication": "ring",
        "links": [{"a": task, "b": b, "round": 1, "latency_s": 20e-6, "bandwidth_Bps": bw} for b, bw in links],
        "allreduce": [{"bytes": 1 << 20, "latency_s": 0.01}],
        **extra,
    }


def _four(gflops=(100, 100, 100, 100), bw=None):
    """Four hosts; links of rounds 1 and 2: 0-1, 2-3, 0-3, 1-2 (bandwidth by pair)."""
    bw = {"01": GB, "23": GB, "03": GB, "12": GB, **(bw or {})}
    links = {
        "worker:0": [("worker:1", bw["01"]), ("worker:3", bw["03"])],
        "worker:1": [("worker:2", bw["12"])],
        "worker:2": [("worker:3", bw["23"])],
        "worker:3": [],
    }
    return _served({t: _node(t, g, links[t]) for t, g in zip(HOSTS, gflops, strict=True)})


def _served(nodes):
    """Each link's server reports what it timed of the upload (an honest server: the client's figure)."""
    for n in list(nodes.values()):
        for link in n["links"]:
            if link["b"] in nodes:
                nodes[link["b"]].setdefault("served", []).append(
                    {"a": link["a"], "b": link["b"], "round": link["round"], "up_Bps": link["bandwidth_Bps"]}
                )
    return nodes


def test_healthy_figures_name_nothing():
    check = judge(_four(gflops=(100, 92, 108, 97)), HOSTS)
    assert check["findings"] == []
    assert [round(h["score"], 2) for h in check["hosts"]] == [1.02, 0.93, 1.1, 0.98]
    assert "nothing named" in check_text(check)


def test_slow_host_is_named_with_its_figure_and_the_median():
    check = judge(_four(gflops=(100, 100, 30, 100)), HOSTS)
    (f,) = check["findings"]
    assert (f["code"], f["subject"], f["figure"], f["median"], f["task"]) == (
        "slow_host",
        "10.0.0.3",
        30,
        100,
        "worker:2",
    )
    assert "0.30x the median host" in f["what"]


def test_a_host_whose_every_link_is_slow_is_a_slow_link_not_a_slow_host():
    check = judge(_four(bw={"23": 5e6, "12": 5e6}), HOSTS)  # host 2's links (to 3 and to 1)
    (f,) = check["findings"]
    assert (f["code"], f["subject"], f["figure"], f["median"]) == ("slow_link", "10.0.0.3", 5e6, GB)
    assert "its compute is normal" in f["what"]
    assert check["network"] == {"latency_s": 20e-6, "bandwidth_Bps": 5e6, "link": "10.0.0.2<->10.0.0.3"}


def test_a_slow_host_with_slow_links_is_named_once_as_the_host():
    check = judge(_four(gflops=(100, 100, 20, 100), bw={"23": 5e6, "12": 5e6}), HOSTS)
    (f,) = check["findings"]
    assert f["code"] == "slow_host" and "the host, not the network" in f["what"]


def test_a_slow_link_between_two_fine_hosts_is_named_as_the_pair():
    check = judge(_four(bw={"03": 5e6}), HOSTS)  # 0 and 3 each have another good link
    (f,) = check["findings"]
    assert (f["code"], f["subject"], f["task"]) == ("slow_link", "10.0.0.1<->10.0.0.4", None)


def test_a_task_without_figures_is_named():
    nodes = _four()
    nodes["worker:1"] = {"task": "worker:1", "error": "the check's deadline (60 s) passed", "links": []}
    del nodes["worker:3"]
    codes = [(f["code"], f["subject"]) for f in judge(nodes, HOSTS)["findings"]]
    assert codes == [("no_result", "10.0.0.2"), ("no_result", "10.0.0.4")]


def test_slow_gpu_names_the_host_and_its_slowest_gpu():
    nodes = _four(gflops=(400, 400, 150, 400))
    for n in nodes.values():
        n["device"] = "GPU"
        n["gpus"] = [{"device": "/device:GPU:0", "gflops": n["gflops"]}, {"device": "/device:GPU:1", "gflops": 400}]
    (f,) = judge(nodes, HOSTS)["findings"]
    assert (f["code"], f["subject"]) == ("slow_gpu", "10.0.0.3 /device:GPU:0")


def test_allreduce_bandwidths_follow_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: algbw = S/t, busbw = algbw * 2(n-1)/n for all-reduce
    assert busbw_factor(2) == 1.0 and busbw_factor(4) == 1.5 and busbw_factor(8) == 1.75 and busbw_factor(1) == 1.0
    (row,) = judge(_four(), HOSTS)["allreduce"]
    assert row["algbw_GBps"] == pytest.approx((1 << 20) / 0.01 / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 1.5)
    assert row["ranks"] == 4 and row["communication"] == "ring"


def test_two_hosts_report_their_link_but_cannot_pin_it():
    hosts = {"worker:0": "a", "worker:1": "b"}
    nodes = {"worker:0": _node("worker:0", 100, [("worker:1", 1e6)]), "worker:1": _node("worker:1", 100)}
    check = judge(nodes, hosts)
    assert check["findings"] == [] and check["links"][0]["bandwidth_Bps"] == 1e6


def test_pairing_rounds_give_every_host_two_partners():
    assert first_pairs(3) == [(0, 1)] and first_pairs(8) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    # four hosts, (0,1) slow: the slowest meet the fastest (DLRover's second round)
    assert next_pairs(4, {0: 1, 1: 1, 2: 9, 3: 9}, {0: {1}, 1: {0}, 2: {3}, 3: {2}}, 2) == [(0, 3), (1, 2)]
    # three hosts: the unmeasured one first, then the pair that is still missing
    assert next_pairs(3, {0: 5, 1: 5}, {0: {1}, 1: {0}}, 2) == [(1, 2)]
    assert next_pairs(3, {0: 5, 1: 5, 2: 5}, {0: {1}, 1: {0, 2}, 2: {1}}, 3) == [(0, 2)]
    assert next_pairs(4, {}, {0: {1, 3}, 1: {0, 2}, 2: {1, 3}, 3: {0, 2}}, 3) == []


def _free_ports(n: int) -> list[int]:
    """TF-like ports: below the ephemeral range, so no client's own port can be one of them."""
    from tfcluster_testbed.net import _pick_tf_ports

    return _pick_tf_ports(n, None)


def test_link_rounds_on_loopback_measure_every_pair_and_free_the_ports():
    peers = [(f"worker:{i}", "127.0.0.1", p) for i, p in enumerate(_free_ports(3))]
    found: dict[int, list] = {}
    threads = [
        threading.Thread(
            target=lambda r=r: found.__setitem__(r, link_rounds(peers, r, time.monotonic() + 30, b"s" * 32))
        )
        for r in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    links = sorted((x["a"], x["b"]) for r in found.values() for x in r["links"])
    assert links == [("worker:0", "worker:1"), ("worker:0", "worker:2"), ("worker:1", "worker:2")]
    assert all(x["bandwidth_Bps"] > 0 and 0 < x["latency_s"] < 1 for r in found.values() for x in r["links"])
    # every server timed what it received: the same three links, seen from their other end
    served = sorted((x["a"], x["b"]) for r in found.values() for x in r["served"])
    assert served == links and all(x["up_Bps"] > 0 for r in found.values() for x in r["served"])
    assert all(r["probe_bind"] == f"127.0.0.1:{peers[i][2]}" for i, r in found.items())
    for _, _, port in peers:  # TensorFlow's gRPC server binds the same port next (SO_REUSEADDR, as gRPC does)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            s.listen(1)


def test_node_line_and_tf_config():
    text = "noise\nTFCLUSTER_CHECK " + json.dumps({"task": "worker:1", "gflops": 3.0}) + "\nmore noise\n"
    assert parse_line(text) == {"task": "worker:1", "gflops": 3.0}
    assert parse_line("TFCLUSTER_CHECK [1]\n") is None and parse_line("TFCLUSTER_CHECK {bad\n") is None
    env = {
        "TF_CONFIG": json.dumps(
            {
                "cluster": {"worker": ["h1:2000", "h2:2000"], "chief": ["h0:2000"]},
                "task": {"type": "worker", "index": 1},
            }
        )
    }
    peers, rank = peers_from_tf_config(env)
    assert peers == [("chief:0", "h0", 2000), ("worker:0", "h1", 2000), ("worker:1", "h2", 2000)] and rank == 2


def test_exit_codes_of_a_check():
    assert exit_code_for_check("succeeded", 0) == EXIT_OK
    assert exit_code_for_check("succeeded", 2) == EXIT_CHECK_FINDINGS == 6
    assert exit_code_for_check("failed", 1) == EXIT_CHECK_FINDINGS  # a task without figures is named
    assert exit_code_for_check("failed", 0) == EXIT_JOB_FAILED
    assert exit_code_for_check("connect_failed", 0) == EXIT_CONNECT


def test_check_finding_is_a_typed_event():
    cls = EVENT_TYPES["check_finding"]
    line = cls(
        message="slow link: h2", code="slow_link", subject="h2", figure=5e6, median=1e9, task="worker:2", host="h2"
    ).to_dict()
    assert cls.from_dict(json.loads(json.dumps(line))).subject == "h2"


def test_spec_check_section(tmp_path):
    base = "version: 1\nname: c\nhosts: [{address: h1}]\njob: {command: [python, t.py]}\n"
    p = tmp_path / "s.yaml"
    p.write_text(base + "check: {timeout_s: 30, without_named_hosts: true}\n")
    spec = load_spec(str(p)).spec
    assert spec.check.timeout_s == 30 and spec.check.without_named_hosts is True
    p.write_text(base + "check: {timeout_s: -1, on_finding: drop}\n")
    with pytest.raises(SpecError) as exc:
        load_spec(str(p))
    fields = {d.field for d in exc.value.problems}
    assert {"check.timeout_s", "check.on_finding"} <= fields, fields


def test_without_named_hosts_leaves_them_out_or_refuses(tmp_path):
    from orchestrator.core.errors import UsageError
    from orchestrator.job.check import without_hosts

    p = tmp_path / "s.yaml"
    p.write_text(
        "version: 1\nname: c\nhosts: [{address: h1}, {address: h2}, {address: h3}]\njob: {command: [python, t.py]}\n"
    )
    loaded = load_spec(str(p))
    rows = [{"task": f"worker:{i}", "host": f"h{i + 1}"} for i in range(3)]
    said: list[str] = []
    host = {"code": "slow_link", "task": "worker:1", "subject": "h2"}
    kept = without_hosts(loaded, {"hosts": rows, "findings": [host]}, said.append)
    assert [h.address for h in kept.spec.hosts] == ["h1", "h3"] and "without h2" in said[0]
    pair = {"code": "slow_link", "task": None, "subject": "h1<->h3"}
    with pytest.raises(UsageError, match="not one host"):
        without_hosts(loaded, {"hosts": rows, "findings": [pair]}, said.append)
    every = [{"code": "no_result", "task": r["task"], "subject": r["host"]} for r in rows]
    with pytest.raises(UsageError, match="every host"):
        without_hosts(loaded, {"hosts": rows, "findings": every}, said.append)
