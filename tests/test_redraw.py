"""Progress bars (``\\r``/``\\b`` redraws) from the node to the console and the logs, and the live
table fitted to the terminal: the pure logic, with a real Keras ``Progbar``'s bytes where it matters."""

from __future__ import annotations

import io
import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest
from fakenode import make_plan
from rich.console import Console

from orchestrator.core.terminal import redraw_lines, safe_text
from orchestrator.runs import RunDir
from orchestrator.sinks.live import LiveTable
from orchestrator.sinks.logs import LogRouter
from worker_entry import protocol as p
from worker_entry.agent import output

PROGBAR = """
import sys, time
import keras
bar = keras.utils.Progbar(40)
for i in range(1, 41):
    time.sleep(0.01)
    bar.update(i, values=[("loss", 1.0 / i)])
print("after the bar", flush=True)
"""


@pytest.fixture(scope="module")
def keras_bytes() -> bytes:
    """What a real Keras progress bar writes to a pipe (colours, ``\\b`` runs, ``\\r``, then a newline)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", PROGBAR], capture_output=True, env=env, timeout=120, check=True).stdout
    assert out.count(b"\r") > 5 and b"\b" in out
    return out


class Frames:
    """The node's frame writer, recorded (the pure logic of ``OutputPipes``; the e2e test has the real one)."""

    pending = 0
    broken = False

    def __init__(self) -> None:
        self.frames: list[tuple[int, bytes]] = []

    def send(self, data: bytes) -> None:
        frames = p.FrameDecoder().feed(p.MARKER + data)
        self.frames += [(f.stream, f.payload) for f in frames]


def _pipes(tmp_path: Path) -> tuple[output.OutputPipes, Frames, int, int]:
    w = Frames()
    log_fd = os.open(tmp_path / "node.log", os.O_WRONLY | os.O_CREAT, 0o600)
    pipes = output.OutputPipes(selectors.DefaultSelector(), w, log_fd)
    r, wfd = os.pipe()
    os.set_blocking(r, False)
    pipes.fds[r] = p.STDOUT  # (``add`` registers a pipe object; the fd is enough here)
    return pipes, w, r, wfd


@pytest.mark.parametrize(
    ("raw", "logged"),
    [
        (b"10%\r20%\r100%\n", b"100%\n"),
        (b"ab\bc\n", b"ac\n"),
        (b"crlf\r\n", b"crlf\n"),
        (b"plain\n\xff bad\n", b"plain\n\xff bad\n"),
        (
            "\r\u2501\u2501 1/2\b\b\b\b\b\b\r\u2501\u2501\u2501\u2501 2/2\nnext\n".encode(),
            "\u2501\u2501\u2501\u2501 2/2\nnext\n".encode(),
        ),
        (b"\x1b[1mbold\x1b[0m\rover \x1b]0;t\x07\n", b"over \x1b]0;t\x07\n"),  # the rest kept as printed
    ],
)
def test_a_complete_line_is_logged_as_a_terminal_leaves_it(raw, logged):
    assert redraw_lines(raw) == logged
    assert output.redraw_lines(raw) == logged  # the node's copy of the rule agrees


def test_the_node_sends_a_bars_final_line_and_its_current_text_bounded_and_at_a_bounded_rate(tmp_path, keras_bytes):
    pipes, w, r, wfd = _pipes(tmp_path)
    bar, after = keras_bytes.split(b"\n", 1)[0], b"after the bar\n"
    half = len(bar) // 2
    os.write(wfd, bar[:half])
    pipes.read(r, p.STDOUT)
    assert len(pipes.partial[p.STDOUT]) < 400  # its current text only, however many redraws came
    pipes.tick(100.0)
    pipes.tick(100.1)  # too soon: nothing more
    assert len(w.frames) == 1
    stream, frame = w.frames[0]
    assert stream == p.STDOUT and frame.endswith(b"\r") and b"\n" not in frame and b"\b" not in frame
    assert frame.count(b"\r") == 1 and b"/40" in frame
    pipes.tick(101.0)  # nothing new: not sent again
    assert len(w.frames) == 1
    os.write(wfd, bar[half:] + b"\n" + after)
    pipes.read(r, p.STDOUT)
    pipes.tick(102.0)  # the line completed: no progress frame for it
    line = w.frames[-1][1]
    assert line == redraw_lines(bar + b"\n" + after) and b"40/40" in line and line.endswith(after)
    assert b"\r" not in line and b"\b" not in line
    assert (tmp_path / "node.log").read_bytes() == line  # the node's own log: lines only
    os.close(wfd)
    os.close(r)


