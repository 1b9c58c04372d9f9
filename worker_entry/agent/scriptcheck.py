"""Will the job's command start on this host? Checked in the node's facts (``tfcluster preflight``, and
every launch before the go), so a wrong script path is refused before anything runs (exit 4), naming
the host, the path and the field, instead of failing on every host once launched (exit 3).

What is checked, as the command will be started (``child.spawn``: no shell, ``job.workdir`` as its
directory, the task's PATH):

- ``job.command[0]`` is found: on PATH, or as a path (relative to ``job.workdir``), executable;
- for a Python interpreter (``python``, ``python3``, ``python3.11``, a path ending so): the script — its
  first argument that is not an option — exists as a readable file (a relative one from ``job.workdir``);
  for ``-m MODULE`` the module's top-level package is found (nothing of it is imported); ``-c`` and
  ``-`` have nothing to check;
- an interpreter other than worker_entry's own starts (``INTERPRETER -c ''`` within ``START_TIMEOUT_S``;
  with ``-m``, the same run looks the module up). worker_entry's own interpreter is running already.

Nothing here uses a shell: every path and name is an argv element or a file-system call.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import PathFinder

START_TIMEOUT_S = 30.0
_PYTHON = re.compile(r"^python[0-9.]*$")
_VALUE_OPTIONS = {"-W", "-X", "-Q"}  # interpreter options whose value is the next word
_FIND_MODULE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"


def command_problems(argv: Sequence[str], workdir: str | None, env: Mapping[str, str]) -> list[dict[str, str]]:
    """Problems (``{check, message, fix}``) that stop this host's command from starting; [] when none."""
    if not argv:
        return []
    where = os.path.expanduser(workdir) if workdir else os.getcwd()
    if workdir and not os.path.isdir(where):
        return []  # the workdir check says it
    full_env = {**os.environ, **env}
    exe = argv[0]
    found = _resolve(exe, where, full_env)
    if found is None:
        how = f"{exe} does not exist (from job.workdir {where})" if "/" in exe else f"{exe} is not on PATH"
        return [
            _problem(
                "command",
                f"job.command[0]: {how}",
                "install it on every host, or fix job.command (a full path, or a PATH in job.env)",
            )
        ]
    if not _PYTHON.match(os.path.basename(exe)):
        return []
    script, module = _target(argv[1:])
    if script is not None:
        path = os.path.join(where, os.path.expanduser(script))
        if not os.path.isfile(path):
            return [
                _problem(
                    "script",
                    f"job.command: the script {script} is not a file on this host (looked for {path})",
                    "copy it to every host, or fix job.command or job.workdir (a relative script is found "
                    "from job.workdir)",
                )
            ]
        if not os.access(path, os.R_OK):
            return [_problem("script", f"job.command: the script {path} is not readable", "fix its permissions")]
    if _same_interpreter(found):
        if module is not None and not _module_here(module, where, full_env):
            return [_module_problem(module, where)]
        return []
    return _starts(found, module, where, full_env)


def _resolve(exe: str, where: str, env: Mapping[str, str]) -> str | None:
    """The executable ``exe`` names, as ``subprocess`` would find it (PATH of the task's environment)."""
    if "/" in exe:
        path = os.path.join(where, os.path.expanduser(exe))
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(exe, path=env.get("PATH", os.defpath))


def _target(args: Sequence[str]) -> tuple[str | None, str | None]:
    """(script, module) of a Python command line's arguments; (None, None) for ``-c``, ``-`` or none."""
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "-m":
            return None, args[i + 1] if i + 1 < len(args) else None
        if arg.startswith("-m") and len(arg) > 2:
            return None, arg[2:]
        if arg in ("-c", "-") or (arg.startswith("-c") and len(arg) > 2):
            return None, None
        if arg in _VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg, None
    return None, None


def _same_interpreter(path: str) -> bool:
    try:
        return os.path.realpath(path) == os.path.realpath(sys.executable)
    except OSError:
        return False


def _module_here(module: str, where: str, env: Mapping[str, str]) -> bool:
    """Whether this interpreter would find the module's top-level package from ``where`` (``-m`` puts the
    working directory first), with the task's PYTHONPATH; nothing is imported."""
    top = module.split(".", 1)[0]
    if top in sys.builtin_module_names:
        return True
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return PathFinder.find_spec(top, [where, *extra, *sys.path[1:]]) is not None


def _module_problem(module: str, where: str) -> dict[str, str]:
    return _problem(
        "script",
        f"job.command: no module {module.split('.', 1)[0]} for -m {module} (from job.workdir {where})",
        "install it on every host, or fix job.command, job.workdir or PYTHONPATH in job.env",
    )


def _starts(interpreter: str, module: str | None, where: str, env: Mapping[str, str]) -> list[dict[str, str]]:
    """Start the command's interpreter once (looking the module up, when there is one)."""
    argv = [interpreter, "-c", _FIND_MODULE, module.split(".", 1)[0]] if module else [interpreter, "-c", ""]
    try:
        done = subprocess.run(
            argv, cwd=where, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, timeout=START_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return [_problem("interpreter", f"job.command[0]: {interpreter} does not start: {exc}", _FIX_INTERPRETER)]
    if module and done.returncode == 3:
        return [_module_problem(module, where)]
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return [
            _problem("interpreter", f"job.command[0]: {interpreter} does not start: {said[0][:300]}", _FIX_INTERPRETER)
        ]
    return []


_FIX_INTERPRETER = "fix the interpreter on this host, or job.command"


def _problem(check: str, message: str, fix: str) -> dict[str, str]:
    return {"check": check, "message": message, "fix": fix}
