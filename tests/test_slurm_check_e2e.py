"""`tfcluster check` under a real Slurm (inside an allocation, where its supervisor runs): every
node's compute, the job's all-reduce and the link pairs are measured through the same srun step
and connect-back channels as a job, and every host is named by its Slurm node name (what a finding
names), not a plan label. Whether the shared 2-core box looks healthy is not asserted (its three
"nodes" share the cores: the compute scores are noise here; the namespace bed's check tests judge)."""

from __future__ import annotations

import json

import pytest
from slurm_fixtures import PY, REPO, finish, start, write_spec

pytestmark = pytest.mark.e2e


def test_check_inside_an_allocation_measures_every_node_by_its_slurm_name(slurm, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", "sl-check", [PY, "-c", "print('unused by check')"], slurm={"nodes": 3})
    run_dir = tmp_path / "check"
    argv = [
        "salloc",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--immediate=30",
        PY,
        "-m",
        "orchestrator",
        "check",
        str(spec),
        "--run-dir",
        str(run_dir),
        "--json",
    ]
    rc, out, err = finish(start(slurm, argv, cwd=REPO), timeout=240)
    assert rc == 0, err[-3000:]
    check = json.loads(out)
    assert check == json.loads((run_dir / "check.json").read_text())
    assert [(h["task"], h["host"]) for h in check["hosts"]] == [
        ("worker:0", "n1"),
        ("worker:1", "n2"),
        ("worker:2", "n3"),
    ]
    assert all(h["gflops"] > 0 and h["device"] == "CPU" for h in check["hosts"])
    assert [(a["bytes"], a["ranks"]) for a in check["allreduce"]] == [(64 << 10, 3), (4 << 20, 3)]
    pairs = {frozenset((link["a"], link["b"])) for link in check["links"]}
    assert pairs == {frozenset(p) for p in (("n1", "n2"), ("n1", "n3"), ("n2", "n3"))}
    assert all(link["bandwidth_Bps"] > 0 for link in check["links"])
    named = {w for f in check["findings"] for w in (f.get("host"), f.get("a"), f.get("b")) if w}
    assert named <= {"n1", "n2", "n3"}, check["findings"]
