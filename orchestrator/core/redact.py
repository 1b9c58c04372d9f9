"""Redaction of credentials in what tfcluster prints and stores (plan, plan.json, spec.yaml, launcher.json).

What the nodes receive is never redacted; only copies meant for people and files are. The rules:

- a value under a name that looks like a credential (``DB_PASSWORD``, ``GITHUB_PAT``, ``PRIVATE_SSH``);
- in any text: the password of ``scheme://user:password@host``, a token as a URL's user
  (``https://ghp_x@github.com``), ``NAME=value`` with such a name (``export DB_PASSWORD=x``,
  ``...;Password=x;``), an ``Authorization:``/``Bearer`` value, and tokens of well-known shapes
  (``ghp_…``, ``github_pat_…``, ``glpat-…``, ``xox?-…``, ``hf_…``, ``sk-…``, ``AKIA…``);
- in any text, too: JWTs, Slack and Discord webhook URLs, a header with such a name (``X-Api-Key: …``),
  a JSON ``"password": …``, ``.netrc`` text (``machine H login U password P``), a private key block
  (``-----BEGIN … PRIVATE KEY-----``) under whatever name;
- on a command line: the value after a credential-looking flag (``--token X``, ``--api-key=X``,
  ``-p X`` unless X is a short number: a port or a count), the password of ``curl -u USER:PW``,
  ``mysql -pPW``, what ``echo``/``printf`` pipes into a registry login (``--password-stdin``) — also
  inside a shell snippet (``bash -c '... --token X'``), which is split like the shell would and
  searched the same way.

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
    r"|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{16,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"  # a JWT: header.payload.signature
)
#: A webhook URL is its own credential: whoever has it may post.
_WEBHOOK = re.compile(
    r"(?i)(?:hooks\.slack\.com/(?:services|workflows|triggers)|discord(?:app)?\.com/api/webhooks)/(?P<v>[^\s'\"]+)"
)
#: ``Name: value`` with a credential's name: an HTTP header (``X-Api-Key: …``, ``-H "Private-Token:…"``).
_HEADER = re.compile(r"(?P<name>\b[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*):(?P<sp>[ \t]*)(?P<v>[^\s'\"]+)")
#: ``"name": value`` in JSON (or a Python dict), with a credential's name.
_JSON_PAIR = re.compile(
    r"[\"'](?P<name>[^\"']{1,100})[\"']\s*:\s*(?:\"(?P<dq>[^\"\\]*)\"|'(?P<sq>[^'\\]*)'|(?P<v>[^\s,}\]]+))"
)
#: .netrc text: ``machine HOST login USER password PW`` (``account`` too); only in text that looks like one.
_NETRC = re.compile(r"(?i)\b(?:machine\s+\S+|default)\s+(?:login|password|account)\b")
_NETRC_VALUE = re.compile(r"(?i)\b(?:password|passwd|account)\s+(?P<v>[^\s'\"]+)")
#: A private key, whatever the variable holding it is called.
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?P<v>.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|$)",
    re.DOTALL,
)
#: Commands whose ``-pPASSWORD`` (attached) is the password.
_ATTACHED_P = frozenset({"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mariadb", "mariadb-dump", "sshpass"})
#: Flags whose value is ``USER:PASSWORD`` (curl -u, --user, --proxy-user): the part after the colon.
_USER_FLAGS = frozenset({"-u", "--user", "-U", "--proxy-user"})
#: Commands that read a password piped into them (``echo PW | docker login --password-stdin``).
_LOGINS = frozenset({"docker", "podman", "helm", "nerdctl", "buildah", "skopeo", "oras", "crane", "regctl"})
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
    spans += [m.span("v") for m in _WEBHOOK.finditer(text)]
    spans += [(m.start("v"), m.end()) for m in _PRIVATE_KEY.finditer(text)]
    for m in _HEADER.finditer(text):  # a header with a credential's name: spaced, or a hyphenated name
        if is_secret_name(m.group("name")) and (m.group("sp") or "-" in m.group("name")):
            spans.append(m.span("v"))
    if _NETRC.search(text):
        spans += [m.span("v") for m in _NETRC_VALUE.finditer(text)]
    for pattern in (_ASSIGN, _JSON_PAIR):
        for m in pattern.finditer(text):
            if is_secret_name(m.group("name")):
                group = next(g for g in ("sq", "dq", "v") if m.group(g) is not None)
                if m.end(group) > m.start(group):
                    spans.append(m.span(group))
    return spans


def _flag_values(args: Sequence[str], depth: int) -> tuple[list[str], bool]:
    """The values credential flags take in ``args`` (a command line, or a shell snippet split like the
    shell splits it), searched into nested snippets; and whether a snippet was too deep to search."""
    values = [args[i] for i in _hidden_args(args)]
    values += [v for _, v in _partial_values(args)] + _piped_passwords(args)
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
    """A shell snippet's words as the shell splits them; ``|``, ``;``, ``&&`` are words of their own."""
    try:
        lexer = shlex.shlex(snippet, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        return list(lexer)
    except ValueError:  # unbalanced quotes: words are still words
        return snippet.split()


def _literal_spans(text: str, value: str) -> list[tuple[int, int]]:
    """Every occurrence of ``value`` in ``text`` that stands as a word of its own (not inside another),
    or as the attached part of ``-pVALUE`` or ``USER:VALUE``."""
    pattern = re.compile(r"(?:(?<![^\s'\"=])|(?<=-p)|(?<=:))" + re.escape(value) + r"(?![^\s'\";&|)])")
    return [m.span() for m in pattern.finditer(text)]


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _partial_values(argv: Sequence[str]) -> list[tuple[int, str]]:
    """(index, the secret part) of words that carry a credential inside them: ``mysql -pPW`` (the part
    after ``-p``), ``curl -u USER:PW`` and ``--user=USER:PW`` (after the colon)."""
    out = []
    attached = any(_base(w) in _ATTACHED_P for w in argv)
    for i, arg in enumerate(argv):
        if attached and arg.startswith("-p") and len(arg) > 2 and not arg.startswith("--"):
            out.append((i, arg[2:]))
        m = _FLAG.match(arg)
        if m and m.group("flag") in _USER_FLAGS:
            value = m.group("value") if m.group("eq") is not None else (argv[i + 1] if i + 1 < len(argv) else "")
            at = i if m.group("eq") is not None else i + 1
            if ":" in value and value.partition(":")[2]:
                out.append((at, value.partition(":")[2]))
    return out


def _piped_passwords(words: Sequence[str]) -> list[str]:
    """What ``echo``/``printf`` pipes into a login that reads its password from stdin."""
    out: list[str] = []
    for i, w in enumerate(words):
        if w != "|" or i == 0:
            continue
        start = max((j + 1 for j in range(i) if words[j] in ("|", ";", "&&", "||", "&")), default=0)
        left = list(words[start:i])
        end = next((j for j in range(i + 1, len(words)) if words[j] in ("|", ";", "&&", "||", "&")), len(words))
        right = list(words[i + 1 : end])
        if not left or _base(left[0]) not in ("echo", "printf") or not right:
            continue
        if "--password-stdin" in right or (_base(right[0]) in _LOGINS and "login" in right):
            out += [x for x in left[1:] if not x.startswith("-") and "%" not in x]
    return out


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
    partial = dict(_partial_values(argv))
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i in hidden:
            out.append(REDACTED)
            continue
        if i in partial:
            out.append(arg[: len(arg) - len(partial[i])] + REDACTED)
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
    attached = any(_base(w) in _ATTACHED_P for w in argv)
    for i, arg in enumerate(argv[:-1]):
        m = _FLAG.match(arg)
        if not m or m.group("eq") is not None or (i - 1) in hidden:
            continue
        if (
            m.group("flag").endswith("-stdin")
            or m.group("flag") in _USER_FLAGS
            or (attached and arg[:2] == "-p" and len(arg) > 2)
        ):
            continue  # --password-stdin takes no value; USER:PW and -pPW are partly secret (_partial_values)
        if arg in _SHORT_SECRET_FLAGS:
            if not _SHORT_NUMBER.fullmatch(argv[i + 1]):
                hidden.add(i + 1)
        elif is_secret_name(m.group("flag")):
            hidden.add(i + 1)
    return hidden


def secret_values(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """The literal values that ``redact_env``/``redact_argv`` hide (to redact a copy of the text)."""
    values = [v for k, v in env.items() if is_secret_name(k) and v]
    values += [argv[i] for i in _hidden_args(argv)] + [v for _, v in _partial_values(argv)]
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
