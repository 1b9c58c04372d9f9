"""Will the job's command start on this host (issue 32.9)? ``agent.scriptcheck`` as the node's facts use
it: real files, a real PATH, a real second interpreter; no shell anywhere."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from worker_entry.agent.scriptcheck import command_problems
from worker_entry.agent.sysinfo import node_facts

PY = sys.executable


def _checks(argv, workdir, env=None) -> list[tuple[str, str]]:
    return [(p["check"], p["message"]) for p in command_problems(argv, str(workdir), env or {})]


def test_a_script_that_exists_from_the_workdir_passes_and_a_missing_one_is_named_with_its_path(tmp_path: Path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert _checks([PY, "train.py", "--epochs", "3"], tmp_path) == []
    assert _checks(["python3", "-u", "-W", "ignore", "train.py"], tmp_path) == []
    (problem,) = command_problems([PY, "-u", "trian.py"], str(tmp_path), {})
    assert problem["check"] == "script"
    assert f"looked for {tmp_path / 'trian.py'}" in problem["message"] and "job.command" in problem["message"]
    assert "job.workdir" in problem["fix"]


def test_a_command_not_on_path_or_not_there_is_named(tmp_path: Path):
    assert _checks(["definitely-not-a-command-xyz"], tmp_path) == [
        ("command", "job.command[0]: definitely-not-a-command-xyz is not on PATH")
    ]
    assert _checks(["./run.sh"], tmp_path)[0][0] == "command"
    run = tmp_path / "run.sh"
    run.write_text("#!/bin/sh\n")
    run.chmod(run.stat().st_mode | stat.S_IXUSR)
    assert _checks(["./run.sh"], tmp_path) == [] and _checks(["true"], tmp_path) == []
    assert _checks(["true"], tmp_path, {"PATH": str(tmp_path)})[0][0] == "command"  # the task's PATH counts


def test_c_and_stdin_have_nothing_to_check_and_m_looks_the_module_up_without_importing_it(tmp_path: Path):
    assert _checks([PY, "-c", "import nothing_at_all"], tmp_path) == []
    assert _checks([PY, "-m", "json.tool"], tmp_path) == []
    pkg = tmp_path / "mytrainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported!')\n")
    assert _checks([PY, "-m", "mytrainer.main"], tmp_path) == []  # found from the workdir, never imported
    assert _checks([PY, "-m", "no_such_trainer"], tmp_path)[0][0] == "script"


def test_another_interpreter_must_start(tmp_path: Path):
    fake = tmp_path / "bin" / "python3.99"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'libpython3.99.so: cannot open shared object file' >&2\nexit 127\n")
    fake.chmod(0o755)
    (tmp_path / "train.py").write_text("")
    checks = _checks([str(fake), "train.py"], tmp_path)
    assert checks == [
        ("interpreter", f"job.command[0]: {fake} does not start: libpython3.99.so: cannot open shared object file")
    ]
    good = tmp_path / "bin" / "python3"
    good.symlink_to(os.path.realpath(PY))
    assert _checks(["python3", "train.py"], tmp_path, {"PATH": f"{good.parent}:{os.environ['PATH']}"}) == []


def test_the_node_facts_carry_the_problem_and_a_missing_workdir_is_said_once(tmp_path: Path):
    facts = node_facts({"workdir": str(tmp_path), "command": [PY, "missing.py"], "env": {}})
    assert [p["check"] for p in facts["problems"]] == ["script"]
    facts = node_facts({"workdir": str(tmp_path / "nope"), "command": [PY, "missing.py"], "env": {}})
    assert [p["check"] for p in facts["problems"]] == ["workdir"]
