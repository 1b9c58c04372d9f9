"""worker_entry's Kubernetes mode, run for real as three "pods" on the network-namespace test bed.

Each pod is a test bed host (its own network namespace and address) running exactly the container
the JobSet rendering describes — its ``command`` + ``args``, its ``env`` with the downward-API
fields filled in the way the JobSet and Job controllers do (``restart-attempt``,
``JOB_COMPLETION_INDEX``), the pod's hostname (``unshare --uts``) — and the stable DNS names of the
headless Service resolve through a per-namespace ``/etc/hosts`` (``ip netns exec`` mounts
``/etc/netns/NS/hosts``). One deviation, stated: the pod's emptyDir ``/tfcluster`` is a directory
per pod here (the env values that name it point there). The pods' combined output is what the
kubelet would log; the launcher side reads it through the same ``PodChannel``/``PodStream`` as for
the API and the real ``Supervisor`` runs the attempt. A real 3-worker MWMS training (tf_keras).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conftest import assert_no_job_processes
from k8s_fake import workload
from supervising import Recorder
from testbed_fixtures import requires_netns
from waiting import wait_for

from orchestrator.backends import Backend
from orchestrator.core.states import JobState, TaskState
from orchestrator.events import EventBus
from orchestrator.schedulers.kubernetes import kubernetes_plan
from orchestrator.schedulers.kubernetes.channel import PodChannel
from orchestrator.schedulers.kubernetes.stream import ContainerEnd
from orchestrator.spec import load_spec_text
from orchestrator.supervise import Interrupt, Supervisor
from tfcluster_testbed import base

pytestmark = [pytest.mark.e2e, requires_netns, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parent.parent
PS_ARGS = ["--log-every", "10", "--steps", "240", "--step-ms", "40"]
EMPTYDIR = re.compile(r"(?<![\w/])/tfcluster(?=/|\"|$)")


def fieldref(path: str, annotations: dict[str, str]) -> str:
    m = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path)
    assert m, f"unexpected downward API field {path}"
    return annotations.get(m.group(1), "")


class LocalPods(Backend):
    """Starts each task's container as a process in its test bed host (the plan's rank k: host k); its
    stdout+stderr is the pod log. A task restarted in place gets a new "pod" on the same host, with the
    same hostname and a fresh emptyDir: what its Job controller does for a PS worker's failed pod."""

    name = "local-pods"
    transfers = False
    restarts_tasks = True

    def __init__(self, tb, jobset: dict, names: list[str], workdir: Path, tasks: list[str] | None = None) -> None:
        self.tb, self.jobset, self.names, self.workdir = tb, jobset, names, workdir
        self.slots = {t: k for k, t in enumerate(tasks or [f"worker:{i}" for i in range(len(names))])}
        self.procs: dict[str, subprocess.Popen] = {}  # task -> its newest pod's process
        self.pods: dict[str, subprocess.Popen] = {}  # pod name -> process
        self.envs: dict[str, dict[str, str]] = {}

    def connect(self, nodes):
        return []

    def start_all(self, starts, deliver):
        for node, _ in starts:
            deliver(str(node.task), self._pod(node, f"pod-{self.slots[str(node.task)]}"))
        return threading.Thread(target=lambda: None)

    def restart_task(self, node, config, deliver, placement) -> None:
        k = self.slots[str(node.task)]
        n = sum(name.startswith(f"pod-{k}") for name in self.pods)
        deliver(str(node.task), self._pod(node, f"pod-{k}-r{n}"))

    def _pod(self, node, pod: str) -> PodChannel:
        k = self.slots[str(node.task)]
        i = node.task.index
        host = self.tb.hosts[k]
        rj = next(r for r in self.jobset["spec"]["replicatedJobs"] if r["name"] == node.task.type)
        template = rj["template"]["spec"]["template"]
        container = template["spec"]["containers"][0]
        # what the JobSet and Job controllers put on the pod (jobset_controller.go labelAndAnnotateObject)
        annotations = {
            **template["metadata"].get("annotations", {}),
            "jobset.sigs.k8s.io/restart-attempt": "0",
            "batch.kubernetes.io/job-completion-index": str(i),
        }
        emptydir = self.workdir / pod / "tfcluster"
        emptydir.mkdir(parents=True)
        env = {"PATH": os.environ["PATH"], "HOME": str(self.workdir), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
        for e in container["env"]:
            value = e["value"] if "value" in e else fieldref(e["valueFrom"]["fieldRef"]["fieldPath"], annotations)
            env[e["name"]] = EMPTYDIR.sub(str(emptydir), value)
        env["JOB_COMPLETION_INDEX"] = str(i)  # set by the Job controller for Indexed Jobs
        env[base.MARKER_ENV] = self.tb.marker(host)  # the test bed's leftover check finds strays
        self.envs[str(node.task)] = env
        pod_hostname = self.names[k].split(".")[0]
        argv = [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            pod_hostname,
            *container["command"],
            *container["args"],
        ]
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        self.procs[str(node.task)] = self.pods[pod] = proc
        chan = PodChannel(str(node.task), pod, self._kubelet_stop, 5.0)
        threading.Thread(target=self._follow, args=(proc, chan), daemon=True).start()
        return chan

    def _follow(self, proc: subprocess.Popen, chan: PodChannel) -> None:
        while data := proc.stdout.read1(65536):
            chan.feed(data)
        rc = proc.wait()
        chan.finish(ContainerEnd(chan.pod, rc, "Completed" if rc == 0 else "Error"))

    def _kubelet_stop(self, pod: str, grace_s: int) -> None:
        proc = self.pods[pod]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()

    def close(self) -> None:
        for proc in self.pods.values():  # a container that reported its exit ends by itself
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def pod_dns():
    """/etc/netns/NS/hosts files (bind-mounted over /etc/hosts by `ip netns exec`), removed after."""
    made: list[Path] = []

    def install(netns: str, entries: dict[str, str]) -> None:
        d = Path("/etc/netns") / netns
        assert not d.exists(), f"{d} exists already"
        d.mkdir(parents=True)
        made.append(d)
        lines = ["127.0.0.1 localhost"] + [f"{addr} {name} {name.split('.')[0]}" for name, addr in entries.items()]
        (d / "hosts").write_text("\n".join(lines) + "\n")

    yield install
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only if we were the ones who needed it


def test_three_pods_train_mwms_from_the_rendered_jobset(testbed_factory, pod_dns, tmp_path):
    tb = testbed_factory(3, mode="netns")
    spec_doc = {
        "version": 1,
        "name": "mwms",
        "scheduler": "kubernetes",
        "kubernetes": {"namespace": "ml", "image": "tf-train:local", "workers": 3, "flavor": "jobset"},
        "tensorflow": {"port": tb.hosts[0].tf_port, "communication": "ring"},
        "job": {
            "python": sys.executable,
            "command": [
                sys.executable,
                "-m",
                "worker_entry.examples.keras_synthetic",
                "--epochs",
                "2",
                "--steps-per-epoch",
                "15",
            ],
            "startup_timeout_s": 120,
        },
        "heartbeat": {"interval_s": 0.5, "timeout_s": 30, "profile_interval_s": 0},
    }
    loaded = load_spec_text(yaml.safe_dump(spec_doc), "pods.yaml")
    plan = kubernetes_plan(loaded.spec, run_id="pods-1")
    (jobset,) = workload(loaded.spec, plan)
    names = [n.host for n in plan.nodes]
    assert names == [f"mwms-worker-0-{i}.mwms" for i in range(3)]
    for h in tb.hosts:
        pod_dns(h.netns, {name: host.address for name, host in zip(names, tb.hosts, strict=True)})

    backend = LocalPods(tb, jobset, names, tmp_path)
    rec = Recorder()
    sup = Supervisor(
        loaded.spec, plan, backend, attempt=0, bus=EventBus([rec]), logs=rec, heartbeats=rec, interrupt=Interrupt()
    )
    try:
        res = sup.run()
    finally:
        backend.close()
    out = {t: rec.lines.get(t, b"").decode(errors="replace") for t in ("worker:0", "worker:1", "worker:2")}
    assert res.state == JobState.SUCCEEDED, (res.root_cause, {t: o[-3000:] for t, o in out.items()})
    assert {t: r.state for t, r in res.tasks.items()} == {f"worker:{i}": TaskState.SUCCEEDED for i in range(3)}

    for i in range(3):
        task = f"worker:{i}"
        assert re.search(rf"\[{task}\] epoch 2/2 ", out[task]), out[task][-2000:]
        # the pod built the plan's TF_CONFIG from its index and the stable names
        hello = next(e for e in rec.events if e.event == "task_ready" and e.task == task)
        assert hello.hostname == f"mwms-worker-0-{i}"
        assert backend.procs[task].returncode == 0
    # progress reached the launcher through the pod log: heartbeats with training steps
    steps = [r.get("progress", {}).get("steps", 0) for t, r in rec.beats if t == "worker:1"]
    assert max(steps) >= 15
    # the chief (worker 0) saved its checkpoint into the pod's emptyDir (TFCLUSTER_CHECKPOINT_DIR)
    assert any((tmp_path / "pod-0" / "tfcluster" / "checkpoints").iterdir())
    pod_config = json.loads(backend.envs["worker:2"]["TFCLUSTER_POD"])
    assert pod_config["config"]["cluster"] == plan.nodes[2].tf_config["cluster"]
    assert_no_job_processes(tb)


def _ps_pods(tb, pod_dns, tmp_path, steps: int):
    """A PS job (chief, two workers, a ps) as "pods" from its rendered JobSet, and its supervisor."""
    spec_doc = {
        "version": 1,
        "name": "psk",
        "scheduler": "kubernetes",
        "kubernetes": {"namespace": "ml", "image": "tf-train:local", "roles": {"chief": 1, "worker": 2, "ps": 1}},
        "tensorflow": {"port": tb.hosts[0].tf_port, "strategy": "parameter_server"},
        "job": {
            "python": sys.executable,
            "command": [sys.executable, "-m", "worker_entry.examples.ps_coordinator", *PS_ARGS, "--steps", str(steps)],
            "startup_timeout_s": 120,
        },
        "heartbeat": {"interval_s": 0.5, "timeout_s": 30, "profile_interval_s": 0},
        "restart": {"max_task_restarts": 2},
    }
    loaded = load_spec_text(yaml.safe_dump(spec_doc), "pods.yaml")
    plan = kubernetes_plan(loaded.spec, run_id="pods-ps")
    (jobset,) = workload(loaded.spec, plan)
    names = [n.host for n in plan.nodes]
    tasks = [str(n.task) for n in plan.nodes]
    assert tasks == ["chief:0", "worker:0", "worker:1", "ps:0"]
    for h in tb.hosts:
        pod_dns(h.netns, {name: host.address for name, host in zip(names, tb.hosts, strict=True)})
    backend = LocalPods(tb, jobset, names, tmp_path, tasks)
    rec = Recorder()
    sup = Supervisor(
        loaded.spec, plan, backend, attempt=0, bus=EventBus([rec]), logs=rec, heartbeats=rec, interrupt=Interrupt()
    )
    return tasks, backend, rec, sup


def _run_and_kill(sup, backend, rec, task: str, killed: list[int]):
    """Run the attempt; SIGKILL ``task``'s training process once the coordinator did 20 steps."""

    def kill() -> None:
        wait_for(lambda: b"step 20/" in rec.lines.get("chief:0", b""), 240, "the coordinator's step 20", interval=0.2)
        pid = next((e.pid for e in list(rec.events) if e.event == "task_spawned" and e.task == task), None)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        return sup.run()
    finally:
        killer.join(5)
        backend.close()


def test_a_ps_job_from_the_rendered_jobset_survives_a_worker_sigkill(testbed_factory, pod_dns, tmp_path):
    """kubernetes.roles: chief, two workers and a ps, each "pod" running its role's container from the
    rendered JobSet; a real ClusterCoordinator loop. worker:1's training process is SIGKILLed mid-run:
    its "pod" fails and a new one with the same completion index (same hostname, same TF_CONFIG entry)
    replaces it, as its Job's controller does; it rejoins and the chief trains to the end."""
    tb = testbed_factory(4, mode="netns")
    tasks, backend, rec, sup = _ps_pods(
        tb, pod_dns, tmp_path, 600
    )  # ~12-23 s after the kill: its restart is back before
    killed: list[int] = []
    res = _run_and_kill(sup, backend, rec, "worker:1", killed)
    out = {t: rec.lines.get(t, b"").decode(errors="replace") for t in tasks}
    assert killed, {t: o[-2000:] for t, o in out.items()}
    assert res.state == JobState.SUCCEEDED, (res.root_cause, {t: o[-3000:] for t, o in out.items()})
    (rf,) = rec.kinds("role_failure")
    assert (rf.task, rf.kind, rf.action, rf.restarts) == ("worker:1", "signal", "restart", 1)
    assert "step 600/600" in out["chief:0"]
    assert out["worker:1"].count("server up at") == 2  # it came back, at the same name and port
    hellos = [e.hostname for e in rec.events if e.event == "task_ready" and e.task == "worker:1"]
    assert hellos == ["psk-worker-0-1", "psk-worker-0-1"]
    assert "pod-2-r1" in backend.pods  # a new pod, not the old one restarted
    assert res.tasks["chief:0"].state == TaskState.SUCCEEDED
    assert {res.tasks[t].state for t in ("worker:0", "worker:1", "ps:0")} == {TaskState.STOPPED}
    assert_no_job_processes(tb)


def test_a_ps_pod_sigkilled_tears_the_job_down_with_the_ps_as_root_cause(testbed_factory, pod_dns, tmp_path):
    tb = testbed_factory(4, mode="netns")
    _, backend, rec, sup = _ps_pods(tb, pod_dns, tmp_path, 100000)
    killed: list[int] = []
    res = _run_and_kill(sup, backend, rec, "ps:0", killed)
    assert killed
    assert res.state == JobState.FAILED
    rc = res.root_cause
    assert (rc.task, rc.kind, rc.signal) == ("ps:0", "signal", "SIGKILL"), rc
    assert not rec.kinds("role_failure") and list(backend.pods) == ["pod-0", "pod-1", "pod-2", "pod-3"]
    assert {res.tasks[t].state for t in ("chief:0", "worker:0", "worker:1")} == {TaskState.STOPPED}
    assert_no_job_processes(tb)
