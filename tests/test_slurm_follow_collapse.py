"""The Slurm login-node follower shows what every rank says once, as the launcher's console does (issue
32.10): the same ``sinks.collapse.ConsoleLines`` over the lines of the run's combined.log, written here by
the real ``LogRouter`` from TensorFlow's start-up lines as three tasks printed them (captured from TF
2.21). A fake clock decides the window: no test sleeps, no Slurm is asked (``_pump`` reads the run
directory only)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from orchestrator.runs import RunDir
from orchestrator.schedulers.slurm.follow import Follower
from orchestrator.schedulers.slurm.launch import _Silent
from orchestrator.sinks.collapse import NOISE_NOTE, WINDOW_S
from orchestrator.sinks.logs import LogRouter

# what each of three tasks printed at start-up (TF 2.21, its glog header differs in time and thread id)
BANNER = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1795795645.604184   21712 cpu_feature_guard.cc:227] This TensorFlow binary is optimized"
    b" to use available CPU instructions in performance-critical operations.",
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the"
    b" appropriate compiler flags.",
]
SAYS = b"Epoch 1/2"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _run(tmp_path: Path, tasks: int = 3) -> tuple[RunDir, LogRouter]:
    """A run directory whose combined.log the supervisor's own router writes (its console off)."""
    run = RunDir.create(tmp_path / "run")
    router = LogRouter(run, echo=False)
    router.open_attempt(0, [(f"worker:{i}", f"worker-{i}", f"n{i + 1}") for i in range(tasks)])
    return run, router


def _say(router: LogRouter, tasks: int, *lines: bytes, thread: int = 21712) -> None:
    for i in range(tasks):  # each task's glog header its own, as printed
        text = b"\n".join(ln.replace(b"21712", str(thread + i).encode()) for ln in lines)
        router.write(f"worker:{i}", text + b"\n")
    router.flush()


def _follower(run: RunDir, tasks: int = 3, **kw) -> tuple[Follower, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    plan = SimpleNamespace(nodes=tuple(range(tasks)))  # the follower asks the plan only how many tasks
    follower = Follower(run, plan, out=out, err=io.StringIO(), clock=clock, **kw)  # type: ignore[arg-type]
    follower.color = False
    return follower, out, clock


def test_the_follower_shows_a_line_every_task_printed_once_and_hides_tf_chatter(tmp_path):
    run, router = _run(tmp_path)
    _say(router, 3, *BANNER, SAYS)
    follower, out, clock = _follower(run)
    follower._pump()
    assert out.getvalue() == NOISE_NOTE.decode()  # the rest held for the window
    clock.t += WINDOW_S
    follower._pump()
    assert out.getvalue() == NOISE_NOTE.decode() + f"[worker:0-2] {SAYS.decode()}\n"
    router.write("worker:1", b"only worker:1 says this\n")
    router.close()
    follower._pump()
    follower.lines.close()  # the run's end shows what is held
    assert out.getvalue().endswith("[worker:1 n2] only worker:1 says this\n")
    assert out.getvalue().count("Epoch 1/2") == 1 and "cpu_feature_guard" not in out.getvalue()
    combined = run.combined_log.read_bytes()  # the logs keep every copy
    assert combined.count(SAYS) == 3 and combined.count(b"cpu_feature_guard") == 3
    for i in range(3):
        assert (run.path / "logs" / f"worker-{i}.log").read_bytes().count(SAYS) == 1


def test_the_follower_with_all_output_shows_every_line_as_it_comes(tmp_path):
    run, router = _run(tmp_path)
    _say(router, 3, *BANNER, SAYS)
    router.close()
    follower, out, _ = _follower(run, all_output=True)
    follower._pump()  # no window: at once
    shown = out.getvalue().splitlines()
    assert [ln for ln in shown if ln.endswith("Epoch 1/2")] == [f"[worker:{i} n{i + 1}] Epoch 1/2" for i in range(3)]
    assert sum("cpu_feature_guard" in ln for ln in shown) == 3 and NOISE_NOTE.decode().strip() not in shown


def test_a_launcher_note_shows_the_lines_held_before_it_first(tmp_path):
    run, router = _run(tmp_path)
    _say(router, 3, SAYS)
    router.open_attempt(1, [(f"worker:{i}", f"worker-{i}", f"n{i + 1}") for i in range(3)])  # "=== attempt 1 ==="
    _say(router, 3, SAYS)
    router.close()
    follower, out, _ = _follower(run)
    follower._pump()
    follower.lines.close()
    assert out.getvalue().splitlines() == [
        "[worker:0-2] Epoch 1/2",
        "[tfcluster] === attempt 1 ===",
        "[worker:0-2] Epoch 1/2",
    ]


def test_one_task_waits_for_no_window_and_quiet_shows_nothing(tmp_path):
    run, router = _run(tmp_path, tasks=1)
    _say(router, 1, SAYS)
    router.close()
    follower, out, _ = _follower(run, tasks=1)
    follower._pump()
    assert out.getvalue() == "[worker:0 n1] Epoch 1/2\n"
    quiet, out, clock = _follower(run)
    quiet.query = _Silent()
    quiet._pump()
    clock.t += WINDOW_S
    quiet.lines.close()
    assert out.getvalue() == ""
