"""~/.ssh/config as ssh reads it: Host/Match, Include, first value wins, ProxyJump chains, tokens after
the spec's overrides, and a warning for every option tfcluster does not honour."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.core.errors import UsageError
from orchestrator.plan.render import task_dict
from orchestrator.schedulers.ssh import ssh_plan
from orchestrator.schedulers.ssh.sshconfig import SshConfig, SshConfigError, ssh_config_lookup
from orchestrator.spec import load_spec_text


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def plan(tmp_path, hosts: str, config: str, ssh: str = ""):
    cfg = write(tmp_path / "config", config)
    text = f"version: 1\nname: j\nssh: {{config_file: {cfg}{', ' + ssh if ssh else ''}}}\nhosts:\n{hosts}\njob: {{command: [t]}}\n"
    spec = load_spec_text(text).spec
    return ssh_plan(spec, run_id="r", local_user="me", ssh_lookup=ssh_config_lookup(str(cfg)))


def test_first_value_wins_and_identity_files_accumulate(tmp_path):
    cfg = SshConfig.load(
        write(
            tmp_path / "c",
            """
            Host gpu*  !gpu9
              User first
              IdentityFile ~/.ssh/a
            Host *
              User second
              Port 2200
              IdentityFile ~/.ssh/b
            """,
        )
    )
    one = cfg.lookup("gpu1")
    assert (one["user"], one["port"], one["identityfile"]) == ("first", "2200", ["~/.ssh/a", "~/.ssh/b"])
    nine = cfg.lookup("gpu9")  # negated: only the catch-all applies
    assert (nine["user"], nine["identityfile"]) == ("second", ["~/.ssh/b"])


def test_include_with_globs_relative_to_dot_ssh_and_match(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh" / "conf.d").mkdir(parents=True)
    write(tmp_path / ".ssh" / "conf.d" / "10-lab.conf", "Host lab*\n  HostName %h.lab.example\n  Port 2222\n")
    write(tmp_path / ".ssh" / "conf.d" / "20-match.conf", "Match host lab2 !user nobody\n  User matched\n")
    cfg = SshConfig.load(write(tmp_path / ".ssh" / "config", "Include conf.d/*.conf\nHost *\n  User default\n"))
    assert cfg.lookup("lab1")["hostname"] == "%h.lab.example" and cfg.lookup("lab1")["user"] == "default"
    assert cfg.lookup("lab2")["user"] == "matched"


def test_ignored_options_and_unsupported_match_are_reported(tmp_path):
    p = plan(
        tmp_path,
        "  - {address: a}",
        """
        Match exec "test -e /x"
          User never
        Host a
          ForwardAgent yes
          ControlMaster auto
          LogLevel ERROR
        """,
    )
    assert any("for a, tfcluster ignores: match exec, forwardagent, controlmaster" in w for w in p.warnings)
    assert p.nodes[0].ssh.user == "me"  # the Match exec block was not applied


def test_proxyjump_chain_is_resolved_through_the_config_and_verified_per_hop(tmp_path):
    p = plan(
        tmp_path,
        "  - {address: node1}",
        """
        Host node1
          ProxyJump ops@bastion2:2022
        Host bastion2
          HostName 10.0.0.2
          ProxyJump bastion1
          IdentityFile ~/.ssh/b2
        Host bastion1
          HostName 10.0.0.1
          User jumper
        """,
    )
    jumps = p.nodes[0].ssh.jumps
    assert [(j.hostname, j.port, j.user) for j in jumps] == [("10.0.0.1", 22, "jumper"), ("10.0.0.2", 2022, "ops")]
    assert jumps[1].identity_files == ("~/.ssh/b2",)
    assert p.nodes[0].ssh.proxy_command is None
    assert task_dict(p.nodes[0])["jumps"] == ["jumper@10.0.0.1:22", "ops@10.0.0.2:2022"]  # plan --task


def test_the_first_of_proxycommand_and_proxyjump_wins(tmp_path):
    p = plan(tmp_path, "  - {address: a}", "Host a\n  ProxyCommand nc %h %p\n  ProxyJump b\n")
    assert p.nodes[0].ssh.proxy_command == "nc a 22" and p.nodes[0].ssh.jumps == ()
    p = plan(tmp_path, "  - {address: a}", "Host a\n  ProxyJump b\n  ProxyCommand nc %h %p\n")
    assert p.nodes[0].ssh.proxy_command is None and [j.hostname for j in p.nodes[0].ssh.jumps] == ["b"]


def test_tokens_expand_after_the_spec_overrides(tmp_path):
    p = plan(
        tmp_path,
        "  - {address: a, port: 2201, user: alice}",
        "Host a\n  HostName real-a\n  Port 22\n  User cfg\n  ProxyCommand ssh -W %h:%p -l %r gw %% %n\n",
    )
    assert p.nodes[0].ssh.proxy_command == "ssh -W real-a:2201 -l alice gw % a"


def test_an_unknown_token_or_a_jump_loop_is_a_clear_error(tmp_path):
    with pytest.raises(UsageError, match="token %C is not supported"):
        plan(tmp_path, "  - {address: a}", "Host a\n  ProxyCommand nc %C\n")
    with pytest.raises(UsageError, match="loops"):
        plan(tmp_path, "  - {address: a}", "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")


def test_a_config_including_itself_is_refused(tmp_path):
    cfg = write(tmp_path / "loop", f"Include {tmp_path / 'loop'}\n")
    with pytest.raises(SshConfigError, match="Include nested"):
        SshConfig.load(cfg)
