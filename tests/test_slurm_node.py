"""The node side of Slurm (no Slurm needed): host lists, tasks per node, the step, addresses, ports,
and TF_CONFIG as TensorFlow's own resolver reads it."""

from __future__ import annotations

import json
import random

import pytest

from worker_entry.agent.modes import slurm as ws
from worker_entry.agent.modes.hostlist import expand_hostlist, expand_tasks_per_node, split_top_level
from worker_entry.protocol.env import Env

# ----------------------------------------------------------------------------- host lists


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("n[01-03]", ["n01", "n02", "n03"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[1-2],n[5-6]", ["n1", "n2", "n5", "n6"]),
        ("a-b[1,3-4]-c", ["a-b1-c", "a-b3-c", "a-b4-c"]),
        ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
        ("x,y[1-2],z", ["x", "y1", "y2", "z"]),
        ("gpu-a100-[001-002],cpu7", ["gpu-a100-001", "gpu-a100-002", "cpu7"]),
        ("node1.cluster,node2.cluster", ["node1.cluster", "node2.cluster"]),
        ("[3-4]", ["3", "4"]),
    ],
)
def test_host_lists_expand_like_slurm(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "n[1-3",
        "n]1[",
        "n[3-1]",
        "n[a]",
        "n[1-]",
        "n[]",
        "n[[1]]",
        "a b",
        "n[1-3],",
        ",n1",
        "n;rm",
        "n[1-99999999]",
        "r[1-300]-n[1-300]",
        "n" * (2 << 20),
    ],
)
def test_bad_host_lists_are_errors_not_crashes(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


def _compress(prefix: str, numbers: list[int], width: int, suffix: str) -> str:
    """A host list as Slurm writes one: ranges of consecutive numbers inside one bracket."""
    items, run = [], [numbers[0]]
    for n in numbers[1:]:
        if n == run[-1] + 1:
            run.append(n)
        else:
            items.append(run)
            run = [n]
    items.append(run)
    fmt = [f"{r[0]:0{width}d}" + (f"-{r[-1]:0{width}d}" if len(r) > 1 else "") for r in items]
    return f"{prefix}[{','.join(fmt)}]{suffix}"


def test_host_lists_round_trip_random_cases():
    rng = random.Random(11)
    for _ in range(500):
        prefix = rng.choice(["n", "gpu-", "a-b", "rack1-node", "x9"])
        suffix = rng.choice(["", "-c", ".ib", "-0"])
        width = rng.choice([1, 2, 3, 4])
        population = range(0, 10**width if width < 4 else 2000)
        numbers = sorted(rng.sample(population, rng.randint(1, min(30, len(population)))))
        expected = [f"{prefix}{n:0{width}d}{suffix}" for n in numbers]
        parts = [(_compress(prefix, numbers, width, suffix), expected)]
        if rng.random() < 0.5:  # several expressions in one list
            parts.append(("solo7", ["solo7"]))
            rng.shuffle(parts)
        text = ",".join(p for p, _ in parts)
        assert expand_hostlist(text) == [h for _, hs in parts for h in hs], text


def test_top_level_split_keeps_commas_in_brackets():
    assert split_top_level("a[1,2],b,c[3-4,6]") == ["a[1,2]", "b", "c[3-4,6]"]


@pytest.mark.parametrize(
    ("text", "counts"),
    [("2(x3),1", [2, 2, 2, 1]), ("1(x3)", [1, 1, 1]), ("4", [4]), ("2,1", [2, 1]), ("3(x2),2(x2)", [3, 3, 2, 2])],
)
def test_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x0)", "2(x)", "-1", "2(x3", "1,,2", "1(x9999999)"])
def test_bad_tasks_per_node(text):
    with pytest.raises(ValueError):
        expand_tasks_per_node(text)


# ----------------------------------------------------------------------------- the step


def step_env(rank: int, nodelist="n[1-3]", tpn="2(x2),1", job=4242, step=0, **over) -> dict[str, str]:
    counts = expand_tasks_per_node(tpn)
    layout = ws.rank_layout(counts)
    env = {
        "SLURM_PROCID": str(rank),
        "SLURM_NODEID": str(layout[rank][0]),
        "SLURM_LOCALID": str(layout[rank][1]),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tpn,
        "SLURM_STEP_NUM_TASKS": str(sum(counts)),
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": str(step),
    }
    env.update(over)
    return env


def test_the_step_is_read_and_cross_checked():
    st = ws.step_from_env(step_env(3), run=None)
    assert (st.rank, st.ntasks, st.node_index, st.local_id) == (3, 5, 1, 1)
    assert st.nodes == ("n1", "n2", "n3") and st.tasks_per_node == (2, 2, 1)


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"SLURM_PROCID": None}, "SLURM_PROCID is not set"),
        ({"SLURM_PROCID": "9"}, "SLURM_PROCID"),
        ({"SLURM_PROCID": "1; rm -rf /"}, "expected a number"),
        ({"SLURM_PROCID": "9" * 40}, "expected a number"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2,1"}, "3 nodes"),
        ({"SLURM_STEP_NUM_TASKS": "7"}, "sums to 5"),
        ({"SLURM_NODEID": "2"}, "--distribution=block"),  # a cyclic layout put rank 3 elsewhere
        ({"SLURM_STEP_NODELIST": "n[1-3"}, "unclosed"),
        ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None}, "run under srun"),
    ],
)
def test_a_bad_step_environment_is_a_clear_error(over, why):
    env = {k: v for k, v in {**step_env(3), **over}.items() if v is not None}
    with pytest.raises(ws.SlurmEnvError, match=why.replace("(", r"\(").replace("[", r"\[")):
        ws.step_from_env(env, run=None)


