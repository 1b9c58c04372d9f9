"""`tfcluster`: parse the command line, run the command, turn what it raised into an exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from worker_entry.protocol.env import Env

from ..core.errors import SpecError, TfclusterError
from .exitcodes import ERROR_EXIT_CODES, EXIT_INTERNAL, EXIT_OK, EXIT_SIGINT, EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    # tfcluster uses no pydantic plugins; their discovery scans every installed distribution's entry
    # points at the first model (importlib.metadata): set before pydantic is imported.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
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
        return func(args)
    except SpecError as exc:
        for p in exc.problems:
            print(p.render(), file=sys.stderr)
        return EXIT_USAGE
    except TfclusterError as exc:
        print(f"tfcluster: error: {exc}", file=sys.stderr)
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
    sys.exit(main())
