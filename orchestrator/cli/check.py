"""`tfcluster check SPEC` and the check before `launch --check` (``job.check`` runs it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.errors import CheckRefused, UsageError
from ..core.terminal import safe_text
from .exitcodes import exit_code_for_check


def _timeout(args: argparse.Namespace, spec: Any) -> float:
    t = args.timeout if args.timeout is not None else spec.check.timeout_s
    if not t > 0:
        raise UsageError(f"--timeout {args.timeout}: must be more than 0 seconds")
    return float(t)


def _run(loaded: Any, scheduler: Any, timeout: float, run_dir: str, verbose: bool) -> tuple[Any, dict[str, Any] | None]:
    from ..job.check import run_check
    from ..runs import check_new_dir

    if check_new_dir(Path(run_dir)):
        raise UsageError(f"--run-dir {run_dir}: already exists and is not empty; choose another")
    print(
        f"tfcluster check: {len(loaded.spec.hosts or []) or 'all'} hosts, at most {timeout:g} s; run directory {run_dir}",
        file=sys.stderr,
    )
    result, outcome = run_check(
        loaded, timeout, run_dir, scheduler, echo_logs=verbose, run_id=os.path.basename(run_dir.rstrip("/"))
    )
    return result, outcome.check


def cmd_check(args: argparse.Namespace) -> int:
    """`tfcluster check SPEC`: compute per host, links per pair, the all-reduce; named slow hosts/links."""
    from ..job.checkjudge import check_text
    from ..schedulers import scheduler_for
    from ..spec import load_spec

    loaded = load_spec(args.spec)
    scheduler = scheduler_for(loaded.spec)
    timeout = _timeout(args, loaded.spec)
    run_dir = args.run_dir or os.path.join("runs", f"check-{loaded.spec.name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    result, check = _run(loaded, scheduler, timeout, run_dir, args.verbose)
    if check is None:
        rc = result.root_cause
        print(
            safe_text(f"tfcluster check: the check did not run: {rc.message if rc else result.state.value}"),
            file=sys.stderr,
        )
        return exit_code_for_check(result.state.value, 0)
    if args.json:
        print(json.dumps(check, indent=2))
    else:
        print(safe_text(check_text(check)))  # hostnames come from the nodes
        print(f"\nwrote {os.path.join(run_dir, 'check.json')} ({check['wall_s']:.1f} s)")
    return exit_code_for_check(result.state.value, len(check["findings"]))


def check_before_launch(args: argparse.Namespace, loaded: Any, scheduler: Any) -> tuple[Any, tuple[Any, ...]]:
    """`launch --check`: run the check in ``RUN-check``; nothing named → the spec as it is; named hosts
    → the spec without them (``check.without_named_hosts``) or CheckRefused (exit 6). Also returns what
    was named, as ``check_finding`` events for the launch's own events.jsonl (by host: the launch's task
    names are not the check's once hosts are left out)."""
    from ..job.check import without_hosts
    from ..job.checkjudge import check_text

    if args.detach:
        raise UsageError("--check with --detach: run `tfcluster check SPEC` first, then launch --detach")
    base = args.run_dir or os.path.join("runs", f"{loaded.spec.name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    run_dir = base.rstrip("/") + "-check"
    result, check = _run(loaded, scheduler, loaded.spec.check.timeout_s, run_dir, False)
    if check is None:
        rc = result.root_cause
        raise CheckRefused(
            f"launch --check: the check did not run ({rc.message if rc else result.state.value}); not starting"
        )
    print(safe_text(check_text(check)), file=sys.stderr)
    if not check["findings"]:
        return loaded, ()
    where = os.path.join(run_dir, "check.json")
    if not loaded.spec.check.without_named_hosts:
        raise CheckRefused(
            f"launch --check: the check named {len(check['findings'])} problem(s) (above; {where}, events in "
            f"{os.path.join(run_dir, 'events.jsonl')}); not starting. Set check.without_named_hosts: true to start "
            "without the named hosts"
        )
    try:
        kept = without_hosts(loaded, check, lambda m: print(m, file=sys.stderr))
    except UsageError as exc:
        raise CheckRefused(str(exc)) from None
    return kept, _finding_events(check)


def _finding_events(check: dict[str, Any]) -> tuple[Any, ...]:
    from ..events.verdicts import CheckFinding

    hosts = {r["task"]: r["host"] for r in check["hosts"]}
    return tuple(
        CheckFinding(
            task=None,
            host=hosts.get(f["task"]),
            code=f["code"],
            subject=f["subject"],
            figure=f["figure"],
            median=f["median"],
            message=f"{f['what']} (launch --check: started without it)",
        )
        for f in check["findings"]
    )
