"""`python -m worker_entry [run|MODE|probe|manifest|send|receive]`: the node side of tfcluster; a MODE is how a
scheduler starts it (``modes/``: connect, slurm, kubernetes, each a module with ``run(argv)``).

The configuration always arrives as one JSON line on stdin (``connect``: on the socket the node
opened back to the supervisor), never on the command line, so no user data ever passes through a
remote login shell. ``kubernetes`` is a pod's main process: its settings are in the pod spec (no shell
either), the training command follows ``--``.
"""

from __future__ import annotations

import json
import os
import sys


def _read_config() -> tuple[dict, bytes]:
    """Read exactly the first line of stdin with raw reads; return the rest for the runner."""
    from ..protocol import MAX_CONFIG_LINE

    buf = b""
    while b"\n" not in buf and len(buf) <= MAX_CONFIG_LINE:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    if not line.strip():
        print("worker_entry: expected a JSON configuration line on stdin", file=sys.stderr)
        raise SystemExit(2)
    try:
        config = json.loads(line)
    except ValueError as exc:
        print(f"worker_entry: bad configuration on stdin: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return config, rest


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else "run"
    if mode in ("--version", "version"):
        from .. import __version__

        print(__version__)
        return 0
    if mode == "run":
        from ..protocol import NodeConfig, ProtocolError
        from .runner import run

        raw, rest = _read_config()
        try:
            config = NodeConfig.from_dict(raw)
        except ProtocolError as exc:
            print(f"worker_entry: bad configuration on stdin: {exc}", file=sys.stderr)
            return 2
        code = run(config, rest)
        # Its task is gone, every frame sent, its files closed: the launcher waits for this process's exit
        # (its confirmation), so skip the interpreter's teardown of psutil, NVML and the rest.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code & 0xFF if code >= 0 else 1)
    if mode == "probe":
        from .sysinfo import node_facts

        config, _ = _read_config()
        json.dump(node_facts(config), sys.stdout)
        sys.stdout.write("\n")
        return 0
    if mode in ("manifest", "send", "receive"):
        from . import files

        config, rest = _read_config()
        return files.main(mode, config, rest)
    started_by = _start_mode(mode)
    if started_by is not None:
        return started_by(argv[1:])
    modes = ", ".join(["run", *sorted(_start_modes()), "probe", "manifest", "send", "receive"])
    print(f"worker_entry: unknown mode {mode!r} ({modes})", file=sys.stderr)
    return 2


def _start_modes() -> list[str]:
    """How a scheduler starts the agent: every module of ``modes`` with a ``run(argv)`` (none named here)."""
    import pkgutil

    from . import modes

    return [m.name for m in pkgutil.iter_modules(modes.__path__) if _start_mode(m.name) is not None]


def _start_mode(name: str):  # -> Callable[[list[str]], int] | None
    """``modes/<name>.py``'s ``run``, if ``name`` is such a mode (connect, slurm, kubernetes, ...)."""
    import importlib
    import pkgutil

    from . import modes

    if not name.isidentifier() or name not in {m.name for m in pkgutil.iter_modules(modes.__path__)}:
        return None
    return getattr(importlib.import_module(f"{modes.__name__}.{name}"), "run", None)
