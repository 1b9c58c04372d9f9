"""Redaction of credentials in what tfcluster prints and stores (plan, plan.json, spec.yaml, launcher.json).

What the nodes receive is never redacted; only copies meant for people and files are. The rules:

- a value under a name that looks like a credential (``DB_PASSWORD``, ``GITHUB_PAT``, ``PRIVATE_SSH``);
- in any text: the password of ``scheme://user:password@host``, a token as a URL's user
  (``https://ghp_x@github.com``), ``NAME=value`` with such a name (``export DB_PASSWORD=x``,
  ``...;Password=x;``), an ``Authorization:``/``Bearer`` value, and tokens of well-known shapes
  (``ghp_…``, ``github_pat_…``, ``glpat-…``, ``xox?-…``, ``hf_…``, ``sk-…``, ``AKIA…``);
- on a command line: the value after a credential-looking flag (``--token X``, ``--api-key=X``,
  ``-p X`` unless X is a short number: a port or a count) — also inside a shell snippet
  (``bash -c '... --token X'``), which is split like the shell would and searched the same way.

Redaction errs on the side of hiding: a value that cannot be located in its text hides the whole text.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASS|PWD|CREDENTIAL|AUTH|DSN|COOKIE|SESSION)", re.IGNORECASE)
#: Whole words of a name that mark a credential, but are too short or common to match inside other
#: words (``PAT`` is in ``PATH``, ``PW`` in nothing useful).
SECRET_WORDS = frozenset(
    {"PAT", "PW", "PRIVATE", "PRIV", "CRED", "CREDS", "SIG", "SIGNATURE", "SALT", "OTP", "BEARER", "WEBHOOK"}
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
_UNQUOTED = r"[^\s'\";&]+"

_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:(?P<v>[^/\s@]+)@")
_URL_USER = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<v>[^/\s:@'\"]+)@")
_TOKEN = re.compile(
    r"\b(?P<v>gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{16,})"
)
_ASSIGN = re.compile(rf"(?P<name>{_NAME})=(?:'(?P<sq>[^']*)'|\"(?P<dq>[^\"]*)\"|(?P<v>{_UNQUOTED}))")
_AUTH_HEADER = re.compile(r"(?i)\b(?:authorization:\s*(?:bearer|basic|token)?|bearer)\s+(?P<v>[^\s'\"]+)")
_FLAG = re.compile(r"^(?P<flag>-{1,2}[A-Za-z][A-Za-z0-9_.-]*)(?P<eq>=(?P<value>.*))?$", re.DOTALL)
_SHORT_SECRET_FLAGS = frozenset({"-p"})  # mysql -p PASSWORD, sshpass -p, ...; `-p 8080` is a port
_SHORT_NUMBER = re.compile(r"\d{1,5}")
_MAX_DEPTH = 3  # bash -c "sh -c '...'" nests; deeper is hidden whole


def is_secret_name(name: str) -> bool:
    if SECRET_NAME_RE.search(name):
        return True
    return any(w.upper() in SECRET_WORDS for w in _WORD_SPLIT.split(name) if w)


def _looks_like_token(text: str) -> bool:
    return bool(_TOKEN.fullmatch(text)) or (len(text) >= 20 and re.fullmatch(r"[A-Za-z0-9_.~+/=-]+", text) is not None)


def _regex_spans(text: str) -> list[tuple[int, int]]:
    """Where the text rules (URLs, tokens, assignments, headers) find a secret in ``text``."""
    spans = [m.span("v") for m in _URL_PASSWORD.finditer(text)]
    for m in _URL_USER.finditer(text):
        user = m.group("v")
        if m.group("scheme").lower() in ("http", "https", "git+https") or _looks_like_token(user):
            spans.append(m.span("v"))
    spans += [m.span("v") for m in _TOKEN.finditer(text)]
    spans += [m.span("v") for m in _AUTH_HEADER.finditer(text)]
    for m in _ASSIGN.finditer(text):
        if is_secret_name(m.group("name")):
            group = next(g for g in ("sq", "dq", "v") if m.group(g) is not None)
            if m.end(group) > m.start(group):
                spans.append(m.span(group))
    return spans


def _flag_values(args: Sequence[str], depth: int) -> tuple[list[str], bool]:
    """The values credential flags take in ``args`` (a command line, or a shell snippet split like the
    shell splits it), searched into nested snippets; and whether a snippet was too deep to search."""
    values = [args[i] for i in _hidden_args(args)]
    too_deep = False
    for arg in args:
        m = _FLAG.match(arg)
        if m and m.group("eq") is not None and is_secret_name(m.group("flag")):
            values.append(m.group("value"))
        elif any(c.isspace() for c in arg):
            if depth >= _MAX_DEPTH:
                too_deep = True
                continue
            inner, deep = _flag_values(_split(arg), depth + 1)
            values += inner
            too_deep = too_deep or deep
    return [v for v in values if v], too_deep


def _split(snippet: str) -> list[str]:
    try:
        return shlex.split(snippet, comments=False, posix=True)
    except ValueError:  # unbalanced quotes: words are still words
        return snippet.split()


def _literal_spans(text: str, value: str) -> list[tuple[int, int]]:
    """Every occurrence of ``value`` in ``text`` that stands as a word of its own (not inside another)."""
    pattern = re.compile(r"(?<![^\s'\"=])" + re.escape(value) + r"(?![^\s'\";&|)])")
    return [m.span() for m in pattern.finditer(text)]


def _secret_spans(text: str) -> list[tuple[int, int]] | None:
    """Every secret in one string (None: one was found but cannot be located: hide it all)."""
    spans = _regex_spans(text)
    if any(c.isspace() for c in text):
        values, too_deep = _flag_values(_split(text), 1)
        if too_deep:
            return None
        for v in values:
            found = _literal_spans(text, v)
            if not found:
                return None
            spans += found
    return spans


def redact_text(text: str) -> str:
    """``text`` with every secret the text rules find replaced by ``<redacted>``."""
    spans = _secret_spans(text)
    if spans is None:
        return REDACTED
    out, pos = [], 0
    for start, end in sorted(spans):
        if end <= pos:
            continue
        start = max(start, pos)
        out += [text[pos:start], REDACTED]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_urls(text: str) -> str:
    """Kept for callers of the old name: every text rule, not only URLs."""
    return redact_text(text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Hide values whose names look like credentials, and secrets inside the others."""
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(v)) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of credential flags (``--token X``, ``--password=X``, ``-p X``)
    and every secret inside its words (URLs, tokens, shell snippets) hidden."""
    hidden = _hidden_args(argv)
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i in hidden:
            out.append(REDACTED)
            continue
        m = _FLAG.match(arg)
        if m and m.group("eq") is not None and is_secret_name(m.group("flag")):
            out.append(f"{m.group('flag')}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return out


def _hidden_args(argv: Sequence[str]) -> set[int]:
    """Indexes of the words that are a credential flag's value."""
    hidden: set[int] = set()
    for i, arg in enumerate(argv[:-1]):
        m = _FLAG.match(arg)
        if not m or m.group("eq") is not None or (i - 1) in hidden:
            continue
        if arg in _SHORT_SECRET_FLAGS:
            if not _SHORT_NUMBER.fullmatch(argv[i + 1]):
                hidden.add(i + 1)
        elif is_secret_name(m.group("flag")):
            hidden.add(i + 1)
    return hidden


def secret_values(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """The literal values that ``redact_env``/``redact_argv`` hide (to redact a copy of the text)."""
    values = [v for k, v in env.items() if is_secret_name(k) and v]
    values += [argv[i] for i in _hidden_args(argv)]
    for arg in argv:
        m = _FLAG.match(arg)
        if m and m.group("eq") is not None and is_secret_name(m.group("flag")):
            values.append(m.group("value"))
    for text in [*env.values(), *argv]:
        spans = _secret_spans(text)
        if spans is None:
            values.append(text)
        else:
            values += [text[s:e] for s, e in spans]
    return sorted({v for v in values if v}, key=len, reverse=True)
