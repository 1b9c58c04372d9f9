"""Keras progress bars end to end: a real ``fit`` with the default verbosity on real sshd hosts, through
the real launcher. The console shows each task's bar with its prefix on every line (in tmux at 80 and
160 columns: updating in place above the live table, which fits the width); the logs (per task,
combined.log, ``tfcluster logs``) keep the final text of each redraw sequence, never a raw ``\\r`` or
``\\b``, and every line that ended with a newline."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import PY, REPO, WORKLOADS, _env, assert_no_job_processes, launch_argv, run_cli, run_launch
from waiting import wait_for

from orchestrator.core.terminal import safe_text

pytestmark = pytest.mark.e2e

STEPS = 30
KERAS_FIT = [PY, str(WORKLOADS / "keras_bar.py"), "2", str(STEPS)]
FINAL = re.compile(rf"\b{STEPS}/{STEPS}\b.*ms/step - loss: \d")
PREFIX = re.compile(r"^\[worker:[01] (127\.\d+\.\d+\.\d+|both)\] ")
COLLAPSED = "[worker:0-1] "  # a line both printed within the console's window (sinks.collapse)


def _expanded(lines: list[str]) -> list[str]:
    """The console shows a line both tasks printed once, as ``[worker:0-1] …``: one line per task again."""
    out = []
    for ln in lines:
        if ln.startswith(COLLAPSED):
            out += [f"[worker:{i} both] {ln[len(COLLAPSED) :]}" for i in range(2)]
        else:
            out.append(ln)
    return out


def _check_lines(text: str, where: str) -> None:
    """Every task line carries its prefix; no raw redraw; each task's two epochs end in a final bar."""
    assert "\r" not in text and "\b" not in text, where
    lines = _expanded(
        [ln for ln in safe_text(text).splitlines() if ln.strip()]
    )  # Keras's colours aside (the logs keep them)
    task_lines = [ln for ln in lines if f"/{STEPS}" in ln or "Epoch " in ln or "fit done" in ln]
    bad = [ln for ln in task_lines if not PREFIX.match(ln)]
    assert not bad, (where, bad[:3])
    for i in range(2):
        mine = [ln for ln in task_lines if ln.startswith(f"[worker:{i} ")]
        assert sum(1 for ln in mine if FINAL.search(ln)) == 2, (where, mine)
        assert any(ln.endswith("Epoch 2/2") for ln in mine) and mine[-1].endswith("fit done"), (where, mine)
        assert max(map(len, mine)) < 400, where  # a final bar, not an epoch of redraws


def test_a_keras_fit_bar_reaches_the_console_and_every_log_as_its_final_text(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "keras-bar", KERAS_FIT)
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 0, r.stderr[-3000:]
    _check_lines(r.stdout, "console")
    combined = (r.run_dir / "combined.log").read_text()
    _check_lines(re.sub(r"^\S+ ", "", combined, flags=re.M), "combined.log")
    for i in range(2):
        own = r.log(f"worker-{i}")
        assert "\r" not in own and "\b" not in own and len(FINAL.findall(safe_text(own))) == 2
    logs = r.result["gather"]["logs"]  # the node's own copy holds the same lines: nothing lost on the way
    assert all(v.startswith("complete: all") for v in logs.values()), logs
    for args in ((), ("--follow",)):
        shown = run_cli("logs", str(r.run_dir), *args)
        assert shown.returncode == 0, shown.stderr
        _check_lines(shown.stdout, f"logs {args}")
    assert_no_job_processes(tb, 5)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/install installs it)")
def test_in_tmux_at_80_and_160_columns_each_bar_keeps_its_prefix_and_the_table_fits(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "keras-tmux", [*KERAS_FIT[:2], "2", str(STEPS)])
    env = {k: v for k, v in _env().items() if k not in ("NO_COLOR", "TMUX")}
    sock = f"tfc-{os.getpid()}-{tmp_path.name}"[:60]
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    panes: dict[int, Path] = {}
    try:
        for width in (80, 160):
            run_dir, done = tmp_path / f"run{width}", tmp_path / f"rc{width}"
            cmd = f"cd {shlex.quote(str(REPO))} && {shlex.join(launch_argv(tb, spec, run_dir))}; echo $? > {done}.tmp && mv {done}.tmp {done}; sleep 600"
            subprocess.run(
                [*tmux, "new-session", "-d", "-s", f"w{width}", "-x", str(width), "-y", "50", cmd], env=env, check=True
            )
            panes[width] = done

        def capture(width: int, history: bool = False) -> list[str]:
            argv = [*tmux, "capture-pane", "-p", "-J", "-t", f"w{width}", *(["-S", "-"] if history else [])]
            return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout.splitlines()

        # mid-epoch, a task's bar is drawn in place with its prefix (the live region, above the table)
        mid = re.compile(rf"^\[worker:[01] \S+\]\s+\d+/{STEPS} ")
        for width in (80, 160):
            live = wait_for(
                lambda w=width: [ln for ln in capture(w) if mid.match(ln)],
                180,
                f"a bar at {width} columns",
                interval=0.2,
            )
            assert all(len(ln) <= width for ln in live)
        for width, done in panes.items():
            wait_for(done.exists, 240, f"the launch at {width} columns", interval=0.5)
            assert done.read_text().strip() == "0", "\n".join(capture(width, history=True))[-3000:]
            screen = capture(width, history=True)
            _check_lines("\n".join(screen), f"tmux {width}")
            head = next(ln for ln in screen if ln.lstrip().startswith("task "))
            assert len(head) <= width and "state" in head and "step ms" in head
            if width == 160:
                assert "rss MB" in head and "heartbeat" in head
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, env=env)
    assert_no_job_processes(tb, 10)
