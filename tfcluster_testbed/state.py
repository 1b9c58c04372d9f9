"""What a test bed owns, on disk, and how to tear it down from that record alone.

Every test bed keeps DIR/state.json up to date while it runs, so a test bed whose owner died
without stopping it (SIGKILL) can still be cleaned up later by :func:`reap_stale`: the teardown
needs nothing but the recorded process identities, the env marker and the namespace names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .base import TestbedError
from .net import _netns_inode, _run
from .procs import _ident, _kill_ordered, _lookup, _Scan, _self_and_ancestors

log = logging.getLogger(__name__)

# Read by this module only (directory naming, teardown, reap_stale): patch them here.
DIR_PREFIX = "tfcluster-testbed-"
STATE_FILE = "state.json"


@dataclass
class _State:
    """What a test bed owns, persisted to DIR/state.json so a later run can clean up after a crash."""

    id: str
    dir: str
    owner: tuple[int, float]
    listeners: list[tuple[int, float]] = field(default_factory=list)
    roots: list[tuple[int, float]] = field(default_factory=list)  # run_on_controller processes
    orphans: list[tuple[int, float]] = field(default_factory=list)  # left behind by kill_sshd
    netns: list[str] = field(default_factory=list)
    controller_netns: str | None = None

    def save(self) -> None:
        """Write state.json atomically (best effort: a full disk must not break the test)."""
        path = Path(self.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(dataclasses.asdict(self)))
            os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> _State:
        d = json.loads(path.read_text())
        for k in ("owner",):
            d[k] = tuple(d[k])
        for k in ("listeners", "roots", "orphans"):
            d[k] = [tuple(x) for x in d[k]]
        return cls(**d)


def _free_id(tb_id: str, base_dir: str | None) -> str:
    """`tb_id`, or a fresh random id when a live test bed already uses it (its namespaces or its
    directory exist): the id scopes the env marker, the namespaces and the directory."""
    search = {Path(base_dir or tempfile.gettempdir()), Path(tempfile.gettempdir())}
    for _ in range(20):
        taken = any(os.path.exists(f"/run/netns/{tb_id}-{s}") for s in ("br", "ctl", "h0")) or any(
            any(d.glob(f"{DIR_PREFIX}{tb_id}-*")) for d in search
        )
        if not taken:
            break
        tb_id = "tb" + secrets.token_hex(3)
    return tb_id


def _create(tb_id: str, base_dir: str | None) -> _State:
    """Make the test bed's directory and its first state.json, owned by this process."""
    d = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{tb_id}-", dir=base_dir)).resolve()
    st = _State(id=tb_id, dir=str(d), owner=_ident(psutil.Process()))
    st.save()
    return st


def _sync(st: _State, listeners: Iterable[psutil.Process], orphans: Mapping[str, Iterable[tuple[int, float]]]) -> None:
    """Merge the live listeners' and the orphans' identities into `st` and save it: stop() and
    reap_stale() can only end what was recorded."""
    known = set(st.listeners)
    for p in listeners:
        with contextlib.suppress(psutil.Error):
            known.add(_ident(p))
    st.listeners = sorted(known)
    st.roots = sorted(set(st.roots))
    st.orphans = sorted({o for v in orphans.values() for o in v} | set(st.orphans))
    st.save()


def _teardown(
    st: _State, *, grace: float = 1.0, popens: Sequence[subprocess.Popen] = ()
) -> tuple[list[tuple[int, float, str]], list[str]]:
    """End every process of a test bed, delete its namespaces and its directory.

    Works from the recorded (pid, create_time) identities, the env marker and namespace membership,
    never from process names. Returns (processes signalled, errors); keeps going after errors.
    """
    errors: list[str] = []
    killed: list[tuple[int, float, str]] = []
    protect = _self_and_ancestors()
    ns_inodes = {ino: n for n in st.netns if (ino := _netns_inode(n)) is not None}
    ctl_names = {st.controller_netns} if st.controller_netns else set()

    def collect(scan: _Scan, controller: bool) -> set[int]:
        pids: set[int] = set()
        recs = st.roots if controller else st.listeners + st.orphans
        for pid, ct in recs:
            p = scan.procs.get(pid)
            if p is not None and abs(p.create_time() - ct) <= 0.01:
                pids.add(pid)
                pids.update(scan.descendants(pid))
        if not controller:
            for pid in scan.marker:
                pids.add(pid)
                pids.update(scan.descendants(pid))
        for pid, ns in scan.netns.items():
            if (ns in ctl_names) == controller:
                pids.add(pid)
                pids.update(scan.descendants(pid))
        return pids - protect

    # Phase 1: the launcher side first, so it cannot react to its hosts dying by reconnecting.
    # Phase 2: everything on the hosts, leaves first, the listening sshds last.
    for controller in (True, False):
        for _ in range(4):  # rescan: a process may have forked or been orphaned meanwhile
            try:
                scan = _Scan(f"{st.id}:", ns_inodes)
                pids = collect(scan, controller)
                if not pids:
                    break
                killed.extend(_kill_ordered(scan, pids, grace, popens))
            except Exception as e:  # keep tearing down whatever happens
                errors.append(f"killing processes: {e!r}")
                break
    for po in popens:
        try:
            po.wait(timeout=5)
        except subprocess.TimeoutExpired:
            errors.append(f"pid {po.pid} did not exit")

    present = [n for n in st.netns if os.path.exists(f"/run/netns/{n}")]
    if present:
        try:
            _run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in present))
        except (TestbedError, OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"deleting namespaces: {e}")
        left = [n for n in present if os.path.exists(f"/run/netns/{n}")]
        if left:
            errors.append(f"namespaces not deleted: {left}")

    d = Path(st.dir)
    if d.name.startswith(DIR_PREFIX) and d.exists():
        try:
            shutil.rmtree(d)
        except OSError as e:
            errors.append(f"removing {d}: {e}")
    return killed, errors


def reap_stale(base_dir: str | Path | None = None) -> list[str]:
    """Clean up test beds whose owning process died without stopping them (e.g. SIGKILL).

    Looks only at ``DIR_PREFIX*`` directories under `base_dir` (default: the temp dir) whose
    state.json names an owner that no longer exists. Returns the directories cleaned.
    """
    base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
    cleaned = []
    for state_file in sorted(base.glob(f"{DIR_PREFIX}*/{STATE_FILE}")):
        try:
            st = _State.load(state_file)
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("ignoring unreadable %s: %s", state_file, e)
            continue
        if _lookup(*st.owner) is not None:
            continue  # owner alive: not ours to clean
        if Path(st.dir).resolve() != state_file.parent.resolve():
            continue
        _, errors = _teardown(st)
        for e in errors:
            log.warning("reap_stale %s: %s", st.dir, e)
        cleaned.append(st.dir)
    return cleaned