def test_scontrol_is_preferred_and_garbage_from_it_is_ignored():
    calls = []

    def fake(argv):
        calls.append(list(argv))
        return "alpha\nbeta\ngamma\n"

    assert ws.expand_nodes("whatever[1-3]", run=fake) == ["alpha", "beta", "gamma"]
    assert ws.expand_nodes("n[1-2]", run=lambda argv: "bad name;\n") == ["n1", "n2"]
    assert ws.expand_nodes("n[1-2]", run=lambda argv: None) == ["n1", "n2"]
    assert calls == [["show", "hostnames", "whatever[1-3]"]]


# ----------------------------------------------------------------------------- addresses


SCONTROL_NODES = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.0.1 NodeHostName=h1 Port=17001 State=IDLE\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.0.2 NodeHostName=h2 Port=17002 State=IDLE\n"
    "NodeName=n3 Arch=x86_64 NodeAddr=bad;addr NodeHostName=h3\n"
)


def test_addresses_come_from_the_supervisor_then_scontrol_then_the_name():
    nodes = ["n1", "n2", "n3"]
    ok = lambda a: ["10.9.9.9"]  # noqa: E731
    env = {Env.SLURM_NODE_ADDRS: "n1=10.0.0.1,n2=10.0.0.2,n3=10.0.0.3"}
    assert ws.node_addresses(nodes, "n[1-3]", env, run=None, resolve=ok) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    got = ws.node_addresses(nodes, "n[1-3]", {}, run=lambda argv: SCONTROL_NODES, resolve=ok)
    assert got == ["10.1.0.1", "10.1.0.2", "n3"]  # n3's garbage NodeAddr is not used
    assert ws.node_addresses(nodes, "n[1-3]", {}, run=None, resolve=ok) == nodes


def test_a_node_reached_at_debians_self_alias_is_refused():
    resolve = lambda a: ["127.0.1.1"] if a == "n2" else ["10.0.0.1"]  # noqa: E731
    with pytest.raises(ws.SlurmEnvError, match=r"127\.0\.1\.1"):
        ws.node_addresses(["n1", "n2"], "n[1-2]", {}, run=None, resolve=resolve)
    # one node alone is never dialled by another node
    assert ws.node_addresses(["n2"], "n2", {}, run=None, resolve=resolve) == ["n2"]


def test_garbage_node_addrs_from_the_environment_are_ignored():
    env = {Env.SLURM_NODE_ADDRS: "n1=$(reboot),n2=10.0.0.2,=x,n3"}
    assert ws.parse_node_addrs(env[Env.SLURM_NODE_ADDRS]) == {"n2": "10.0.0.2"}


# ----------------------------------------------------------------------------- ports


def test_ports_are_distinct_where_tasks_share_an_address():
    addrs = ["127.0.0.1"] * 3 + ["10.0.0.2", "10.0.0.2", "10.0.0.3"]
    ports = ws.task_ports(addrs, job_id=77, step_id=0)
    assert len(set(ports[:3])) == 3 and ports[3] != ports[4]
    assert len({(a, p) for a, p in zip(addrs, ports, strict=True)}) == len(addrs)
    assert all(ws.PORT_LO <= p < ws.PORT_HI for p in ports)
    assert ws.task_ports(addrs, job_id=77, step_id=0) == ports  # every task computes the same table


