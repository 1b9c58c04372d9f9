"""A task cannot drive the user's terminal: escape sequences it prints (window title, clipboard, clear
screen, cursor moves, bell, 8-bit CSI, bidi overrides) reach neither `launch`'s console nor
`tfcluster logs`, on a pipe or on a terminal; the text around them does, colours (SGR) only on a
terminal and reset at the line's end; the run directory keeps the bytes as printed. Real sshd hosts,
the real launcher; the preflight table and the console's events with a node's hostile facts."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import time

import pytest
from conftest import PY, WORKLOADS, _env, assert_no_job_processes, launch_argv, run_cli, run_launch

from orchestrator.core.terminal import safe_bytes, safe_text
from orchestrator.events import kinds as k
from orchestrator.schedulers.ssh.preflight import HostReport, PreflightReport, preflight_text
from orchestrator.sinks import ConsoleSink
from worker_entry import protocol as p

ESCAPES = [PY, str(WORKLOADS / "escapes.py")]
#: What drives a terminal: ESC of any sequence but SGR, BEL, the 8-bit CSI, bidi overrides.
FORBIDDEN = ["\x1b]", "\x1b[2J", "\x1b[1;1H", "\x07", "\x9b", "\u202e"]
TEXT = [
    "beforemiddleafter",
    "copy paste",
    "bell\\x07 c1 done",
    "colour red plain",
    "bidi \\u202eevil\\u202c end",
    "progress 100%",
]


def _visible(shown: str) -> str:
    return shown.replace("\x1b[31m", "").replace("\x1b[0m", "")


def _check_safe(shown: str, *, colour: bool) -> None:
    for bad in FORBIDDEN:
        assert bad not in shown, (bad, shown)
    for text in TEXT:
        assert text in _visible(shown), (text, shown)
    if colour:
        assert "\x1b[31mred\x1b[0m plain\x1b[0m" in shown  # kept, and reset at the line's end
    else:
        assert "\x1b" not in shown


@pytest.mark.e2e
def test_a_tasks_escape_sequences_reach_neither_the_console_nor_logs(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "escapes", ESCAPES)
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 0, r.stderr[-3000:]
    for i in range(2):  # each task's lines: with its own prefix, or collapsed with the other's (sinks.collapse)
        assert f"[worker:{i} " in r.stdout or "[worker:0-1] " in r.stdout
    _check_safe(r.stdout, colour=False)
    raw = (r.run_dir / "logs" / "worker-0.log").read_bytes()
    assert b"\x1b]0;pwned-title\x07" in raw and b"\xc2\x9b6n" in raw  # the record keeps the bytes as printed
    assert b"\x1b]52;c;" in (r.run_dir / "combined.log").read_bytes()
    shown = run_cli("logs", str(r.run_dir))
    assert shown.returncode == 0, shown.stderr
    _check_safe(shown.stdout, colour=False)
    raw_mode = run_cli("logs", str(r.run_dir), "--raw", "--task", "worker:1")
    _check_safe(raw_mode.stdout, colour=False)
    assert_no_job_processes(tb, 5)


def _on_a_terminal(argv: list[str], timeout: float = 240) -> tuple[int, str]:
    """Run ``argv`` with its stdout and stderr on a pseudo-terminal (colours on); all it printed."""
    master, slave = pty.openpty()
    env = {k: v for k, v in _env().items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=str(WORKLOADS.parent.parent)
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.e2e
def test_on_a_terminal_colours_stay_and_nothing_else_does(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "escapes-tty", ESCAPES)
    rc, shown = _on_a_terminal(launch_argv(tb, spec, tmp_path / "run", "--no-live"))
    assert rc == 0, shown[-3000:]
    _check_safe(shown.replace("\r\n", "\n"), colour=True)
    rc, logs = _on_a_terminal([PY, "-m", "orchestrator", "logs", str(tmp_path / "run")], timeout=60)
    assert rc == 0, logs
    _check_safe(logs.replace("\r\n", "\n"), colour=True)
    assert_no_job_processes(tb, 5)


def test_a_nodes_facts_in_the_preflight_table_and_events_on_the_console_are_made_safe():
    facts = p.NodeFacts(
        hostname="gpu01\x1b]0;owned\x07",
        python="3.11\x1b[2J",
        packages={"tensorflow": "2.21.0\x07"},
        gpus=[p.GpuInfo(index=0, name="Tesla\x1b[1;1H T4\u202e", memory_mb=16384)],
    )
    report = PreflightReport([HostReport(task="worker:0", host="10.0.0.1", ssh="ok", facts=facts)])
    text = preflight_text(report)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "gpu01" in text and "Tesla T4" in text and "2.21.0\\x07" in text
    stream = io.StringIO()
    sink = ConsoleSink(stream=stream, color=True)
    sink.handle(k.NodeProtocolError(task="worker:1", host="h\x1b[2J", message="bad frame \x1b]52;c;eA==\x07 from node"))
    sink.handle(k.JobWarning(message="GPU \x1b[5mblink\x1b[0m \x9b2J"))
    out = stream.getvalue()
    assert "bad frame  from node" in out and "GPU blink" in out
    for bad in ("\x1b[2J", "\x1b]", "\x07", "\x9b", "\x1b[5m"):
        assert bad not in out, bad
    assert "\x1b[1m" in out  # tfcluster's own colours stay


@pytest.mark.parametrize(
    ("raw", "plain", "coloured"),
    [
        ("a\x1b]0;t\x07b\x1b[2Jc", "abc", "abc"),
        ("\x1b[1;31mred\x1b[0m", "red", "\x1b[1;31mred\x1b[0m\x1b[0m"),
        ("\x1b[38;5;1mx", "x", "\x1b[38;5;1mx\x1b[0m"),
        ("x\x1b[?25l\x1b[6n\x1bc\x1b(0y", "xy", "xy"),
        ("dcs \x1bPq#0\x1b\\ apc \x1b_g\x1b\\ end", "dcs  apc  end", "dcs  apc  end"),
        ("tab\tkept", "tab\tkept", "tab\tkept"),
        ("10%\r20%\r", "20%", "20%"),
        ("ab\bc", "ac", "ac"),
        ("x\x1b[31\bmH", "xH", "x\x1b[3mH\x1b[0m"),  # an erase cannot complete a sequence
        ("nul\x00 del\x7f", "nul\\x00 del\\x7f", "nul\\x00 del\\x7f"),
        ("\u200fr\u2066l", "\\u200fr\\u2066l", "\\u200fr\\u2066l"),
        ("two\nlines\x1b[31m", "two\nlines", "two\nlines\x1b[31m\x1b[0m"),
        ("unicode é € ✓ stays", "unicode é € ✓ stays", "unicode é € ✓ stays"),
    ],
)
def test_safe_text(raw, plain, coloured):
    assert safe_text(raw) == plain
    assert safe_text(raw, keep_sgr=True) == coloured


def test_safe_bytes_passes_plain_output_through_untouched():
    data = b"epoch 1/3 loss=0.25\n" * 1000
    assert safe_bytes(data) is data
    assert safe_bytes(b"bad \xff byte \x1b[2J\n") == "bad \ufffd byte \n".encode()
