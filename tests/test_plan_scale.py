"""A plan at thousands of tasks (issue 33): planned in seconds, plan.json and the dry run linear in the
tasks, the TF_CONFIG each node builds accepted by TensorFlow's own resolver (sampled), and a 16,384-task
cluster inside the protocol's limits. Sizes and times at scale: bench/plan_scale.py, docs/benchmarks.md."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from orchestrator.plan.record import PlanRecord
from orchestrator.runs import RunDir, read_plan, write_plan
from orchestrator.schedulers import plan_spec, scheduler_for
from orchestrator.spec import load_spec_text
from worker_entry import protocol as p
from worker_entry.agent.child import child_env
from worker_entry.agent.modes import slurm as node_slurm
from worker_entry.protocol.env import ENV_STRING_MAX

#: 1,024 -> 4,096 tasks may grow plan.json and the dry run at most this much (4x is linear).
LINEAR = 5.0


def _slurm(n: int) -> str:
    """N tasks on N/4 nodes of 4 GPUs: one task per GPU."""
    slurm = {"nodes": n // 4, "tasks_per_node": 4, "gpus_per_node": 4}
    return yaml.safe_dump(
        {"version": 1, "name": f"s{n}", "scheduler": "slurm", "slurm": slurm, "job": {"command": ["t"]}}
    )


def _ssh(n: int) -> str:
    hosts = [{"address": f"node{i:05d}.cluster.example.org"} for i in range(n)]
    return yaml.safe_dump(
        {"version": 1, "name": f"h{n}", "hosts": hosts, "ssh": {"user": "u"}, "job": {"command": ["t"]}}
    )


def _sizes(text: str, tmp_path) -> tuple[object, dict[str, int]]:
    """The plan of a spec, and the bytes of its plan.json, its dry run and its dry run with --all."""
    loaded = load_spec_text(text)
    plan = plan_spec(loaded, "r1")
    scheduler = scheduler_for(loaded.spec)
    run = RunDir(tmp_path / f"run{len(plan.nodes)}")
    run.path.mkdir()
    write_plan(run, plan)
    sizes = {
        "plan.json": run.plan_json.stat().st_size,
        "plan": len(scheduler.describe(plan).encode()),
        "plan --all": len(scheduler.describe(plan, every_task=True).encode()),
    }
    assert read_plan(run) == PlanRecord.from_plan(plan)  # what a launch writes is what the views read back
    return plan, sizes


def _linear(small: dict[str, int], big: dict[str, int], factor: int) -> None:
    for what in small:
        assert big[what] <= LINEAR / 4 * factor * small[what], (what, small[what], big[what])


@pytest.fixture(scope="module")
def resolver_cls():
    mod = pytest.importorskip("tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver")
    return mod.TFConfigClusterResolver


def _resolved(resolver_cls, monkeypatch, tf_config: str):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    r = resolver_cls()
    return r.cluster_spec().as_dict(), (r.task_type, r.task_id)


def test_a_4096_task_slurm_plan_is_linear_and_every_node_builds_what_tensorflow_accepts(
    tmp_path, resolver_cls, monkeypatch
):
    _, small = _sizes(_slurm(1024), tmp_path)
    plan, big = _sizes(_slurm(4096), tmp_path)
    _linear(small, big, 4)
    assert big["plan.json"] <= 5_000_000 and big["plan"] < 20_000  # summarised past 256 tasks
    assert len(plan.nodes) == 4096 and all(not n.node_config(0).cluster for n in plan.nodes[:3])
    # each node builds its cluster from Slurm's view (1,024 nodes x 4 tasks, ports per shared address)
    step = node_slurm.Step(0, 4096, 0, 0, 77, 0, tuple(f"gpu{i:04d}" for i in range(1024)), (4,) * 1024)
    addrs = [f"10.1.{i // 256}.{i % 256}" for i in range(1024)]
    endpoints, ports = node_slurm.endpoints(step, addrs)
    assert len(set(endpoints)) == 4096 and ports[:4] == [ports[0] + k for k in range(4)]
    for rank in (0, 1, 2047, 4094, 4095):
        node = plan.nodes[rank]
        cfg = node_slurm.tf_config(endpoints, rank, False)
        config = p.NodeConfig.parse_line(p.command_line(node.node_config(0)))  # no cluster: Slurm's nodes
        built = child_env(dataclasses.replace(config, cluster=cfg["cluster"]), base={})["TF_CONFIG"]
        cluster, task = _resolved(resolver_cls, monkeypatch, built)
        assert cluster == {"worker": endpoints} and task == ("worker", rank)
        assert json.loads(built) == cfg


def test_a_2048_host_ssh_plan_is_linear_and_the_tf_config_a_node_builds_is_what_tensorflow_accepts(
    tmp_path, resolver_cls, monkeypatch
):
    _, small = _sizes(_ssh(512), tmp_path)
    plan, big = _sizes(_ssh(2048), tmp_path)
    _linear(small, big, 4)
    cluster = plan.common.cluster
    assert len(cluster["worker"]) == 2048 and cluster["worker"][-1] == "node02047.cluster.example.org:12345"
    for i in (0, 1, 1024, 2047):
        line = p.command_line(plan.nodes[i].node_config(0))  # the cluster once on this task's connection
        assert len(line) <= p.MAX_CONFIG_LINE
        config = p.NodeConfig.parse_line(line)  # as worker_entry validates it on receipt
        built = child_env(config, base={})["TF_CONFIG"]  # what worker_entry gives the command
        assert json.loads(built) == p.tf_config(cluster, "worker", i) == plan.nodes[i].tf_config  # = plan --task
        got, task = _resolved(resolver_cls, monkeypatch, built)
        assert got == {"worker": cluster["worker"]} and task == ("worker", i)
        assert config.own_endpoint() == cluster["worker"][i]  # what its hello reports


def test_a_16384_task_cluster_fits_the_protocol_and_its_limits_are_bounded():
    name = "x" * 240
    cluster = {"chief": [f"{name}-c.example:2222"], "worker": [f"{name}{i:05d}.example:2222" for i in range(16383)]}
    config = p.NodeConfig(argv=["t"], remote_dir="/r", task=p.TaskRef("worker", 16382), cluster=cluster)
    line = p.command_line(config)
    assert 4_000_000 < len(line) <= p.MAX_CONFIG_LINE  # 253-character names: the longest DNS allows
    back = p.NodeConfig.parse_line(line)
    assert back.cluster == cluster and json.loads(back.tf_config_json())["task"] == {"type": "worker", "index": 16382}
    # past the documented cap, the config is refused by name (a launcher's bug, not a node's)
    over = p.NodeConfig(argv=["t"], remote_dir="/r", cluster={"worker": ["a:1"] * (p.MAX_TASKS + 1)})
    with pytest.raises(p.ProtocolError, match=r"cluster\.worker: too long"):
        p.NodeConfig.parse_line(p.command_line(over))
    # what a node sends the launcher is bounded as before, whatever the cluster's size
    assert p.MAX_PAYLOAD[p.T_MSG] == 1 << 20 and p.MAX_COMMAND_LINE == 1 << 20
    assert p.MAX_CONFIG_LINE == p.MAX_COMMAND_LINE + p.MAX_TASKS * 128
    with pytest.raises(p.ProtocolError, match="oversized frame"):
        p.FrameDecoder(synced=True).feed(p.HEADER.pack(p.T_MSG, 0, (1 << 20) + 1))


def test_a_16384_task_tf_config_reaches_the_training_process_past_the_kernels_limit(tmp_path):
    """A TF_CONFIG of 16,384 tasks (~480 KB) is longer than one environment string may be (128 KiB): the
    task's own file carries it and the bootstrap sets it before the script runs, instrumented or not."""
    import os
    import sys

    from worker_entry.agent.child import spawn

    cluster = {"worker": [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:23456" for i in range(16384)]}
    script = "import json, os; c = json.loads(os.environ['TF_CONFIG']); print(len(c['cluster']['worker']), c['task'])"
    for instrument in (False, True):
        config = p.NodeConfig(
            argv=[sys.executable, "-c", script],
            remote_dir=str(tmp_path / f"task-{instrument}"),
            task=p.TaskRef("worker", 16383),
            cluster=cluster,
            instrument=instrument,
            env={"TFCLUSTER_INSTRUMENT": "1" if instrument else "0"},
        )
        assert len(config.tf_config_json()) > ENV_STRING_MAX
        env = child_env(config)
        assert "TF_CONFIG" not in env and env["TFCLUSTER_TF_CONFIG_FILE"].startswith(str(tmp_path))
        r, w = os.pipe()
        try:
            child = spawn(config, w)
            out, err = child.communicate(timeout=60)
        finally:
            os.close(r)
            os.close(w)
        assert child.returncode == 0, err
        assert out.decode().split() == ["16384", "{'type':", "'worker',", "'index':", "16383}"]
        assert oct(os.stat(env["TFCLUSTER_TF_CONFIG_FILE"]).st_mode & 0o777) == "0o600"


def _calls(fn) -> int:
    """Python and builtin calls ``fn()`` makes (cProfile's count): the work, counted, not timed."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(fn)
    return pstats.Stats(prof).total_calls  # type: ignore[attr-defined]


def test_an_ssh_plans_work_grows_linearly_with_its_hosts():
    """Each host's label among the members once counted every host's address: 16.8 M comparisons at
    4,096 hosts, most of a launch's start (docs/benchmarks.md §11). Counted: 4x the hosts, about 4x the calls."""
    from orchestrator.schedulers.ssh import ssh_plan

    def plan_of(n: int):
        spec = load_spec_text(_ssh(n)).spec
        return lambda: ssh_plan(spec, run_id="r", local_user="me", ssh_lookup=None)

    small, big = _calls(plan_of(256)), _calls(plan_of(1024))
    assert big <= LINEAR / 4 * 4 * small, (small, big)
