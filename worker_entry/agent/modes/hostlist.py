"""Slurm's compact lists, expanded: host lists (``n[1-3,5]``) and task counts (``2(x3),1``).

Written by hand, not with python-hostlist or ClusterShell: this runs on the nodes, where worker_entry
needs nothing but the standard library, and the grammar is small. ``scontrol show hostnames`` is
preferred when it exists (``worker_entry.agent.modes.slurm``); this is the fallback for containers without it,
and the two agree on everything Slurm itself produces (tests compare them). Every input is bounded:
garbage raises ``ValueError`` with what is wrong, never a crash or an unbounded expansion.
"""

from __future__ import annotations

import itertools
import re

MAX_HOSTS = 65536  # more nodes than any Slurm cluster has
MAX_TEXT = 1 << 20
_NUM = re.compile(r"^\d{1,9}$")
_TASKS_ITEM = re.compile(r"^(\d{1,6})(?:\(x(\d{1,6})\))?$")
_NAME_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: ``a[1,2],b`` → ``['a[1,2]', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"']' without '[' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unclosed '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _range(spec: str, whole: str) -> list[str]:
    """``1,3-5`` or ``01-03``: the numbers as text, zero-padded like the lower bound."""
    out: list[str] = []
    for item in spec.split(","):
        lo, sep, hi = item.partition("-")
        if not _NUM.match(lo) or (sep and not _NUM.match(hi)):
            raise ValueError(f"bad range {item!r} in host list {whole!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"range {item!r} goes down in host list {whole!r}")
        if b - a + 1 + len(out) > MAX_HOSTS:
            raise ValueError(f"host list {whole!r} expands to more than {MAX_HOSTS} hosts")
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def _expand_one(expr: str, whole: str) -> list[str]:
    """One host expression: text and bracketed ranges, any number of each (a cartesian product)."""
    pieces: list[list[str]] = []
    rest = expr
    while rest:
        i = rest.find("[")
        if i < 0:
            pieces.append([rest])
            break
        j = rest.find("]", i)
        if i:
            pieces.append([rest[:i]])
        pieces.append(_range(rest[i + 1 : j], whole))
        rest = rest[j + 1 :]
    for piece in pieces:
        if len(piece) == 1 and not _NAME_CHARS.match(piece[0]):
            raise ValueError(f"bad character in host name {piece[0]!r} of host list {whole!r}")
    total = 1
    for piece in pieces:
        total *= len(piece)
        if total > MAX_HOSTS:
            raise ValueError(f"host list {whole!r} expands to more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand_hostlist(text: str) -> list[str]:
    """``n[1-3,5]`` → n1 n2 n3 n5; ``n[01-03]`` keeps the padding; ``a-b[1,3-4]-c`` → a-b1-c a-b3-c
    a-b4-c; ``r[1-2]-n[1-2]`` → r1-n1 r1-n2 r2-n1 r2-n2; ``x,y[1-2]`` → x y1 y2. Order is kept."""
    text = text.strip()
    if not text or len(text) > MAX_TEXT:
        raise ValueError("empty host list" if not text else "host list too long")
    hosts: list[str] = []
    for expr in split_top_level(text):
        if not expr:
            raise ValueError(f"empty entry in host list {text!r}")
        hosts.extend(_expand_one(expr, text))
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"host list {text!r} expands to more than {MAX_HOSTS} hosts")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """``2(x3),1`` → [2, 2, 2, 1] (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE)."""
    text = text.strip()
    if not text or len(text) > MAX_TEXT:
        raise ValueError("empty tasks-per-node list" if not text else "tasks-per-node list too long")
    out: list[int] = []
    for item in text.split(","):
        m = _TASKS_ITEM.match(item.strip())
        if m is None:
            raise ValueError(f"bad item {item!r} in tasks-per-node list {text!r} (expected N or N(xM))")
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if repeat < 1 or len(out) + repeat > MAX_HOSTS:
            raise ValueError(f"bad repeat in tasks-per-node list {text!r}")
        out.extend([count] * repeat)
    return out
