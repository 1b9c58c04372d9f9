"""Through a bastion: a host whose sshd admits only connections from the bastion host is reached
with ~/.ssh/config's ProxyJump, host keys verified at every hop (real sshd, network namespaces)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import PY, assert_no_job_processes, run_cli, run_launch
from testbed_fixtures import requires_netns

pytestmark = [pytest.mark.e2e, requires_netns]

HOSTNAME = [PY, "-c", "import socket; print('on', socket.gethostname(), flush=True)"]


def _spec(tb, tmp_path, ssh_config: str):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(ssh_config)
    spec = tb.spec_dict("bastion", HOSTNAME)
    spec["ssh"]["config_file"] = str(cfg)
    path = tmp_path / f"spec-{abs(hash(ssh_config))}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_launch_through_a_bastion_only_way_in(testbed_factory, tmp_path):
    # host2 admits root only from host0's address: host0 is its bastion
    tb = testbed_factory(3, mode="netns", sshd_options={2: ["AllowUsers root@{host0}"]})
    bastion, hidden = tb.hosts[0], tb.hosts[2]

    direct = run_launch(tb, _spec(tb, tmp_path, "# no jump\n"), tmp_path / "direct")
    assert direct.rc == 4, direct.stderr[-2000:]  # refused without the bastion
    assert direct.result["root_cause"]["kind"] == "connect" and hidden.address in direct.result["root_cause"]["message"]

    spec = _spec(tb, tmp_path, f"Host {hidden.address}\n  ProxyJump {tb.user}@{bastion.address}\n")
    plan = run_cli("plan", str(spec), "--json", "--task", "worker:2", tb=tb)
    assert plan.returncode == 0, plan.stderr
    node = json.loads(plan.stdout)
    assert node["jumps"] == [f"{tb.user}@{bastion.address}:22"]
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 0, r.stderr[-3000:]
    assert f"on {hidden.hostname}" in r.log("worker-2")
    assert_no_job_processes(tb, 5)


def test_an_unknown_bastion_host_key_is_refused(testbed_factory, tmp_path):
    tb = testbed_factory(2, mode="netns", sshd_options={1: ["AllowUsers root@{host0}"]})
    known = tmp_path / "known_hosts"
    # the bastion's key is missing: the chain must stop at the first hop
    lines = [ln for ln in tb.known_hosts.read_text().splitlines() if not ln.startswith(tb.hosts[0].address + " ")]
    known.write_text("\n".join(lines) + "\n")
    spec = tb.spec_dict("bastion2", HOSTNAME)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host {tb.hosts[1].address}\n  ProxyJump {tb.hosts[0].address}\n")
    spec["ssh"].update({"config_file": str(cfg), "known_hosts": str(known)})
    spec["hosts"] = spec["hosts"][1:]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = run_launch(tb, path, tmp_path / "run")
    assert r.rc == 4
    msg = r.result["root_cause"]["message"]
    assert f"jump host {tb.user}@{tb.hosts[0].address}:22" in msg and "not in" in msg