def test_an_unfinished_line_is_sent_at_the_end(tmp_path):
    pipes, w, r, wfd = _pipes(tmp_path)
    os.write(wfd, b"step 1\rstep 2\r")
    pipes.read(r, p.STDOUT)
    assert pipes.partial[p.STDOUT] == b"step 2\r"  # the \r kept: what comes next replaces the line
    os.write(wfd, b"step 3")
    pipes.read(r, p.STDOUT)
    pipes.flush_partials()
    assert w.frames == [(p.STDOUT, b"step 3\n")]
    os.close(wfd)
    os.close(r)


def _router(tmp_path: Path) -> tuple[LogRouter, io.BytesIO, list]:
    run = RunDir(tmp_path / "run")
    (tmp_path / "run" / "logs").mkdir(parents=True)
    out = io.BytesIO()
    router = LogRouter(run, out=out, color=False)
    router.open_attempt(0, [("worker:0", "worker-0", "10.0.0.1"), ("worker:1", "worker-1", "10.0.0.2")])
    shown: list = []
    return router, out, shown


def test_the_logs_keep_the_final_text_and_the_live_display_gets_each_tasks_bar(tmp_path, keras_bytes):
    router, out, shown = _router(tmp_path)
    router.progress_hook = lambda task, line: shown.append((task, line))
    router.write("worker:0", b"Epoch 1/2\n")
    router.write("worker:0", b"\x1b[1m 3/40\x1b[0m ...\r")  # progress frames of both tasks, interleaved
    router.write("worker:1", b" 7/40 ...\r")
    router.write("worker:0", keras_bytes)  # an old node: the whole redraw sequence in one line
    router.write("worker:1", b"\r\b\b 40/40 done\n")
    router.close()
    assert shown == [
        ("worker:0", b"[worker:0 10.0.0.1]  3/40 ..."),
        ("worker:1", b"[worker:1 10.0.0.2]  7/40 ..."),
        ("worker:0", None),
        ("worker:1", None),
    ]
    combined = (tmp_path / "run" / "combined.log").read_bytes()
    own = (tmp_path / "run" / "logs" / "worker-0.log").read_bytes()
    for text in (combined, own, out.getvalue()):
        assert b"\r" not in text and b"\b" not in text
        assert b"3/40" not in text and b"7/40" not in text  # progress frames are logged nowhere
    lines = combined.decode().splitlines()
    assert len(lines) == 4 and max(map(len, lines)) < 300
    final = safe_text(keras_bytes.decode().split("\n")[0])  # what the bar ended as, colours aside
    assert "40/40" in final and safe_text(lines[1]).endswith("[worker:0 10.0.0.1] " + final)
    assert "40/40" in lines[1] and lines[2].endswith("[worker:0 10.0.0.1] after the bar")
    assert lines[3].endswith("[worker:1 10.0.0.2]  40/40 done")
    console = out.getvalue().decode().splitlines()
    assert all(line.startswith(("[worker:0 10.0.0.1] ", "[worker:1 10.0.0.2] ")) for line in console)


