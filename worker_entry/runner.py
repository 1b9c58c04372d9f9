"""The node-side supervisor of one task: owns the training process's whole lifecycle.

- starts the command in its own session/process group, with PR_SET_PDEATHSIG so it dies with us;
- streams every output line (stdout and stderr) to the launcher and to a local log on the node;
- heartbeats (process state, CPU, memory, GPUs, training progress) every interval;
- stops the whole group (TERM → grace → KILL, plus descendants that left the group) when the
  launcher says so, when the launcher's channel closes (EOF), when the launcher stops answering
  (no ping within the timeout: a dead network never closes a TCP session), or on our own signals;
- writes the exit status locally and reports it, after every line has been sent.

One thread runs the event loop (selectors); one writes frames to the channel so a stalled network
can never stop the loop from enforcing the timeouts.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from . import wire
from .sysinfo import GroupSampler, Nvml, listening, node_facts

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None

CHUNK = 256 * 1024
MAX_LINE = 1024 * 1024  # a "line" longer than this is cut (progress bars without newlines)
HIGH_WATER = 4 * 1024 * 1024  # pause reading the child when this much is unsent: backpressure, not loss
LOW_WATER = 1 * 1024 * 1024
DRAIN_TIMEOUT_S = 3.0
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
PATH_VARS = ("TFCLUSTER_CHECKPOINT_DIR", "TFCLUSTER_BACKUP_DIR")


class FrameWriter(threading.Thread):
    """Writes frames to the launcher's channel; the event loop never blocks on the network."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="frame-writer", daemon=True)
        self.fd = fd
        self._chunks: collections.deque[bytes] = collections.deque()
        self._cond = threading.Condition()
        self.pending = 0
        self.broken = False
        self._writing = False

    def send(self, data: bytes) -> None:
        if self.broken:
            return
        with self._cond:
            self._chunks.append(data)
            self.pending += len(data)
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks:
                    self._cond.wait()
                batch = []
                size = 0
                while self._chunks and size < CHUNK:
                    c = self._chunks.popleft()
                    batch.append(c)
                    size += len(c)
                self._writing = True
            data = memoryview(b"".join(batch))
            try:
                while data:
                    n = os.write(self.fd, data)
                    data = data[n:]
            except OSError:
                with self._cond:
                    self.broken = True
                    self._chunks.clear()
                    self.pending = 0
                    self._writing = False
                    self._cond.notify_all()
                return
            with self._cond:
                self.pending -= size
                self._writing = False
                self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._chunks or self._writing) and not self.broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return not self.broken