def test_ports_move_with_the_job_and_the_step_and_honour_a_fixed_base():
    a = ws.task_ports(["h"] * 2, job_id=1000, step_id=0)
    assert ws.task_ports(["h"] * 2, job_id=1000, step_id=1) != a  # a restart (new step) gets another block
    assert ws.task_ports(["h"] * 2, job_id=1001, step_id=0) != a  # another job too
    assert ws.task_ports(["x", "y", "x"], job_id=5, step_id=0, base=23000) == [23000, 23000, 23001]
    for job in range(0, 200000, 997):
        assert all(ws.PORT_LO <= p < ws.PORT_HI for p in ws.task_ports(["h"] * 8, job_id=job, step_id=job % 7))
    with pytest.raises(ws.SlurmEnvError):
        ws.task_ports(["h"] * 3, job_id=1, step_id=0, base=65534)


# ----------------------------------------------------------------------------- TF_CONFIG


@pytest.mark.parametrize(
    ("chief", "rank", "task"), [(False, 0, ("worker", 0)), (True, 0, ("chief", 0)), (True, 2, ("worker", 1))]
)
def test_chief_is_derived_from_the_rank_and_the_task(chief, rank, task):
    assert ws.has_chief(rank, *task) is chief


def test_a_task_that_does_not_match_its_rank_is_refused():
    with pytest.raises(ws.SlurmEnvError):
        ws.has_chief(3, "worker", 0)


@pytest.mark.parametrize("chief", [False, True])
def test_tf_config_is_what_tensorflows_resolver_reads_on_every_rank(monkeypatch, chief):
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    specs = []
    for rank in range(5):
        st = ws.step_from_env(step_env(rank, nodelist="n[1-3]", tpn="2(x2),1", job=99, step=3), run=None)
        addrs = ws.node_addresses(
            st.nodes, "n[1-3]", {Env.SLURM_NODE_ADDRS: "n1=127.0.0.1,n2=127.0.0.1,n3=10.0.0.3"}, run=None
        )
        eps, _ = ws.endpoints(st, addrs)
        cfg = ws.tf_config(eps, rank, chief)
        monkeypatch.setenv("TF_CONFIG", json.dumps(cfg))
        res = TFConfigClusterResolver()
        expect = ws.tasks_by_rank(5, chief)[rank]
        assert (res.task_type, res.task_id) == expect
        specs.append(res.cluster_spec().as_dict())
    assert all(s == specs[0] for s in specs)  # every rank sees the same cluster
    every = [ep for eps in specs[0].values() for ep in eps]
    assert len(set(every)) == 5  # n1 and n2 share 127.0.0.1: their four tasks still get four ports
    assert sum(ep.startswith("127.0.0.1:") for ep in every) == 4


