"""worker_entry on its own (a local subprocess, the wire protocol by hand): lifecycle guarantees."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from conftest import _env
from waiting import wait_for

from worker_entry import protocol as wire

PY = sys.executable


class Entry:
    """Drive `python -m worker_entry` like the launcher does: config line, go, pings, stop."""

    def __init__(self, tmp_path: Path, argv: list[str], proc_env: dict | None = None, **cfg) -> None:
        config = {
            "argv": argv,
            "env": cfg.pop("env", {}),
            "remote_dir": str(tmp_path / "task"),
            "heartbeat_interval_s": 0.2,
            "launcher_timeout_s": cfg.pop("launcher_timeout_s", 30),
            "stop_grace_s": cfg.pop("stop_grace_s", 2),
            "wait_for_go": True,
            **cfg,
        }
        self.p = subprocess.Popen(
            [PY, "-m", "worker_entry"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=proc_env,
        )
        self.decoder = wire.FrameDecoder()
        self.msgs: list[dict] = []
        self.logs = bytearray()
        self.send(config)

    def send(self, obj: dict) -> None:
        self.p.stdin.write(wire.command_line(obj))
        self.p.stdin.flush()

    def pump(self, timeout: float = 0.2) -> None:
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if ready:
            data = os.read(self.p.stdout.fileno(), 1 << 20)
            for fr in self.decoder.feed(data):
                if fr.type == wire.T_LOG:
                    self.logs += fr.payload
                else:
                    self.msgs.append(json.loads(fr.payload))

    def until(self, condition, timeout: float, message) -> Any:
        """``wait_for(condition)``, reading the agent's frames between two asks (``pump``: up to 0.1 s)."""

        def pumped() -> Any:
            if value := condition():
                return value
            self.pump(0.1)
            return condition()

        return wait_for(pumped, timeout, message, interval=0)

    def wait_msg(self, kind: str, timeout: float = 20.0) -> dict:
        return self.until(
            lambda: next((m for m in self.msgs if m["type"] == kind), None),
            timeout,
            lambda: f"a {kind!r} message (got {[m['type'] for m in self.msgs]})",
        )

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for the end like the launcher: after ``exited`` and ``task_files``, say ``bye``."""
        deadline = time.monotonic() + timeout
        said_bye = False
        while self.p.poll() is None and time.monotonic() < deadline:
            self.pump(0.05)
            if not said_bye and any(m["type"] == "task_files" for m in self.msgs):
                with contextlib.suppress(OSError, ValueError):
                    self.send({"type": "bye"})
                said_bye = True
        if self.p.poll() is None:
            self.p.kill()
        while True:
            ready, _, _ = select.select([self.p.stdout], [], [], 0)
            if not ready:
                break
            data = os.read(self.p.stdout.fileno(), 1 << 20)
            if not data:
                break
            for fr in self.decoder.feed(data):
                if fr.type == wire.T_LOG:
                    self.logs += fr.payload
                else:
                    self.msgs.append(json.loads(fr.payload))
        return self.p.wait()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(pids, timeout=10.0) -> list[int]:
    """The processes of ``pids`` still alive: waits until there are none (a timeout fails the test)."""
    left = list(pids)

    def dead() -> bool:
        left[:] = [p for p in left if alive(p)]
        return not left

    wait_for(dead, timeout, lambda: f"processes {left} to end", interval=0.05)
    return left


FAMILY = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)          # stubborn: only SIGKILL ends it
kid = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {kid.pid} {escaped.pid}")
print("family ready", flush=True)
time.sleep(600)
"""


def _family(tmp_path: Path, **cfg) -> tuple[Entry, list[int]]:
    pids_file = tmp_path / "pids"
    e = Entry(tmp_path, [PY, "-c", FAMILY, str(pids_file)], **cfg)
    e.wait_msg("hello")
    e.send({"op": "go"})
    e.wait_msg("spawned")
    e.until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3, 20, "the family's 3 pids")
    pids = [int(x) for x in pids_file.read_text().split()]
    e.until(  # a heartbeat scan saw the escaped child
        lambda: any(m["type"] == "heartbeat" and (m.get("nproc") or 0) >= 3 for m in e.msgs),
        10,
        "a heartbeat counting the 3 processes",
    )
    return e, pids