def _pdeathsig_preexec() -> Any:
    """A preexec_fn that makes the kernel SIGKILL the child if worker_entry dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except Exception:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


class Runner:
    def __init__(self, config: dict[str, Any], out_fd: int, in_fd: int, stdin_rest: bytes = b"") -> None:
        self.cfg = config
        self.in_fd = in_fd
        self.writer = FrameWriter(out_fd)
        self.interval = float(config.get("heartbeat_interval_s", 1.0))
        self.launcher_timeout = float(config.get("launcher_timeout_s", 10.0))
        self.grace = float(config.get("stop_grace_s", 10.0))
        # Without a launcher the job is lost anyway: no point waiting out the full grace.
        self.lost_grace = float(config.get("failure_grace_s", 1.0))
        self.tf_port = config.get("tf_port")
        self.remote_dir = os.path.expanduser(config["remote_dir"])
        self.sel = selectors.DefaultSelector()
        self.child: subprocess.Popen | None = None
        self.sampler: GroupSampler | None = None
        self.nvml: Nvml | None = None
        self.partial = {wire.STDOUT: b"", wire.STDERR: b""}
        self.out_fds: dict[int, int] = {}  # fd -> stream
        self.paused = False
        self.stdin_buf = stdin_rest
        self.progress_buf = b""
        self.progress_fd: int | None = None
        self.last_launcher = time.monotonic()
        self.stop_reason: str | None = None
        self.launcher_gone = False  # EOF, broken channel or no ping: nobody will read what we send
        self.kill_at: float | None = None
        self.started_how: str | None = None
        self.progress: dict[str, Any] | None = None
        self.profile: dict[str, Any] | None = None
        self.seq = 0
        self.log_file: Any = None
        self.sig_r, self.sig_w = os.pipe()

    # --- plumbing --------------------------------------------------------------------------

    def msg(self, obj: dict[str, Any]) -> None:
        obj.setdefault("ts", time.time())
        self.writer.send(wire.msg_frame(obj))

    def _on_signal(self, signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):
            os.write(self.sig_w, bytes([signum]))

    def _install_signals(self) -> None:
        os.set_blocking(self.sig_w, False)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        self.sel.register(self.sig_r, selectors.EVENT_READ, "signal")

    # --- phases ------------------------------------------------------------------------------

    def main(self) -> int:
        self.writer.start()
        self.writer.send(wire.MARKER)
        self._install_signals()
        os.makedirs(self.remote_dir, mode=0o700, exist_ok=True)
        self.log_file = open(os.path.join(self.remote_dir, "output.log"), "wb", buffering=0)  # noqa: SIM115
        self.nvml = Nvml()
        facts = node_facts(self.cfg, self.nvml)
        self.msg({"type": "hello", "pid": os.getpid(), "remote_dir": self.remote_dir, "facts": facts})
        os.set_blocking(self.in_fd, False)
        self.sel.register(self.in_fd, selectors.EVENT_READ, "stdin")
        if self.cfg.get("wait_for_go", True) and not self._wait_for_go():
            return self._finish_not_started()
        try:
            self._spawn()
        except OSError as exc:
            return self._spawn_failed(exc)
        return self._loop()

    def _wait_for_go(self) -> bool:
        next_beat = time.monotonic()
        for cmd in self._split_commands():
            if cmd.get("op") == "go":
                return True
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self.msg({"type": "heartbeat", "seq": self._next_seq(), "state": "waiting"})
                next_beat = now + self.interval
            if self.stop_reason or self.writer.broken:
                return False
            if now - self.last_launcher > self.launcher_timeout:
                self.stop_reason = "launcher unreachable (no ping) before the start"
                return False
            for key, _ in self.sel.select(timeout=min(0.5, max(0.0, next_beat - now))):
                if key.data == "stdin":
                    for cmd in self._read_commands():
                        if cmd.get("op") == "go":
                            return True
                        if cmd.get("op") == "stop":
                            self.stop_reason = cmd.get("reason") or "stopped by the launcher"
                            return False
                elif key.data == "signal":
                    os.read(self.sig_r, 64)
                    self.stop_reason = "worker_entry received a signal before the start"
                    return False

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.cfg.get("env", {}))
        for key in PATH_VARS:
            if key in env:
                env[key] = os.path.expanduser(env[key])
        if self.cfg.get("instrument", True):
            env["PYTHONPATH"] = SITE_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _spawn(self) -> None:
        env = self._child_env()
        pr, pw = os.pipe()
        env["TFCLUSTER_PROGRESS_FD"] = str(pw)
        workdir = self.cfg.get("workdir")
        try:
            self.child = subprocess.Popen(
                self.cfg["argv"],
                cwd=os.path.expanduser(workdir) if workdir else None,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # own session and process group: we can signal all of it
                pass_fds=(pw,),
                preexec_fn=_pdeathsig_preexec(),
                bufsize=0,
            )
        finally:
            os.close(pw)
        self.progress_fd = pr
        os.set_blocking(pr, False)
        self.sel.register(pr, selectors.EVENT_READ, "progress")
        for stream, pipe in ((wire.STDOUT, self.child.stdout), (wire.STDERR, self.child.stderr)):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            self.out_fds[fd] = stream
            self.sel.register(fd, selectors.EVENT_READ, ("out", stream))
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(self.child.pid)
            self.sel.register(pidfd, selectors.EVENT_READ, "exit")
        self.sampler = GroupSampler(self.child.pid)
        self.msg({"type": "spawned", "pid": self.child.pid})

    def _spawn_failed(self, exc: OSError) -> int:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        what = self.cfg["argv"][0]
        text = f"worker_entry: cannot start {what!r}: {exc.strerror or exc}\n".encode()
        if isinstance(exc, FileNotFoundError):
            text = f"worker_entry: command not found or workdir missing: {what!r} ({exc.strerror})\n".encode()
        self._emit(wire.STDERR, text)
        self._write_exit({"code": code, "signal": None, "error": text.decode().strip()})
        self.msg({"type": "exited", "code": code, "signal": None, "error": text.decode().strip()})
        self.writer.flush(10)
        return code

    def _finish_not_started(self) -> int:
        self._write_exit({"code": None, "signal": None, "not_started": True, "reason": self.stop_reason})
        self.msg({"type": "exited", "code": None, "signal": None, "not_started": True, "reason": self.stop_reason})
        self.writer.flush(5)
        return 0

    # --- the loop ----------------------------------------------------------------------------

    def _loop(self) -> int:
        assert self.child is not None
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + self.interval
            if self.writer.broken and not self.launcher_gone:
                self.launcher_gone = True
                self._begin_stop("launcher channel broken", signal.SIGTERM, self.lost_grace)
            if not self.launcher_gone and now - self.last_launcher > self.launcher_timeout:
                self.launcher_gone = True
                self._begin_stop(
                    f"launcher unreachable: no message for {self.launcher_timeout:g}s", signal.SIGTERM, self.lost_grace
                )
            if self.kill_at is not None and now >= self.kill_at:
                self._kill_group(signal.SIGKILL)
                self.kill_at = None
            self._apply_backpressure()
            if self.child.poll() is not None:
                return self._finish()
            timeout = max(0.0, min(next_beat - now, 0.5, (self.kill_at - now) if self.kill_at else 0.5))
            if self.paused:
                timeout = min(timeout, 0.05)
            for key, _ in self.sel.select(timeout=timeout):
                data = key.data
                if data == "stdin":
                    for cmd in self._read_commands():
                        self._command(cmd)
                elif data == "progress":
                    self._read_progress()
                elif data == "signal":
                    sigs = os.read(self.sig_r, 64)
                    sig = signal.SIGINT if sigs and sigs[-1] == signal.SIGINT else signal.SIGTERM
                    self._begin_stop(f"worker_entry received {signal.Signals(sigs[-1]).name}", sig)
                elif data == "exit":
                    self.sel.unregister(key.fd)
                    os.close(key.fd)
                elif isinstance(data, tuple):
                    self._read_output(key.fd, data[1])

    def _apply_backpressure(self) -> None:
        if not self.paused and self.writer.pending > HIGH_WATER:
            for fd in self.out_fds:
                self.sel.unregister(fd)
            self.paused = True
        elif self.paused and (self.writer.pending < LOW_WATER or self.writer.broken):
            for fd, stream in self.out_fds.items():
                self.sel.register(fd, selectors.EVENT_READ, ("out", stream))
            self.paused = False

    def _read_commands(self) -> list[dict[str, Any]]:
        try:
            data = os.read(self.in_fd, 65536)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(self.in_fd)
            self.launcher_gone = True
            self._begin_stop("launcher closed the connection", signal.SIGTERM, self.lost_grace)
            return []
        self.last_launcher = time.monotonic()
        self.stdin_buf += data
        return self._split_commands()

    def _split_commands(self) -> list[dict[str, Any]]:
        *lines, self.stdin_buf = self.stdin_buf.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def _command(self, cmd: dict[str, Any]) -> None:
        op = cmd.get("op")
        if op == "stop":
            grace = float(cmd.get("grace_s", self.grace))
            sig = signal.SIGINT if cmd.get("signal") == signal.SIGINT else signal.SIGTERM
            self._begin_stop(cmd.get("reason") or "stopped by the launcher", sig, grace)

    def _begin_stop(self, reason: str, sig: int, grace: float | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.msg({"type": "stopping", "reason": reason})
            self._kill_group(sig)
            self.kill_at = time.monotonic() + (self.grace if grace is None else grace)
        elif grace is not None and grace == 0:
            self.kill_at = time.monotonic()

    def _kill_group(self, sig: int) -> None:
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)
        if sig == signal.SIGKILL:
            self._kill_escaped()

    def _kill_escaped(self) -> None:
        """Descendants that left our process group (setsid, daemonized helpers): by PID + start time."""
        if psutil is None or self.sampler is None:
            return
        for pid, created in list(self.sampler.seen.items()):
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 0.01:
                    p.kill()
            except Exception:
                continue

    def _read_output(self, fd: int, stream: int) -> bool:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(fd)
            self.out_fds.pop(fd, None)
            return False
        buf = self.partial[stream] + data
        cut = buf.rfind(b"\n") + 1
        if cut == 0 and len(buf) > MAX_LINE:
            buf += b"\n"
            cut = len(buf)
        if cut:
            self._emit(stream, buf[:cut])
        self.partial[stream] = buf[cut:]
        return True

    def _emit(self, stream: int, data: bytes) -> None:
        if self.log_file is not None:
            try:
                self.log_file.write(data)
            except OSError:
                pass
        self.writer.send(wire.log_frame(stream, data))

    def _read_progress(self) -> None:
        assert self.progress_fd is not None
        try:
            data = os.read(self.progress_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(self.progress_fd)
            os.close(self.progress_fd)
            self.progress_fd = None
            return
        self.progress_buf += data
        *lines, self.progress_buf = self.progress_buf.split(b"\n")
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            kind = rec.get("kind")
            if kind == "progress":
                self.progress = rec
                self._mark_started("progress")
            elif kind == "strategy":
                self._mark_started("strategy")
                self.msg({"type": "strategy", **rec})
            elif kind == "profile":
                self.profile = rec
                self.msg({"type": "profile", **rec})

    def _mark_started(self, how: str) -> None:
        if self.started_how is None:
            self.started_how = how
            self.msg({"type": "started", "how": how})

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _heartbeat(self) -> None:
        if self.started_how is None and self.tf_port and listening(int(self.tf_port)):
            self._mark_started("tf_server")
        hb: dict[str, Any] = {"type": "heartbeat", "seq": self._next_seq()}
        if self.sampler is not None:
            hb.update(self.sampler.sample())
        load = os.getloadavg()
        hb["load1"] = round(load[0], 2)
        if self.nvml is not None and self.nvml.available:
            hb["gpus"] = self.nvml.utilization()
        if self.progress is not None:
            hb["progress"] = self.progress
        self.msg(hb)

    # --- the end -----------------------------------------------------------------------------

    def _finish(self) -> int:
        assert self.child is not None
        rc = self.child.returncode
        ended = time.time()
        # The main process is gone; whatever it left in its group would be an orphan.
        self._kill_group(signal.SIGTERM)
        start = time.monotonic()
        killed = False
        while self.out_fds and time.monotonic() < start + DRAIN_TIMEOUT_S:
            if not killed and time.monotonic() > start + 1.0:
                self._kill_group(signal.SIGKILL)
                killed = True
            for key, _ in self.sel.select(timeout=0.1):
                if isinstance(key.data, tuple):
                    self._read_output(key.fd, key.data[1])
                elif key.data == "progress":
                    self._read_progress()
        self._kill_group(signal.SIGKILL)
        for stream in (wire.STDOUT, wire.STDERR):
            if self.partial[stream]:
                self._emit(stream, self.partial[stream] + b"\n")
                self.partial[stream] = b""
        if self.progress is not None:
            self._heartbeat()
        code = rc if rc >= 0 else None
        sig = -rc if rc < 0 else None
        status = {
            "code": code,
            "signal": sig,
            "signal_name": signal.Signals(sig).name if sig else None,
            "stopped": self.stop_reason is not None,
            "reason": self.stop_reason,
            "ended": ended,
        }
        self._write_exit(status)
        self.msg({"type": "exited", **status})
        # Every line is on the node's disk already; wait for the channel only if someone listens.
        self.writer.flush(1.0 if self.launcher_gone else 30.0)
        return code if code is not None else 128 + (sig or 0)

    def _write_exit(self, status: dict[str, Any]) -> None:
        if self.log_file is not None:
            with contextlib.suppress(OSError):
                status["log_bytes"] = os.fstat(self.log_file.fileno()).st_size
                self.log_file.close()
        path = os.path.join(self.remote_dir, "exit.json")
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as f:
                json.dump(status, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)


def run(config: dict[str, Any], stdin_rest: bytes = b"") -> int:
    """Entry for `python -m worker_entry`: fd 1 becomes the frame channel, stray prints go to stderr."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Runner(config, out_fd, 0, stdin_rest).main()
