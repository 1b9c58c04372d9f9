"""A node that sends absurd numbers: every numeric field of the protocol has a range, and a value out of it
(a 401-digit integer, an infinity) is one ProtocolError naming the field — never an OverflowError that
takes the launcher, the Kubernetes log follower or a metrics scrape down."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import typing
import urllib.error
import urllib.request

import pytest
from fakenode import FakeBackend, FakeNode, make_plan, stopped
from k8s_fake import FakeCluster, exited_line, started_lines
from test_k8s_launch import launch as k8s_launch
from test_k8s_launch import log as k8s_log

from orchestrator.core.states import JobState
from orchestrator.job import Job, LaunchOptions
from orchestrator.sinks.metrics import JobMetrics, _Collector
from worker_entry import protocol as p
from worker_entry.protocol.podlog import encode_message
from worker_entry.protocol.schema import Record

HUGE = 10**400  # JSON allows it; float() of it raises OverflowError
ABSURD = [HUGE, -HUGE, float("inf")]


def _records() -> list[type[Record]]:
    """Every record the protocol carries, nested ones included."""
    roots: list[type] = [
        p.NodeConfig,
        p.ManifestReply,
        *p.NODE_MESSAGES.values(),
        *p.COMMANDS.values(),
        *p.TRANSFER_MESSAGES.values(),
    ]
    seen: list[type[Record]] = []
    while roots:
        cls = roots.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for tp in typing.get_type_hints(cls).values():
            stack = [tp]
            while stack:
                t = stack.pop()
                stack.extend(typing.get_args(t))
                if isinstance(t, type) and issubclass(t, Record):
                    roots.append(t)
    return seen


def _numeric_fields(cls: type) -> list[dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        args = set(typing.get_args(hints[f.name])) or {hints[f.name]}
        if args & {int, float}:
            out.append(f)
    return out


def test_every_numeric_field_of_the_protocol_has_a_range():
    unbounded = [
        f"{cls.__name__}.{f.name}"
        for cls in _records()
        for f in _numeric_fields(cls)
        if f.metadata.get("lo") is None or f.metadata.get("hi") is None
    ]
    assert unbounded == []


#: A valid instance of each node message, to put one absurd value into.
NODE_EXAMPLES = {
    "hello": {
        "type": "hello",
        "pid": 5,
        "remote_dir": "/x",
        "facts": {"gpus": [{"index": 0}], "disk": {"path": "/", "free_bytes": 1}},
    },
    "heartbeat": {"type": "heartbeat", "seq": 1, "progress": {"steps": 1}, "gpus": [{"index": 0}], "host": {}},
    "spawned": {"type": "spawned", "pid": 5},
    "strategy": {"type": "strategy"},
    "profile": {"type": "profile", "steps": 5},
    "exited": {"type": "exited"},
    "task_files": {"type": "task_files", "task_dir": {"root": "/x", "files": [{"path": "a", "size": 1}]}},
}


def _paths(cls: type, prefix: str, example: dict) -> list[tuple[str, dict]]:
    """(field path, the example with that field set to a placeholder) for every numeric field reachable."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f in _numeric_fields(cls):
            out.append((f"{prefix}{f.name}", {**example, f.name: "ABSURD"}))
            continue
        for t in typing.get_args(hints[f.name]) or (hints[f.name],):
            inner = typing.get_args(t)
            sub = inner[0] if typing.get_origin(t) is list and inner else t
            if isinstance(sub, type) and issubclass(sub, Record) and f.name in example:
                value = example[f.name]
                item = value[0] if isinstance(value, list) else value
                for path, changed in _paths(sub, f"{prefix}{f.name}.", item):
                    out.append((path, {**example, f.name: [changed] if isinstance(value, list) else changed}))
    return out


CASES = [
    (path, changed)
    for kind, example in NODE_EXAMPLES.items()
    for path, changed in _paths(p.NODE_MESSAGES[kind], f"{kind}.", {k: v for k, v in example.items() if k != "type"})
]


def _payload(changed: dict, kind: str, value: object) -> bytes:
    text = json.dumps({"type": kind, **changed}).replace('"ABSURD"', "1e999" if value == float("inf") else str(value))
    return text.encode()


def test_the_examples_reach_every_numeric_field_of_every_node_message():
    assert len(CASES) > 70
    assert {
        "heartbeat.cpu_pct",
        "heartbeat.progress.steps",
        "heartbeat.gpus.mem_used_mb",
        "hello.facts.disk.free_bytes",
        "task_files.task_dir.files.size",
        "exited.code",
    } <= {c[0] for c in CASES}


