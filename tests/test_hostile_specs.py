"""Hostile specs: every bad spec exits 2 with FILE:LINE: field: message, no traceback, bounded memory.

Each case runs `tfcluster validate` in a subprocess limited to 300 MB of address space, so an
alias bomb or a deep nesting that blew up memory or the stack would fail here, not pass slowly.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BASE = "version: 1\nname: x\nhosts:\n  - {address: a}\njob:\n  command: [python, t.py]\n"
LIMIT = 300 << 20


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def validate(tmp_path: Path, text: str, *extra: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "s.yaml"
    spec.write_bytes(text.encode("utf-8", "surrogatepass"))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", str(spec), *extra],
        capture_output=True,
        text=True,
        timeout=120,  # a guard against a hang, not a measurement
        cwd=REPO,
        preexec_fn=_limit,
    )


def bomb(levels: int = 9, width: int = 9) -> str:
    out = ["x-anchors:", "  a0: &a0 [" + ",".join(['"lol"'] * width) + "]"]
    out += [f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("job:\n  command: *a8\n", 13),
        ("job:\n  command: [t]\n  env: {A: *a8}\n", 14),
        ("job:\n  command: [t]\n", None),  # anchors alone, never used: still one value too many to build
    ],
)
def test_alias_bombs_are_refused_before_they_expand(tmp_path, where, line):
    text = "version: 1\nname: x\nhosts:\n  - {address: a}\n" + bomb() + where
    r = validate(tmp_path, text)
    assert r.returncode == 2, r.stderr
    assert "expands to more than 200000 values through YAML aliases" in r.stderr
    if line:
        assert f"s.yaml:{line}:" in r.stderr or "s.yaml:" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    r = validate(tmp_path, "version: 1\nname: x\nhosts: &h\n  - {address: a}\n  - *h\njob: {command: [t]}\n")
    assert r.returncode == 2 and "s.yaml:3: spec: a YAML alias refers to a value that contains it" in r.stderr


@pytest.mark.parametrize(
    "text",
    [
        BASE.replace("[python, t.py]", "[" * 5000 + "]" * 5000),
        "version: 1\nname: x\nhosts:\n  - {address: a}\njob:\n  command: [t]\n  env:\n"
        + "".join("  " * (i + 2) + f"k{i}:\n" for i in range(300)),
    ],
    ids=["flow", "block"],
)
def test_deep_nesting_is_refused_at_its_line(tmp_path, text):
    r = validate(tmp_path, text)
    assert r.returncode == 2, r.stderr
    assert "nested more than 64 levels deep" in r.stderr and "s.yaml:" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("name: x", 'name: "x\\0"'), "name"),
        (("address: a", 'address: "a\\0"'), "hosts[0].address"),
        (("address: a", 'address: a, user: "u\\0"'), "hosts[0].user"),
        (("address: a", 'address: a, identity_file: "/k\\x01"'), "hosts[0].identity_file"),
        (("command: [python, t.py]", 'command: [python, t.py]\n  workdir: "/w\\nx"'), "job.workdir"),
        (("command: [python, t.py]", 'command: [python, t.py]\n  python: "py\\x1b[0m"'), "job.python"),
        (("command: [python, t.py]", 'command: [python, t.py]\n  remote_dir: "/r\\0"'), "job.remote_dir"),
        (("command: [python, t.py]", 'command: [python, "t\\0.py"]'), "job.command[1]"),
        (("command: [python, t.py]", 'command: [python, t.py]\n  env: {A: "v\\x07"}'), "job.env.A"),
        (("hosts:", 'checkpoint: {dir: "/c\\r"}\nhosts:'), "checkpoint.dir"),
    ],
)
def test_control_characters_are_refused_in_every_string_field(tmp_path, edit, field):
    r = validate(tmp_path, BASE.replace(*edit, 1))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f": {field}: " in r.stderr and (
        "control characters" in r.stderr or "NUL" in r.stderr or "not a valid" in r.stderr
    )


def test_tabs_and_newlines_are_fine_in_a_command_argument(tmp_path):
    r = validate(tmp_path, BASE.replace("[python, t.py]", '[python, -c, "import sys\\n\\tprint(1)"]'))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("name: x", 'name: "x\\n"'), "is not a valid job name"),
        (
            ("command: [python, t.py]", 'command: [python, t.py]\n  env: {"A\\n": "1"}'),
            "is not a valid environment variable name",
        ),
        (("command: [python, t.py]", "command: [python, t.py]\n  python: -c"), "starts with '-'"),
        (("address: a", "address: 'fe80::1%a;touch${IFS}x'"), "IPv6 scope id"),
        (("address: a", "address: 'fe80::1%$(id)'"), "IPv6 scope id"),
        (("address: a", "address: '-oProxyCommand=x'"), "must not start with '-'"),
    ],
)
def test_values_that_slip_past_a_loose_check_are_refused(tmp_path, edit, message):
    r = validate(tmp_path, BASE.replace(*edit, 1))
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "s.yaml:" in r.stderr


def test_an_interface_scope_id_is_fine(tmp_path):
    r = validate(tmp_path, BASE.replace("address: a", "address: 'fe80::1%eth0'"))
    assert r.returncode == 0, r.stderr


def test_ten_thousand_hosts_validate(tmp_path):
    hosts = "\n".join(f"  - {{address: 10.{i // 65536}.{(i // 256) % 256}.{i % 256}}}" for i in range(10_000))
    r = validate(tmp_path, f"version: 1\nname: x\nhosts:\n{hosts}\njob:\n  command: [python, t.py]\n")
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_huge_file_is_refused_without_reading_it(tmp_path):
    spec = tmp_path / "s.yaml"
    with open(spec, "wb") as f:
        f.write(BASE.encode())
        f.truncate(11_000_000)
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        preexec_fn=_limit,
    )
    assert r.returncode == 2 and "a cluster spec is at most 10 MB" in r.stderr


def test_the_launch_override_and_run_dir_are_checked_too(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(BASE)
    run = [sys.executable, "-m", "orchestrator", "launch", str(spec)]
    r = subprocess.run(
        [*run, "--run-dir", str(tmp_path / "r"), "--", "python", "-c\x01"], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 2 and "launch -- COMMAND: job.command[1]: must not contain control characters" in r.stderr
    r = subprocess.run(
        [*run, "--run-dir", str(tmp_path / "r\x1b[2J"), "--", "true"], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 2 and "--run-dir" in r.stderr and "control characters" in r.stderr
    assert not (tmp_path / "r").exists()