def test_stop_escalates_to_kill_and_reaches_escaped_descendants(tmp_path):
    e, pids = _family(tmp_path, stop_grace_s=1.0)
    try:
        e.send({"op": "stop", "grace_s": 1.0, "reason": "test"})
        code = e.finish()
        exited = e.wait_msg("exited")
        assert exited["signal_name"] == "SIGKILL" and exited["stopped"] is True
        assert code == 128 + signal.SIGKILL
        assert wait_dead(pids) == []
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_closed_channel_kills_the_whole_group(tmp_path):
    e, pids = _family(tmp_path, stop_grace_s=0.5)
    try:
        e.p.stdin.close()  # the launcher went away (its SSH session closed)
        e.finish()
        assert "launcher closed the connection" in e.wait_msg("stopping")["reason"]
        assert wait_dead(pids) == []
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_no_ping_means_the_launcher_is_gone(tmp_path):
    e, pids = _family(tmp_path, launcher_timeout_s=1.5, stop_grace_s=0.5)
    try:
        # stdin stays open but silent: a dead network never closes a TCP session
        e.finish(timeout=20)
        assert "launcher unreachable" in e.wait_msg("stopping")["reason"]
        assert wait_dead(pids) == []
    finally:
        e.p.stdin.close()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_worker_entry_sigkill_takes_the_child_with_it(tmp_path):
    e = Entry(tmp_path, [PY, "-c", "import time; print('up', flush=True); time.sleep(600)"])
    e.wait_msg("hello")
    e.send({"op": "go"})
    child = e.wait_msg("spawned")["pid"]
    e.p.kill()  # PR_SET_PDEATHSIG: the kernel kills the child too
    e.p.wait()
    assert wait_dead([child], 5) == []


def test_every_line_and_the_partial_last_one_are_sent_and_kept(tmp_path):
    script = "import sys\nfor i in range(20000): print(f'o{i}')\nprint('e', file=sys.stderr)\nsys.stdout.write('no newline at the end')"
    e = Entry(tmp_path, [PY, "-c", script])
    e.wait_msg("hello")
    e.send({"op": "go"})
    assert e.finish() == 0
    lines = e.logs.decode().splitlines()
    assert [ln for ln in lines if ln.startswith("o")] == [f"o{i}" for i in range(20000)]
    assert "e" in lines  # stderr counts
    assert "no newline at the end" in lines  # the partial last line is flushed as a line
    node_log = (tmp_path / "task" / "output.log").read_bytes()
    assert node_log == bytes(e.logs)
    exit_info = json.loads((tmp_path / "task" / "exit.json").read_text())
    assert exit_info["code"] == 0 and exit_info["log_bytes"] == len(node_log)


def test_stop_before_go_starts_nothing(tmp_path):
    marker = tmp_path / "ran"
    e = Entry(tmp_path, [PY, "-c", f"open({str(marker)!r}, 'w')"])
    e.wait_msg("hello")
    e.send({"op": "stop", "reason": "preflight failed"})
    assert e.finish() == 0
    assert e.wait_msg("exited")["not_started"] is True
    assert not marker.exists()


def test_hello_reports_local_problems(tmp_path):
    e = Entry(tmp_path, ["true"], workdir=str(tmp_path / "missing"), gpus=4)
    facts = e.wait_msg("hello")["facts"]
    e.send({"op": "stop"})
    e.finish()
    checks = {p["check"] for p in facts["problems"]}
    assert checks == {"workdir", "gpus"}
    assert facts["packages"]["tfcluster"] == "0.1.0"


def test_package_versions_match_importlib_metadata(tmp_path, monkeypatch):
    """The dist-info-name fast path gives what importlib.metadata gives, first on sys.path winning."""
    import importlib.metadata

    from worker_entry.agent import sysinfo

    def reference() -> dict:
        out = {}
        for name in sysinfo.PACKAGES:
            try:
                out[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                out[name] = None
        return out

    assert sysinfo.package_versions() == reference()
    # a shadowing install earlier on sys.path, with a non-normalised name, wins in both
    shadow = tmp_path / "shadow"
    meta = shadow / "Tf.Keras-9.9.9.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: tf-keras\nVersion: 9.9.9\n")
    monkeypatch.syspath_prepend(str(shadow))
    importlib.invalidate_caches()
    got = sysinfo.package_versions()
    assert got["tf_keras"] == "9.9.9" and got == reference()