def test_a_bar_its_task_never_finished_is_logged_when_the_attempt_ends(tmp_path):
    router, _, _ = _router(tmp_path)
    router.write("worker:1", b" 12/40 [=====>    ]\r")
    router.close()
    assert (
        (tmp_path / "run" / "combined.log")
        .read_text()
        .splitlines()[-1]
        .endswith("[worker:1 10.0.0.2]  12/40 [=====>    ]")
    )


def _live(width: int, n: int = 3) -> tuple[LiveTable, Console, io.StringIO]:
    _, plan = make_plan(n)
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None)
    return LiveTable(plan, console=console), console, buf


STATUS = {
    "state": "running",
    "tasks": {
        f"worker:{i}": {
            "host": f"gpu-node-{i:03d}.rack-7.cluster.example.org",
            "state": "running",
            "steps": 1200 + i,
            "step_time_s": 0.1234,
            "examples_per_s": 2593.0,
            "cpu_pct": 97.0,
            "rss_mb": 2048.0,
            "gpus": [{"util": 99}],
            "last_heartbeat_age_s": 0.4,
            "straggler": i == 1,
            "gpu_problems": [{"problem": "thermal throttling"}] if i == 1 else [],
        }
        for i in range(3)
    },
}


def _rendered(width: int) -> list[str]:
    live, console, buf = _live(width)
    console.print(live._render(STATUS))
    return buf.getvalue().splitlines()


def test_the_live_table_fits_160_columns_with_every_column():
    lines = _rendered(160)
    assert max(len(line) for line in lines) <= 160
    head = lines[1]
    for col in ("task", "host", "state", "step ms", "ex/s", "cpu%", "rss MB", "gpu%", "heartbeat"):
        assert col in head, head
    assert any("straggler" in line and "worker:1" in line for line in lines)


def test_the_live_table_narrows_to_80_columns_dropping_the_least_useful_first():
    lines = _rendered(80)
    assert max(len(line) for line in lines) <= 80  # nothing cut at the right edge: it fits
    head = lines[1]
    for col in ("task", "state", "step", "step ms", "ex/s"):
        assert col in head, head
    for dropped in ("rss MB", "cpu%"):
        assert dropped not in head
    row = next(line for line in lines if "worker:1" in line)
    assert "running" in row and "123.4" in row and "2593" in row and "strag" in row


def test_progress_lines_show_above_the_table_with_their_prefix_and_fit_the_width():
    live, console, buf = _live(80, n=12)
    bar = "[worker:0 10.0.0.1] " + " 3/40 " + "\u2501" * 60 + " 1s 50ms/step - loss: 0.1234"
    live.progress("worker:0", bar.encode())
    for i in range(1, 12):
        live.progress(f"worker:{i}", f"[worker:{i} 10.0.0.{i + 1}]  5/40".encode())
    console.print(live.screen)  # what the live region shows: the bars, then the table
    lines = buf.getvalue().splitlines()
    assert lines[9].startswith("fake — starting") and max(map(len, lines)) <= 80
    assert lines[0].startswith("[worker:0 10.0.0.1]  3/40") and len(lines[0]) <= 80 and lines[0].endswith("…")
    assert [line.split("]")[0] for line in lines[1:8]] == [f"[worker:{i} 10.0.0.{i + 1}" for i in range(1, 8)]
    assert lines[8] == "… and 4 more tasks drawing a progress bar"
    live.progress("worker:0", None)
    assert len(live.progress_lines()) == 9 and "worker:0" not in live.progress_lines()[0].plain


def test_an_unfinished_line_that_is_not_redrawn_waits_for_its_newline(tmp_path):
    pipes, w, r, wfd = _pipes(tmp_path)
    os.write(wfd, b"loading data ...")
    pipes.read(r, p.STDOUT)
    pipes.tick(100.0)
    assert w.frames == []  # nothing in place: it is sent once complete, as before
    os.write(wfd, b" done\n")
    pipes.read(r, p.STDOUT)
    assert w.frames == [(p.STDOUT, b"loading data ... done\n")]
    os.close(wfd)
    os.close(r)
