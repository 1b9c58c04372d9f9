"""`tfcluster`: parse the command line, run the command, turn what it raised into an exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from worker_entry.protocol.env import Env

from ..core.errors import SpecError, TfclusterError
from ..core.terminal import safe_text
from .exitcodes import ERROR_EXIT_CODES, EXIT_INTERNAL, EXIT_OK, EXIT_SIGINT, EXIT_USAGE

#: Set by a command that has closed every file it wrote and joined every thread that writes: the
#: process may then skip the interpreter's teardown (see entry()).
_quick_exit = False


def entry() -> None:
    """The process's entry point (the ``tfcluster`` script, ``python -m orchestrator``).

    After ``launch`` and ``scale`` (which close their run files, sinks and connections themselves)
    the process ends with ``os._exit`` once stdout and stderr are flushed: the interpreter's own
    teardown of ~1000 modules (pydantic, paramiko, cryptography) and the SSH transports' daemon
    threads costs 0.1-0.2 s on every launch (bench/launch_fanout.py) and saves nothing.
    """
    code = main()
    if _quick_exit:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing left to save
                pass
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    # tfcluster uses no pydantic plugins; their discovery scans every installed distribution's entry
    # points at the first model (importlib.metadata): set before pydantic is imported.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # A launcher holds a few descriptors per task: the soft limit (1024 on most systems) up to the hard
    # one, for every command (a job whose hard limit is too low says so: job.Job).
    from ..backends.limits import raise_nofile

    raise_nofile()
    from .parser import build_parser

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    has_tail = "--" in argv
    if has_tail:  # everything after the first '--' is the override command of `launch`
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if has_tail:
        if args.command != "launch":
            parser.error("'-- COMMAND' is only accepted by launch")
        if not tail:
            parser.error("'--' must be followed by a command")
        args.cmd = tail
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = func(args)
        global _quick_exit
        _quick_exit = getattr(args, "quick_exit", False)
        return code
    except SpecError as exc:
        for p in exc.problems:
            print(safe_text(p.render()), file=sys.stderr)
        return EXIT_USAGE
    except TfclusterError as exc:  # a message may quote a node, a run directory or a server
        print(safe_text(f"tfcluster: error: {exc}"), file=sys.stderr)
        return next(code for cls, code in ERROR_EXIT_CODES if isinstance(exc, cls))
    except KeyboardInterrupt:
        print("tfcluster: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except BrokenPipeError:
        # `tfcluster logs RUN | head`: the reader left; that is not an error.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return EXIT_OK
    except Exception as exc:
        if args.debug or os.environ.get(Env.DEBUG):
            raise
        print(
            f"tfcluster: internal error: {type(exc).__name__}: {exc}\n"
            "  this is a bug in tfcluster; rerun with --debug for the traceback and report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    entry()
