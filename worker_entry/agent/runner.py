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

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any

from .. import protocol as p
from ..protocol.cluster import slurm_node_name
from .child import kill_escaped, kill_group, signal_name, spawn, spawn_error, wait_gone
from .gpuowner import TaskTree
from .handover import hand_over
from .hoststats import HostSampler
from .output import OutputPipes
from .records import ProgressRecords
from .sysinfo import GroupSampler, Nvml, listening, node_facts
from .taskdir import TaskDir
from .writer import FrameWriter

DRAIN_TIMEOUT_S = 3.0
TREE_GONE_S = 2.0  # after SIGKILL: how long the task's processes may take to be gone


class Runner:
    def __init__(self, config: p.NodeConfig, out_fd: int, in_fd: int | None, stdin_rest: bytes = b"") -> None:
        """``in_fd`` None: no launcher sends commands (a Kubernetes pod); nothing times out waiting for it."""
        self.cfg = config
        self.in_fd = in_fd
        self.writer = FrameWriter(out_fd)
        self.interval = config.heartbeat_interval_s
        self.launcher_timeout = config.launcher_timeout_s if in_fd is not None else float("inf")
        self.grace = config.stop_grace_s
        # Without a launcher the job is lost anyway: no point waiting out the full grace.
        self.lost_grace = config.failure_grace_s
        self.tf_port = config.tf_port
        self.remote_dir = os.path.expanduser(config.remote_dir)
        self.sel = selectors.DefaultSelector()
        self.child: subprocess.Popen | None = None
        self.sampler: GroupSampler | None = None
        self.host: HostSampler | None = None
        self.nvml: Nvml | None = None
        self.tree: TaskTree | None = None  # whose a process on a GPU is
        self.stdin_buf = stdin_rest
        self.progress_fd: int | None = None
        self.records = ProgressRecords(self.msg, lambda text: self._emit(p.STDERR, text))
        self.last_launcher = time.monotonic()
        self.stop_reason: str | None = None
        self.launcher_gone = False  # EOF, broken channel or no ping: nobody will read what we send
        self.kill_at: float | None = None
        self.seq = 0
        self.beats_running = 0  # heartbeats sent since the command started
        self.out: OutputPipes | None = None
        self.task_dir: TaskDir | None = None
        self.sig_r, self.sig_w = os.pipe()

    # --- plumbing --------------------------------------------------------------------------

    def msg(self, message: p.Message) -> None:
        self.writer.send(p.msg_frame(message))

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
        self.writer.send(p.MARKER)
        self._install_signals()
        # nothing another user planted is followed (a pod's filesystem is its own: in_fd None)
        self.task_dir = TaskDir(self.remote_dir, self.cfg.env, pod=self.in_fd is None)
        self.out = OutputPipes(self.sel, self.writer, self.task_dir.open_log())
        self.nvml = Nvml()
        found = node_facts(self._probe_config(), self.nvml)
        found["problems"] += self.task_dir.problems  # an unsafe task or backup directory: no go
        facts = p.NodeFacts.from_dict(found)
        self.nvml.restrict(self.cfg.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")))
        self.msg(
            p.Hello(
                pid=os.getpid(),
                remote_dir=self.remote_dir,
                facts=facts,
                task=self.cfg.task,
                tf_endpoint=self.cfg.own_endpoint(),
                node_name=slurm_node_name(os.environ),
            )
        )
        if self.in_fd is not None:
            os.set_blocking(self.in_fd, False)
            self.sel.register(self.in_fd, selectors.EVENT_READ, "stdin")
        if self.cfg.wait_for_go and not self._wait_for_go():
            return self._finish_not_started()
        try:
            self._spawn()
        except OSError as exc:
            return self._spawn_failed(exc)
        return self._loop()

    def _probe_config(self) -> dict[str, Any]:
        c = self.cfg
        return {"workdir": c.workdir, "tf_port": c.tf_port, "gpus": c.gpus, "env": c.env, "command": c.argv}

    def _wait_for_go(self) -> bool:
        next_beat = time.monotonic()
        for cmd in self._split_commands():
            if isinstance(cmd, p.Go):
                return True
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self.msg(p.Heartbeat(seq=self._next_seq(), ts=time.time(), state="waiting"))
                next_beat = now + (self.cfg.waiting_heartbeat_s or self.interval)  # spread out at thousands
            if self.stop_reason or self.writer.broken:
                return False
            if now - self.last_launcher > self.launcher_timeout:
                self.stop_reason = "launcher unreachable (no ping) before the start"
                return False
            for key, _ in self.sel.select(timeout=min(0.5, max(0.0, next_beat - now))):
                if key.data == "stdin":
                    for cmd in self._read_commands():
                        if isinstance(cmd, p.Go):
                            return True
                        if isinstance(cmd, p.Stop):
                            self.stop_reason = cmd.reason
                            return False
                elif key.data == "signal":
                    os.read(self.sig_r, 64)
                    self.stop_reason = "worker_entry received a signal before the start"
                    return False

    def _spawn(self) -> None:
        pr, pw = os.pipe()
        try:
            self.child = spawn(self.cfg, pw)
        except OSError:
            os.close(pr)
            raise
        finally:
            os.close(pw)
        self.progress_fd = pr
        os.set_blocking(pr, False)
        self.sel.register(pr, selectors.EVENT_READ, "progress")
        assert self.out is not None
        self.out.add(p.STDOUT, self.child.stdout)
        self.out.add(p.STDERR, self.child.stderr)
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(self.child.pid)
            self.sel.register(pidfd, selectors.EVENT_READ, "exit")
        self.sampler = GroupSampler(self.child.pid)
        self.host = HostSampler(self.child.pid)
        self.tree = TaskTree(os.getpid(), self.child.pid)
        self.msg(p.Spawned(pid=self.child.pid))

    def _spawn_failed(self, exc: OSError) -> int:
        code, text = spawn_error(self.cfg, exc)
        self._emit(p.STDERR, text.encode() + b"\n")
        self._end(p.Exited(code=code, error=text, ended=time.time()))
        return code

    def _finish_not_started(self) -> int:
        self._end(p.Exited(not_started=True, reason=self.stop_reason, ended=time.time()))
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
            self.out.backpressure()
            self.out.tick(now)  # an unfinished line being redrawn (a progress bar): its current text
            if self.child.poll() is not None:
                return self._finish()
            timeout = max(0.0, min(next_beat - now, 0.5, (self.kill_at - now) if self.kill_at else 0.5))
            if self.out.paused:
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
                    self.out.read(key.fd, data[1])

    def _read_commands(self) -> list[p.Message]:
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

    def _split_commands(self) -> list[p.Message]:
        *lines, self.stdin_buf = self.stdin_buf.split(b"\n")
        if len(self.stdin_buf) > p.MAX_COMMAND_LINE:  # no newline in sight: not a command stream
            self.stdin_buf = b""
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(p.parse_command(line))
                except p.ProtocolError as exc:
                    self._emit(p.STDERR, f"worker_entry: ignoring a bad command from the launcher: {exc}\n".encode())
        return out

    def _command(self, cmd: p.Message) -> None:
        if isinstance(cmd, p.Stop):
            grace = self.grace if cmd.grace_s is None else cmd.grace_s
            sig = signal.SIGINT if cmd.signal == signal.SIGINT else signal.SIGTERM
            self._begin_stop(cmd.reason, sig, grace)

    def _begin_stop(self, reason: str, sig: int, grace: float | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.msg(p.Stopping(reason=reason))
            self._kill_group(sig)
            self.kill_at = time.monotonic() + (self.grace if grace is None else grace)
        elif grace is not None and grace == 0:
            self.kill_at = time.monotonic()

    def _kill_group(self, sig: int) -> None:
        if self.child is None:
            return
        kill_group(self.child.pid, sig)
        if sig == signal.SIGKILL and self.sampler is not None:
            kill_escaped(self.sampler.seen)

    def _emit(self, stream: int, data: bytes) -> None:
        if self.out is not None:
            self.out.emit(stream, data)
        else:
            self.writer.send(p.log_frame(stream, data))

    def _read_progress(self) -> bool:
        """Read and act on what the pipe holds; False when it is empty for now or closed."""
        if self.progress_fd is None:
            return False
        try:
            data = os.read(self.progress_fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(self.progress_fd)
            os.close(self.progress_fd)
            self.progress_fd = None
            return False
        self.records.feed(data)
        return True

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _heartbeat(self) -> None:
        if self.records.started_how is None and self.tf_port and listening(int(self.tf_port)):
            self.records.mark_started("tf_server")
        # The beat sent as the task starts carries no process sample (no rate yet, and psutil's
        # import would delay every host's start); a task that ends within an interval needs none.
        sample = self.sampler.sample() if self.sampler is not None and self.beats_running > 0 else {}
        self.beats_running += self.sampler is not None
        gpus = self.nvml.sample(self.tree) if self.nvml is not None and self.nvml.available else None
        host = self.host.sample() if self.host is not None else {}
        self.msg(
            p.Heartbeat(
                seq=self._next_seq(),
                ts=time.time(),
                load1=round(os.getloadavg()[0], 2),
                gpus=_checked(lambda: [p.GpuSample.from_dict(g) for g in gpus]) if gpus is not None else None,
                progress=self.records.progress,
                host=_checked(lambda: p.HostSample.from_dict(host)) if host else None,
                **sample,
            )
        )

    # --- the end -----------------------------------------------------------------------------

    def _finish(self) -> int:
        assert self.child is not None
        rc = self.child.returncode
        ended = time.time()
        # The main process is gone; whatever it left in its group would be an orphan.
        self._kill_group(signal.SIGTERM)
        start = time.monotonic()
        killed = False
        while self.out.open and time.monotonic() < start + DRAIN_TIMEOUT_S:
            if not killed and time.monotonic() > start + 1.0:
                self._kill_group(signal.SIGKILL)
                killed = True
            for key, _ in self.sel.select(timeout=0.1):
                if isinstance(key.data, tuple):
                    self.out.read(key.fd, key.data[1])
                elif key.data == "progress":
                    self._read_progress()
        self._kill_group(signal.SIGKILL)
        for _ in range(64):  # the last record (written at the process's exit) counts its last steps
            if not self._read_progress():
                break
        # Exit only once the task's processes are gone: worker_entry's exit is the launcher's confirmation.
        left = wait_gone(self.child.pid, self.sampler.seen if self.sampler is not None else {}, TREE_GONE_S)
        if left:
            self._emit(
                p.STDERR,
                f"worker_entry: {len(left)} process(es) of the task still run "
                f"{TREE_GONE_S:g}s after SIGKILL: pids {' '.join(map(str, left[:20]))}\n".encode(),
            )
        self.out.flush_partials()
        if self.records.progress is not None:
            self._heartbeat()
        code = rc if rc >= 0 else None
        sig = -rc if rc < 0 else None
        exited = p.Exited(
            code=code,
            signal=sig,
            signal_name=signal_name(sig),
            stopped=self.stop_reason is not None,
            reason=self.stop_reason,
            ended=ended,
        )
        self._end(exited)
        return code if code is not None else 128 + (sig or 0)

    def _end(self, exited: p.Exited) -> None:
        """Record and report the exit, then hand over what the launcher may still fetch (if it listens)."""
        log_bytes = self._write_exit(exited.to_dict())
        self.msg(exited)
        if not self.launcher_gone and not self.writer.broken and self.in_fd is not None:  # None: a pod
            hand_over(self.cfg, self.writer, self.in_fd, self.stdin_buf, self.remote_dir, log_bytes)
        # Every line is on the node's disk already; wait for the channel only if someone listens.
        self.writer.flush(1.0 if self.launcher_gone else 30.0)

    def _write_exit(self, status: dict[str, Any]) -> int | None:
        log_bytes = self.out.close() if self.out is not None else None
        status["log_bytes"] = log_bytes
        if self.task_dir is not None:
            self.task_dir.write_exit(status)
        return log_bytes


def run(config: p.NodeConfig, stdin_rest: bytes = b"") -> int:
    """Entry for `python -m worker_entry`: fd 1 becomes the frame channel, stray prints go to stderr."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Runner(config, out_fd, 0, stdin_rest).main()


def _checked(build: Any) -> Any:
    """A heartbeat's evidence record, or None when a reading is outside the protocol's ranges (a
    driver's or kernel's odd counter): the beat still goes out, since a task whose agent died on its
    own evidence would be judged lost, and its host blamed, for a reading."""
    try:
        return build()
    except p.ProtocolError:
        return None