@pytest.mark.parametrize(
    "roles",
    [
        {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
        {"chief": 1, "worker": 3, "evaluator": 1},
        {"worker": 4, "evaluator": 1},
    ],
)
def test_with_roles_every_rank_builds_its_roles_tf_config_as_tensorflow_reads_it(monkeypatch, roles):
    """Ranks by role (chief, workers, ps, evaluator); the evaluator is left out of the cluster and reads
    as task type evaluator; every other rank sees the same cluster."""
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    order = ws.tasks_by_rank(5, False, roles)
    assert order == [(r, i) for r in ("chief", "worker", "ps", "evaluator") for i in range(roles.get(r, 0))]
    clusters = []
    for rank in range(5):
        st = ws.step_from_env(step_env(rank, nodelist="n[1-3]", tpn="2(x2),1", job=7, step=0), run=None)
        eps, _ = ws.endpoints(st, ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        chief = ws.task_of(rank, 5, *order[rank], roles)
        monkeypatch.setenv("TF_CONFIG", json.dumps(ws.tf_config(eps, rank, chief, roles)))
        res = TFConfigClusterResolver()
        assert (res.task_type, res.task_id) == order[rank]
        clusters.append(res.cluster_spec().as_dict())
    assert all(c == clusters[0] for c in clusters)
    assert "evaluator" not in clusters[0] and sum(map(len, clusters[0].values())) == 4
    assert clusters[0].get("ps", []) == eps[3:4] * ("ps" in roles)  # rank 3, the 2nd task of n2 (block layout)


@pytest.mark.parametrize(
    ("rank", "task", "roles"),
    [
        (0, ("worker", 0), {"chief": 1, "worker": 1}),
        (2, ("worker", 1), {"chief": 1, "worker": 1, "ps": 1}),
        (1, ("worker", 0), {"chief": 1, "worker": 1, "boss": 1}),
        (1, ("worker", 0), {"chief": 1, "worker": 1 << 40}),
    ],
)
def test_roles_that_do_not_make_the_step_are_refused(rank, task, roles):
    with pytest.raises(ws.SlurmEnvError):
        ws.task_of(rank, 3, *task, roles)


def test_tensorflows_slurm_resolver_fails_where_ours_works(monkeypatch):
    """TF 2.21's SlurmClusterResolver: no GPUs → it runs nvidia-smi and fails; with GPUs declared it
    uses node names (which need not resolve: Slurm reaches nodes at their NodeAddr) and the same
    ports on every node, so virtual nodes that share an address clash ("Could not start gRPC server")."""
    from tensorflow.python.distribute.cluster_resolver import SlurmClusterResolver

    env = step_env(0, nodelist="n[1-2]", tpn="2(x2)")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi (as on this machine), and no scontrol
    with pytest.raises(Exception):  # noqa: B017 - FileNotFoundError, RuntimeError: whatever it raises
        SlurmClusterResolver().cluster_spec()
    tf_eps = (
        SlurmClusterResolver(gpus_per_node=2, gpus_per_task=1, auto_set_gpu=False).cluster_spec().as_dict()["worker"]
    )
    addr_of = {"n1": "127.0.0.1", "n2": "127.0.0.1"}  # two slurmd on one host, as in the tests
    tf_targets = [(addr_of[ep.rsplit(":", 1)[0]], ep.rsplit(":", 1)[1]) for ep in tf_eps]
    assert len(set(tf_targets)) < len(tf_targets)  # n1:8888 and n2:8888 are one socket
    st = ws.step_from_env(env, run=None)
    addrs = ws.node_addresses(st.nodes, "n[1-2]", {Env.SLURM_NODE_ADDRS: "n1=127.0.0.1,n2=127.0.0.1"}, run=None)
    ours, _ = ws.endpoints(st, addrs)
    assert len(set(ours)) == 4 and all(ep.startswith("127.0.0.1:") for ep in ours)


@pytest.mark.parametrize(
    ("visible", "local", "per_task", "here", "share"),
    [
        ("0,1,2,3", 1, 2, 2, "2,3"),
        ("0,1,2,3", 3, 1, 4, "3"),
        ("4,5", 0, 1, 2, "4"),
        ("0,1,2,3", 0, 4, 1, None),
        ("", 0, 1, 2, None),
        ("0", 1, 1, 2, None),
        ("0,1", 0, 0, 2, None),
    ],
)
def test_each_task_of_a_node_gets_its_own_gpus(visible, local, per_task, here, share):
    assert ws.gpu_slice(visible, local, per_task, here) == share


@pytest.mark.parametrize(
    ("slot", "visible", "per_task", "share"),
    [
        ("1/2", "0,1,2,3", 2, "2,3"),
        ("0/2", "0,1,2,3", 2, "0,1"),
        ("", "0,1,2,3", 2, None),
        ("x/2", "0,1", 1, None),
        ("1/1", "0,1", 2, None),
        ("9999999/2", "0,1", 1, None),
    ],
)
def test_a_task_restarted_in_place_takes_its_first_incarnations_gpu_share(slot, visible, per_task, share):
    from worker_entry.agent.modes.connect import gpu_share

    assert gpu_share({Env.GPU_SLOT: slot, "CUDA_VISIBLE_DEVICES": visible}, per_task) == share


def test_the_local_slurm_beds_daemons_never_take_a_port_tasks_derive():
    """Every virtual node of the test bed listens on 127.0.0.1: its slurmd ports must stay out of the
    block the tasks derive their TF ports from (and out of the ephemeral range), or preflight finds a
    task's port held by slurmd now and then."""
    from tfcluster_testbed import slurm as bed

    block = range(ws.PORT_LO, ws.PORT_HI + 1)
    assert not set(bed.DAEMON_PORTS) & set(block) and bed.DAEMON_PORTS.stop <= 32768
    ports = bed._free_ports(5)
    assert len(set(ports)) == 5 and all(p in bed.DAEMON_PORTS for p in ports)
    # every job/step id's block is inside PORT_LO..PORT_HI
    for job, step in ((1, 0), (4242, 3), (99991, 17)):
        assert all(p in block for p in ws.task_ports(["127.0.0.1"] * 4, job, step))
