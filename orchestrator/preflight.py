"""`tfcluster preflight`: every check on every host, in parallel, one table, each failure with its fix."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from worker_entry import wire

from .checks import Finding, evaluate
from .connect import close_all, connect_all
from .plan import NodePlan, Plan
from .render import table
from .transport import Connection

SSH_FIXES = {
    "host_key_unknown": "verify the fingerprint, then add the key to known_hosts (ssh-keyscan)",
    "host_key_changed": "verify the new key out of band, then ssh-keygen -R and re-add it",
    "auth": "put the public key in the host's authorized_keys, or fix ssh.user / identity_file",
    "refused": "start sshd on the host or fix the port",
    "timeout": "check the address, firewalls, and that the host is up",
    "dns": "fix the hostname or DNS",
}


@dataclass
class HostReport:
    task: str
    host: str
    ssh: str = "ok"  # ok | failure kind
    ssh_message: str = ""
    facts: dict[str, Any] | None = None
    rtt_s: float | None = None
    skew_s: float | None = None


@dataclass
class PreflightReport:
    hosts: list[HostReport]
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(h.ssh == "ok" and h.facts is not None for h in self.hosts) and not any(
            f.blocks for f in self.findings
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "hosts": [
                {
                    "task": h.task,
                    "host": h.host,
                    "ssh": h.ssh,
                    "ssh_message": h.ssh_message,
                    "rtt_s": h.rtt_s,
                    "clock_skew_s": h.skew_s,
                    "facts": h.facts,
                }
                for h in self.hosts
            ],
            "findings": [f.to_dict() for f in self.findings],
        }


def probe_config(node: NodePlan) -> dict[str, Any]:
    return {
        "workdir": node.workdir,
        "tf_port": node.tf_port,
        "gpus": node.gpus,
        "env": {"TFCLUSTER_CHECKPOINT_DIR": node.checkpoint_dir},
    }


def probe(conn: Connection, node: NodePlan, timeout: float = 60.0) -> tuple[dict[str, Any] | None, str, float, float]:
    """(facts or None, error text, rtt seconds, clock skew seconds)."""
    t0 = time.time()
    try:
        code, out, err = conn.run([*node.argv, "probe"], wire.command_line(probe_config(node)), timeout=timeout)
    except Exception as exc:
        return None, f"probe failed: {exc}", 0.0, 0.0
    t1 = time.time()
    if code != 0:
        text = err.decode("utf-8", "replace").strip()
        if code == 127 or "not found" in text:
            return (
                None,
                f"cannot run {node.argv[0]!r} (exit {code}): set job.python to the interpreter's path",
                t1 - t0,
                0.0,
            )
        if "No module named worker_entry" in text:
            return (
                None,
                f"tfcluster is not installed for {node.argv[0]}: pip install tfcluster on the host",
                t1 - t0,
                0.0,
            )
        return None, f"probe exited {code}: {text[-300:]}", t1 - t0, 0.0
    try:
        facts = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"probe printed no facts: {out[-200:]!r}", t1 - t0, 0.0
    # The node took its timestamp near the end of the probe; compare with the launcher's receive time.
    skew = facts.get("time", t1) - t1
    return facts, "", t1 - t0, skew


def run_preflight(spec: Any, plan: Plan) -> PreflightReport:
    reports = {str(n.task): HostReport(str(n.task), n.ssh.label) for n in plan.nodes}
    conns, failures, _ = connect_all(plan.nodes)
    try:
        for f in failures:
            reports[f.task].ssh = f.failure.kind
            reports[f.task].ssh_message = str(f.failure)
        nodes = [n for n in plan.nodes if str(n.task) in conns]
        with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
            results = list(pool.map(lambda n: (n, *probe(conns[str(n.task)], n)), nodes))
        for node, facts, error, rtt, skew in results:
            r = reports[str(node.task)]
            r.facts, r.rtt_s = facts, round(rtt, 3)
            if facts is None:
                r.ssh_message = error
            else:
                r.skew_s = round(skew, 3)
    finally:
        close_all(conns)
    facts = {t: r.facts for t, r in reports.items() if r.facts is not None}
    hosts = {t: r.host for t, r in reports.items()}
    skews = {t: r.skew_s for t, r in reports.items() if r.skew_s is not None}
    findings = (
        evaluate(facts, hosts, legacy_keras=spec.tensorflow.legacy_keras, gpus=plan.nodes[0].gpus, skews=skews)
        if facts
        else []
    )
    for t, r in reports.items():
        if r.ssh != "ok":
            findings.insert(
                0, Finding("ssh", False, f"[{r.ssh}] {r.ssh_message}", t, r.host, fix=SSH_FIXES.get(r.ssh, ""))
            )
        elif r.facts is None:
            findings.insert(0, Finding("interpreter", False, r.ssh_message, t, r.host))
    return PreflightReport(list(reports.values()), findings)


def _pkg(facts: dict[str, Any], *names: str) -> str:
    pkgs = facts.get("packages", {})
    for n in names:
        if pkgs.get(n):
            return str(pkgs[n])
    return "-"


def preflight_text(report: PreflightReport) -> str:
    rows = [("TASK", "HOST", "SSH", "HOSTNAME", "PYTHON", "TF", "TF_KERAS", "GPUS", "CLOCK", "RESULT")]
    bad_tasks = {f.task for f in report.findings if f.blocks}
    for h in report.hosts:
        f = h.facts or {}
        gpus = f.get("gpus") or []
        models = sorted({g.get("name") for g in gpus})
        rows.append(
            (
                h.task,
                h.host,
                h.ssh,
                str(f.get("hostname", "-")),
                str(f.get("python", "-")),
                _pkg(f, "tensorflow", "tensorflow-cpu", "tensorflow-gpu") if f else "-",
                _pkg(f, "tf_keras") if f else "-",
                f"{len(gpus)}" + (f" {'/'.join(models)}" if models else "") if f else "-",
                f"{h.skew_s:+.2f}s" if h.skew_s is not None else "-",
                "FAIL" if (h.ssh != "ok" or h.facts is None or h.task in bad_tasks) else "ok",
            )
        )
    lines = table(rows)
    problems = [f for f in report.findings if not f.ok]
    if problems:
        lines.append("")
        for f in problems:
            tag = "error" if f.blocks else f.severity
            where = f"{f.task} ({f.host})" if f.task else "all hosts"
            lines.append(f"{tag}: {where}: {f.message}")
            if f.fix:
                lines.append(f"       fix: {f.fix}")
    lines.append("")
    lines.append("preflight passed" if report.ok else "preflight FAILED")
    return "\n".join(lines)
