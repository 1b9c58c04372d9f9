"""The pod log as a channel, piece by piece: the line format both sides share, the launcher's parser
and go barrier (``PodStream``), resumable timestamps, the in-pod config, and what pod statuses mean."""

from __future__ import annotations

import json

import pytest
from k8s_fake import exited_line, hello, msg_line, recorded

from orchestrator.core.states import TaskState
from orchestrator.schedulers.kubernetes import kubernetes_plan
from orchestrator.schedulers.kubernetes.channel import split_timestamp
from orchestrator.schedulers.kubernetes.pods import container_end, pod_view
from orchestrator.schedulers.kubernetes.stream import ContainerEnd, PodStream
from orchestrator.spec import load_spec_text
from orchestrator.supervise.session import Output, TaskSession, Violation
from worker_entry import protocol as p
from worker_entry.agent.child import child_env
from worker_entry.agent.modes.kubernetes import pod_node_config
from worker_entry.protocol.podlog import decode_line, encode_message, encode_output

SPAWNED = msg_line(p.Spawned(pid=7))
STARTED = msg_line(p.Started(how="strategy"))


@pytest.mark.parametrize(
    "line",
    [
        b"plain",
        b"@tfcluster {}",
        b"@@tfcluster x",
        b"@@@tfcluster",
        b"@tfclusterish",
        b"@ tfcluster",
        b"",
        b"tfcluster",
    ],
)
def test_user_lines_round_trip_and_never_read_as_messages(line):
    (encoded,) = encode_output(line + b"\n").splitlines()
    assert decode_line(encoded) == (False, line)


def test_messages_are_one_marked_line():
    line = encode_message(b'{"type":"spawned","pid":7}')
    assert line.count(b"\n") == 1 and decode_line(line[:-1]) == (True, b'{"type":"spawned","pid":7}')


def session_for() -> TaskSession:
    """A real TaskSession fed what the stream released."""
    text = "version: 1\nname: s\nscheduler: kubernetes\nkubernetes: {image: x, workers: 1}\njob: {command: [t]}\n"
    plan = kubernetes_plan(load_spec_text(text).spec, run_id="r")
    s = TaskSession(plan.nodes[0])
    s.attach(object())  # type: ignore[arg-type]
    return s


def feed(stream: PodStream, *lines: bytes) -> None:
    for line in lines:
        stream.feed(line)


def test_frames_wait_for_the_go_then_come_in_order():
    st = PodStream("pod-0")
    feed(st, b"before hello\n", hello("worker:0"), SPAWNED, b"tf says hi\n", STARTED)
    out, err = st.take()
    assert err == b"before hello\n"  # worker_entry's own output: where a start failure is diagnosed
    s = session_for()
    kinds = [type(x).__name__ for x in s.receive(out, b"")]
    assert kinds == ["Hello"] and s.facts is not None and s.skew_s is None  # an old hello: no skew
    st.command(p.Go())
    s.go_sent = True
    items = s.receive(st.take()[0], b"")
    assert [type(x).__name__ for x in items] == ["Spawned", "Output", "Started"]
    assert not any(isinstance(x, Violation) for x in items)


def test_a_stop_before_the_go_drops_only_what_a_stopping_task_cannot_say():
    st = PodStream("pod-0")
    feed(st, hello("worker:0"), SPAWNED, b"out\n", STARTED)
    s = session_for()
    assert [type(x).__name__ for x in s.receive(st.take()[0], b"")] == ["Hello"]
    st.command(p.Stop(grace_s=0))
    s.state, s.stop_sent = TaskState.STOPPING, True  # what the supervisor's teardown does
    feed(st, exited_line(None, 15, True, "stopped"))
    items = s.receive(st.take()[0], b"")
    assert [type(x).__name__ for x in items] == ["Output", "Started", "Exited"]
    assert s.finish(items[-1], job_stopping=True) == TaskState.STOPPED


def test_a_pod_that_ends_before_the_go_reports_its_exit_at_once():
    st = PodStream("pod-0")
    feed(st, hello("worker:0"), SPAWNED, b"Traceback: boom\n", exited_line(1))
    s = session_for()
    items = s.receive(st.take()[0], b"")
    assert [type(x).__name__ for x in items] == ["Hello", "Output", "Exited"]
    assert not any(isinstance(x, Violation) for x in items)


def test_output_held_before_the_go_is_bounded():
    st = PodStream("pod-0", hold_limit=1000)
    feed(st, hello("worker:0"), SPAWNED, *[b"x" * 99 + b"\n"] * 50, exited_line(0))
    out, err = st.take()
    assert b"bytes of this pod's output" in err and len(out) < 3000
    assert b'"type":"exited"' in out


def test_a_stop_nobody_asked_for_is_quarantined_until_the_supervisors_stop():
    st = PodStream("pod-0")
    feed(st, hello("worker:0"), SPAWNED)
    st.command(p.Go())
    st.take()
    feed(st, msg_line(p.Stopping(reason="worker_entry received SIGTERM")), exited_line(None, 15, True))
    assert st.take() == (b"", b"") and st.quarantine
    st.command(p.Stop(grace_s=1))  # the supervisor's teardown reached it: now it is a stopped task
    out, _ = st.take()
    assert b'"type":"stopping"' in out and b'"type":"exited"' in out and st.quarantine is None


def test_the_container_status_speaks_when_worker_entry_could_not():
    st = PodStream("pod-0")
    feed(st, hello("worker:0"), SPAWNED)
    st.command(p.Go())
    st.end(ContainerEnd("pod-0", 137, "OOMKilled", "the container exceeded its memory limit"))
    out, err = st.take()
    frames = p.FrameDecoder(synced=True).feed(out[out.index(b"\x00\n") + 2 :]) if p.MARKER in out else []
    exited = [p.parse_message(f.payload) for f in frames if f.type == p.T_MSG][-1]
    assert isinstance(exited, p.Exited) and exited.code == 137 and exited.reason == "OOMKilled"
    assert "OOMKilled" in exited.error and b"exit code 137" in err