def test_hand_over_lists_the_task_and_serves_fetches_on_the_same_channel(tmp_path):
    """After exited: task_files (the log it wrote, the chief's checkpoint), then fetch until bye."""
    import hashlib

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"w" * 5000)
    (ckpt / "workertemp_2").mkdir()
    secret = tmp_path / "secret"
    secret.write_text("not for the launcher")
    e = Entry(tmp_path, [PY, "-c", "print('x' * 99)"], checkpoint_dir=str(ckpt), launcher_timeout_s=10)
    e.wait_msg("hello")
    e.send({"type": "go"})
    files = e.wait_msg("task_files")
    assert files["log_bytes"] == 100 and e.wait_msg("exited")["code"] == 0
    assert {f["path"] for f in files["task_dir"]["files"]} == {"output.log", "exit.json"}
    assert [f["path"] for f in files["checkpoint"]["files"]] == ["w.bin"]  # temporary copies excluded
    # a directory it did not list: nothing is sent (not even an error naming it)
    e.send({"type": "fetch", "root": str(tmp_path), "files": [{"path": "secret"}]})
    e.send({"type": "fetch", "root": str(ckpt), "files": [{"path": "w.bin", "offset": 1000}]})
    data = bytearray()
    ends = []

    def read_to_the_end() -> bool:
        ready, _, _ = select.select([e.p.stdout], [], [], 0.2)
        if ready:
            for fr in e.decoder.feed(os.read(e.p.stdout.fileno(), 1 << 20)):
                if fr.type == wire.T_DATA:
                    data.extend(fr.payload)
                elif fr.type == wire.T_MSG:
                    m = json.loads(fr.payload)
                    e.msgs.append(m)
                    if m["type"] == "end":
                        ends.append(m)
        return bool(ends)

    wait_for(read_to_the_end, 20, "the fetch's end message", interval=0)
    assert bytes(data) == b"w" * 4000  # from the offset on
    assert ends[0]["sha256"] == hashlib.sha256(b"w" * 5000).hexdigest()  # of the whole file
    assert not any(m.get("path") == "secret" for m in e.msgs)
    assert b"not for the launcher" not in data
    e.send({"type": "bye"})
    assert e.p.wait(10) == 0


def test_hand_over_ends_when_the_launcher_stays_silent(tmp_path):
    e = Entry(tmp_path, [PY, "-c", "pass"], launcher_timeout_s=1.0)
    e.wait_msg("hello")
    e.send({"type": "go"})
    e.wait_msg("task_files")
    e.until(lambda: e.p.poll() is not None, 20, "the agent to end on its own")
    assert e.p.returncode == 0


def test_the_start_path_imports_nothing_a_short_task_does_not_need():
    """Every host pays worker_entry's imports before its hello (on a 2-core box with 16 test-bed hosts,
    16 times over): psutil, hashlib and platform are imported when first used, not at start."""
    code = (
        "import sys, worker_entry.agent.runner, worker_entry.__main__; "
        "print(','.join(m for m in ('psutil', 'hashlib', 'platform', 'importlib.metadata') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/", env=_env())
    assert out.stdout.strip() == ""


def test_a_reading_outside_the_protocol_ranges_does_not_kill_the_agent(tmp_path):
    """A host whose kernel counters give 200 % retransmissions (its peers gone, it resends more than it
    sends anew) once killed the agent on its own heartbeat: its task judged lost and a healthy host
    blamed. The beat still goes out, without that evidence, and the task runs to its end."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "from worker_entry.agent import hoststats\n"
        "hoststats.HostSampler.sample = lambda self: {'interval_s': 0.2, 'tcp_retrans_pct': 200.0, 'steal_pct': -3.0}\n"
    )
    env = _env()
    env["PYTHONPATH"] = f"{site}{os.pathsep}{env.get('PYTHONPATH', '')}"
    e = Entry(tmp_path, [PY, "-c", "import time; time.sleep(1.5)"], proc_env=env)
    e.wait_msg("hello")
    e.send({"type": "go"})
    assert e.finish() == 0
    beats = [m for m in e.msgs if m["type"] == "heartbeat"]
    assert len(beats) >= 3 and all(m.get("host") is None for m in beats), beats
    exited = [m for m in e.msgs if m["type"] == "exited"]
    assert exited and exited[0]["code"] == 0, e.msgs[-3:]
