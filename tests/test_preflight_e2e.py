"""`tfcluster preflight`: four different problems on four hosts, each named correctly, in one run."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
import yaml
from conftest import PY, assert_no_job_processes, run_cli, run_launch

from orchestrator.supervise import evaluate, failed
from worker_entry.protocol import NodeFacts

pytestmark = pytest.mark.e2e


def _keygen(path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.parent / (path.name + ".pub")).read_text().split()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_preflight_names_each_problem_on_its_host(testbed_factory, tmp_path):
    tb = testbed_factory(4)
    spec_d = tb.spec_dict("pre", ["true"])
    # host 0: a known_hosts entry with another key (host key changed)
    other_key = _keygen(tmp_path / "other_host_key")
    h0 = tb.hosts[0]
    lines = []
    for line in tb.known_hosts.read_text().splitlines():
        if line.startswith(f"[{h0.address}]:{h0.ssh_port} "):
            parts = line.split()
            line = f"{parts[0]} ssh-ed25519 {other_key}"
        lines.append(line)
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(lines) + "\n")
    spec_d["ssh"]["known_hosts"] = str(known)
    # host 1: a user key that is not authorized
    _keygen(tmp_path / "stranger")
    spec_d["hosts"][1]["identity_file"] = str(tmp_path / "stranger")
    # host 2: nothing listens on its ssh port
    spec_d["hosts"][2]["port"] = _free_port()
    # host 3: its TF port is taken by a listener
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    busy.bind(("0.0.0.0", tb.hosts[3].tf_port))
    busy.listen()
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_d))
    try:
        r = run_cli("preflight", str(spec), "--json")
        human = run_cli("preflight", str(spec))
        launched = run_launch(tb, spec, tmp_path / "run")
    finally:
        busy.close()
    assert r.returncode == 4, r.stderr
    report = json.loads(r.stdout)
    ssh = {h["task"]: h["ssh"] for h in report["hosts"]}
    assert ssh == {"worker:0": "host_key_changed", "worker:1": "auth", "worker:2": "refused", "worker:3": "ok"}
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    by_task = {f["task"]: f for f in errors}
    assert "host key CHANGED" in by_task["worker:0"]["message"]
    assert "authentication as" in by_task["worker:1"]["message"]
    assert "connection refused" in by_task["worker:2"]["message"]
    assert f"TF port {tb.hosts[3].tf_port} is in use" in by_task["worker:3"]["message"]
    assert all(f["hint"] for f in errors)  # every error says what to do about it
    facts = next(h["facts"] for h in report["hosts"] if h["task"] == "worker:3")
    assert facts["python"] and facts["packages"]["tensorflow-cpu"]
    assert human.returncode == 4 and "preflight FAILED" in human.stdout and "fix:" in human.stdout
    # launch refuses the same cluster before starting anything
    assert launched.rc == 4
    assert launched.result["state"] == "connect_failed"
    assert_no_job_processes(tb, 5)


def test_launch_preflight_stops_a_busy_tf_port_before_anything_runs(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    marker = tmp_path / "ran"
    spec = tb.write_spec(tmp_path / "spec.yaml", "busy", [PY, "-c", f"open({str(marker)!r}, 'w')"])
    busy = socket.socket()
    busy.bind(("0.0.0.0", tb.hosts[1].tf_port))
    busy.listen()
    try:
        r = run_launch(tb, spec, tmp_path / "run")
    finally:
        busy.close()
    assert r.rc == 4
    assert r.result["state"] == "preflight_failed"
    rc = r.result["root_cause"]
    assert rc["kind"] == "preflight" and rc["task"] == "worker:1"
    assert f"TF port {tb.hosts[1].tf_port} is in use" in rc["message"]
    assert not marker.exists()  # nobody started: the check came before the go
    assert {t["state"] for t in r.result["tasks"].values()} == {"not_started"}


def test_a_missing_script_is_refused_by_preflight_naming_host_path_and_field(testbed_factory, tmp_path):
    """Issue 32.9: a wrong script path passed validate and preflight and failed at launch (exit 3)."""
    tb = testbed_factory(2)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('trained')\n")
    ok = tb.write_spec(tmp_path / "ok.yaml", "script-ok", [PY, "train.py"], job={"workdir": str(workdir)})
    bad = tb.write_spec(tmp_path / "bad.yaml", "script-bad", [PY, "trian.py"], job={"workdir": str(workdir)})
    assert run_cli("preflight", str(ok)).returncode == 0
    r = run_cli("preflight", str(bad), "--json")
    assert r.returncode == 4, r.stdout + r.stderr
    errors = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]
    assert sorted((f["task"], f["host"].rsplit(":", 1)[0], f["code"]) for f in errors) == [
        (f"worker:{i}", tb.hosts[i].address, "script") for i in range(2)
    ], errors  # the host as preflight names it: its SSH address and port
    assert all(
        f"job.command: the script trian.py is not a file on this host (looked for {workdir / 'trian.py'})"
        == f["message"]
        and "job.workdir" in f["hint"]
        for f in errors
    )
    human = run_cli("preflight", str(bad))
    assert human.returncode == 4 and "trian.py" in human.stdout and tb.hosts[1].address in human.stdout
    launched = run_launch(tb, bad, tmp_path / "run")
    assert launched.rc == 4 and launched.result["root_cause"]["kind"] == "preflight"
    assert {t["state"] for t in launched.result["tasks"].values()} == {"not_started"}  # nothing ran
    assert_no_job_processes(tb, 5)


def test_preflight_passes_on_a_healthy_cluster(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "ok", ["true"])
    r = run_cli("preflight", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preflight passed" in r.stdout


# --- the pure rules --------------------------------------------------------------------------


def _facts(tf="2.21.0", tfk="2.21.0", keras="3.15.1", gpus=(), py="3.11.7", problems=()):
    return NodeFacts.from_dict(
        {
            "python": py,
            "packages": {"tensorflow-cpu": tf, "tf_keras": tfk, "keras": keras, "tfcluster": "0.1.0"},
            "gpus": [{"index": i, "name": g, "memory_mb": 1} for i, g in enumerate(gpus)],
            "problems": list(problems),
        }
    )


def test_version_mismatch_and_keras_trap():
    facts = {"worker:0": _facts(), "worker:1": _facts(tf="2.20.0"), "worker:2": _facts(tfk=None)}
    out = evaluate(facts, {t: t for t in facts}, legacy_keras=True, gpus=0)
    blocking = {(f.code, f.task) for f in out if f.blocks}
    assert ("tensorflow", "worker:1") in blocking
    assert ("keras", "worker:2") in blocking and ("tf_keras", "worker:2") in blocking
    out = evaluate({"a": _facts(), "b": _facts()}, {"a": "a", "b": "b"}, legacy_keras=False, gpus=0)
    assert any(f.code == "keras" and f.blocks and "keras-team/keras#20585" in f.message for f in out)


def test_mixed_gpu_models_warn_and_clock_skew_warns():
    facts = {"worker:0": _facts(gpus=["A100"] * 2), "worker:1": _facts(gpus=["V100"] * 2)}
    out = evaluate(facts, {t: t for t in facts}, legacy_keras=True, gpus=2, skews={"worker:1": 3.2})
    gpu = [f for f in out if f.code == "gpus" and failed(f)]
    assert gpu and gpu[0].severity == "warning" and "mixed GPU models" in gpu[0].message
    info = [f.message for f in out if f.code == "gpus" and not failed(f)]
    assert info and "worker:0" in info[0] and "2x A100" in info[0] and "V100" in info[0]  # models (and memory) per host
    assert any(f.code == "clock" and f.task == "worker:1" and "+3.2s" in f.message for f in out)
    assert not any(f.blocks for f in out)