def test_malformed_messages_are_noted_not_fatal_and_out_of_order_ones_are_violations():
    st = PodStream("pod-0")
    feed(st, hello("worker:0"), b"@tfcluster {nope\n", b'@tfcluster {"type":"heartbeat","seq":"1"}\n')
    st.command(p.Go())
    feed(st, SPAWNED, SPAWNED)
    out, err = st.take()
    assert err.count(b"ignored a malformed protocol line") == 2
    s = session_for()
    s.go_sent = True
    items = s.receive(out, b"")
    assert isinstance(items[-1], Violation) and "out of order: 'spawned'" in items[-1].error  # order: the session's


def test_a_line_longer_than_a_frame_is_cut_not_fatal():
    st = PodStream("pod-0")
    feed(st, hello("worker:0"))
    st.command(p.Go())
    st.feed(b"y" * (9 << 20))
    st.end(None)
    s = session_for()
    s.go_sent = True
    items = s.receive(st.take()[0], b"")
    assert not any(isinstance(x, Violation) for x in items)
    assert sum(len(x.data) for x in items if isinstance(x, Output)) == (9 << 20) + 3  # three cut lines


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"2026-11-23T10:00:00.123456789Z hi", ((1795428000.0, 123456789), b"hi")),
        (b"2026-11-23T10:00:00.5Z hi", ((1795428000.0, 500000000), b"hi")),
        (b"2026-11-23T10:00:00Z @tfcluster {}", ((1795428000.0, 0), b"@tfcluster {}")),
        (b"no timestamp here", (None, b"no timestamp here")),
    ],
)
def test_log_timestamps_are_split_off_for_resuming(line, expected):
    assert split_timestamp(line) == expected


def pod_json(task_type: str, cluster: dict, **more) -> str:
    """A PodConfig (version 2): its task type's NodeConfig as the launcher renders it."""
    config = {"argv": [], "remote_dir": "", "job": "j", "task": {"type": task_type, "index": 0}, "cluster": cluster}
    return json.dumps({"v": 2, "config": config, "remote_dir": "/tfcluster", **more})


POD_ENV = {
    "TFCLUSTER_POD": pod_json("worker", {"chief": ["c-0.j:1"], "worker": ["w-0.j:1", "w-1.j:1"]}),
    "JOB_COMPLETION_INDEX": "1",
    "TFCLUSTER_ATTEMPT": "2",
}


def test_a_pod_finds_its_task_from_its_completion_index():
    config = pod_node_config(["python", "t.py"], POD_ENV)
    assert (config.task.type, config.task.index, config.attempt) == ("worker", 1, 2)
    assert json.loads(child_env(config, base={})["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert config.env["TFCLUSTER_IS_CHIEF"] == "0" and config.remote_dir == "/tfcluster/worker-1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"JOB_COMPLETION_INDEX": None}, "JOB_COMPLETION_INDEX is not set"),
        ({"JOB_COMPLETION_INDEX": "2"}, "cluster has 2 worker task(s)"),
        ({"JOB_COMPLETION_INDEX": "-1"}, "not a non-negative integer"),
        ({"TFCLUSTER_POD": None}, "not rendered by tfcluster"),
        ({"TFCLUSTER_POD": "[1]"}, "not a JSON object"),
        ({"TFCLUSTER_POD": pod_json("boss", {})}, "config.task.type"),
        ({"TFCLUSTER_POD": pod_json("ps", {})}, "the cluster has 0 ps task"),
        ({"TFCLUSTER_POD": pod_json("evaluator", {})}, "the job has 0 evaluator"),
        (  # rendered by a tfcluster before PodConfig 2
            {"TFCLUSTER_POD": '{"job":"j","task_type":"worker","cluster":{},"remote_dir":"/x"}'},
            "version 1, but this worker_entry reads version 2: render the manifests again",
        ),
    ],
)
def test_a_badly_configured_pod_says_what_is_wrong(change, message):
    env = {k: v for k, v in {**POD_ENV, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pod_node_config(["t"], env)


def pod_with(status_file: str) -> dict:
    pod = recorded("pod.json")
    pod["metadata"]["name"] = "j-worker-0-1-abcde"
    pod["metadata"]["labels"].update({"tfcluster/task-type": "worker", "jobset.sigs.k8s.io/restart-attempt": "3"})
    pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = "1"
    pod["status"] = recorded(status_file)
    return pod


@pytest.mark.parametrize(
    ("status", "started", "fatal", "problem"),
    [
        ("status-pending-creating.json", False, False, None),
        ("status-unschedulable.json", False, False, "Unschedulable: 0/3 nodes are available"),
        ("status-image-pull-backoff.json", False, True, "ImagePullBackOff: Back-off pulling image"),
        ("status-running.json", True, False, None),
        ("status-oomkilled.json", True, False, None),
    ],
)
def test_pod_statuses_read_as_tfcluster_needs_them(status, started, fatal, problem):
    v = pod_view(pod_with(status), "jobset")
    assert (str(v.task), v.attempt, v.started, v.fatal) == ("worker:1", 3, started, fatal)
    assert (problem is None and v.problem is None) or (problem and problem in v.problem)


def test_an_oom_kill_reads_as_its_reason_with_a_hint():
    end = container_end(pod_with("status-oomkilled.json"))
    assert (end.exit_code, end.reason) == (137, "OOMKilled") and "kubernetes.limits.memory" in end.message
    assert container_end(pod_with("status-running.json")) is None