@pytest.mark.parametrize("value", ABSURD, ids=["huge", "-huge", "inf"])
@pytest.mark.parametrize(("path", "changed"), CASES, ids=[c[0] for c in CASES])
def test_an_absurd_number_is_a_protocol_error_naming_its_field(path, changed, value):
    payload = _payload(changed, path.split(".")[0], value)
    assert p.parse_message(json.dumps({"type": path.split(".")[0], **changed}).replace('"ABSURD"', "1").encode())
    with pytest.raises(p.ProtocolError) as err:
        p.parse_message(payload)
    field = path.replace(".gpus.", ".gpus[0].").replace(".files.", ".files[0].")
    assert err.value.field == field and str(err.value).startswith(field + ": expected")


def _huge_heartbeat(n: FakeNode) -> None:
    n.hello()
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=5))
    payload = b'{"type":"heartbeat","seq":1,"cpu_pct":' + str(HUGE).encode() + b"}"
    n.raw(p.HEADER.pack(p.T_MSG, 0, len(payload)) + payload)
    stopped(n, n.run_until_stopped())


def test_a_401_digit_number_fails_that_task_and_the_job_still_writes_its_result(tmp_path):
    """Through the real decoder, session, supervisor and job: the launcher survives, result.json names it,
    and the metrics endpoint answers every scrape meanwhile."""
    loaded, plan = make_plan(3, metrics={"port": 0})
    backend = FakeBackend({"worker:1": _huge_heartbeat})
    run = tmp_path / "run"
    job = Job(loaded, plan, LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False), backend)
    scrapes: list[int] = []

    def scrape() -> None:
        while not (run / "result.json").exists():
            info = json.loads((run / "launcher.json").read_text()) if (run / "launcher.json").exists() else {}
            if "metrics_url" in info:
                try:
                    with urllib.request.urlopen(info["metrics_url"], timeout=5) as r:
                        scrapes.append(r.status)
                except urllib.error.HTTPError as exc:
                    scrapes.append(exc.code)
                except OSError:
                    return  # the job ended and its server with it
            time.sleep(0.05)

    t = threading.Thread(target=scrape)
    t.start()
    result = job.run()
    t.join(30)
    assert result.state == JobState.FAILED
    data = json.loads((run / "result.json").read_text())
    assert data["root_cause"]["kind"] == "protocol" and data["root_cause"]["task"] == "worker:1"
    assert "heartbeat.cpu_pct: expected a value in [0, 10000000.0]" in data["root_cause"]["message"]
    assert set(scrapes) <= {200}


def test_a_scrape_never_fails_on_a_figure_that_is_not_a_number():
    m = JobMetrics("j", "r")
    m.update(
        {
            "state": "running",
            "attempt": HUGE,
            "tasks": {
                "worker:0": {
                    "host": "h",
                    "state": "running",
                    "steps": HUGE,
                    "cpu_pct": float("nan"),
                    "rss_mb": -HUGE,
                    "gpus": [{"index": 0, "util": float("inf"), "mem_used_mb": HUGE}],
                    "step_time_s": 0.5,
                }
            },
        }
    )
    m.profile("worker:0", {"step_ms": HUGE, "input_ms": 2.0})
    families = {f.name: f for f in _Collector(m).collect()}
    assert [s.value for s in families["tfcluster_task_step_seconds"].samples] == [0.5]
    assert (
        families["tfcluster_task_steps"].samples == []
        and families["tfcluster_task_gpu_utilization_ratio"].samples == []
    )
    assert [s.labels["part"] for s in families["tfcluster_task_step_part_seconds"].samples] == ["input"]


def test_the_kubernetes_log_follower_notes_an_absurd_number_and_goes_on(tmp_path):
    line = encode_message(b'{"type":"heartbeat","seq":1,"cpu_pct":' + str(HUGE).encode() + b"}")

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        name = pod["metadata"]["name"]
        cluster.append(name, *started_lines(pod["_task"]), line, b"after the absurd line\n", exited_line(0))
        cluster.end_pod(name, "status-succeeded.json")

    result, run, _ = k8s_launch(tmp_path, FakeCluster(behaviour=behaviour))
    assert result.state == JobState.SUCCEEDED, result.root_cause
    text = k8s_log(run, "worker-0")
    assert "ignored a malformed protocol line from the pod log: heartbeat.cpu_pct: expected a value" in text
    assert "after the absurd line" in text
