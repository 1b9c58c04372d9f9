"""`tfcluster preflight`: every check on every host, in parallel, one table, each failure with its fix."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from worker_entry import protocol as p

from ...backends import Backend, Connection, entry_failure
from ...core.diagnostics import Diagnostic
from ...core.terminal import safe_text
from ...core.text import table
from ...plan import NodePlan, Plan
from ...supervise import evaluate, failed


@dataclass
class HostReport:
    task: str
    host: str
    ssh: str = "ok"  # ok | the connect failure's code
    facts: p.NodeFacts | None = None
    problem: Diagnostic | None = None  # why there are no facts
    rtt_s: float | None = None
    skew_s: float | None = None


@dataclass
class PreflightReport:
    hosts: list[HostReport]
    findings: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(h.facts is not None for h in self.hosts) and not any(f.blocks for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "hosts": [
                {
                    "task": h.task,
                    "host": h.host,
                    "ssh": h.ssh,
                    "problem": h.problem.to_dict() if h.problem else None,
                    "rtt_s": h.rtt_s,
                    "clock_skew_s": h.skew_s,
                    "facts": h.facts.to_dict() if h.facts else None,
                }
                for h in self.hosts
            ],
            "findings": [f.to_dict() for f in self.findings],
        }

    def text(self) -> str:
        return preflight_text(self)


def probe_config(node: NodePlan) -> dict[str, Any]:
    return {
        "workdir": node.workdir,
        "tf_port": node.tf_port,
        "gpus": node.gpus,
        "env": {**node.env, p.Env.CHECKPOINT_DIR: node.checkpoint_dir},
        "command": list(node.command),  # checked as it will start: script, interpreter (agent.scriptcheck)
    }


def probe(
    conn: Connection, node: NodePlan, timeout: float = 60.0
) -> tuple[p.NodeFacts | None, Diagnostic | None, float, float]:
    """(facts or None, why not, rtt seconds, clock skew seconds)."""
    python = node.argv[0]
    t0 = time.time()
    try:
        code, out, err = conn.run([*node.argv, "probe"], p.command_line(probe_config(node)), timeout=timeout)
    except Exception as exc:
        return None, Diagnostic(f"probe failed: {exc}", code="probe"), 0.0, 0.0
    t1 = time.time()
    if code != 0:
        text = err.decode("utf-8", "replace").strip()
        diag = entry_failure(code, text, python) or Diagnostic(f"probe exited {code}: {text[-300:]}", code="probe")
        return None, diag, t1 - t0, 0.0
    try:
        facts = p.NodeFacts.from_dict(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError, TypeError, AttributeError, RecursionError, p.ProtocolError) as exc:
        return None, Diagnostic(f"probe printed no valid facts ({exc}): {out[-200:]!r}", code="protocol"), t1 - t0, 0.0
    # The node took its timestamp near the end of the probe; compare with the launcher's receive time.
    skew = (facts.time or t1) - t1
    return facts, None, t1 - t0, skew


def run_preflight(spec: Any, plan: Plan, backend: Backend | None = None) -> PreflightReport:
    if backend is None:
        from ...backends.ssh import SshBackend

        backend = SshBackend()
    reports = {str(n.task): HostReport(str(n.task), n.ssh.label if n.ssh else n.host) for n in plan.nodes}
    try:
        for d in backend.connect(plan.nodes):
            r = reports[str(d.task)]
            r.ssh, r.problem = d.code or "ssh", d
        nodes = [n for n in plan.nodes if reports[str(n.task)].problem is None]

        def one(node: NodePlan) -> tuple[NodePlan, Any]:
            conn = backend.connection(str(node.task))
            if conn is None:
                return node, (None, Diagnostic("not connected", code="ssh"), 0.0, 0.0)
            return node, probe(conn, node)

        with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
            for node, (facts, problem, rtt, skew) in pool.map(one, nodes):
                r = reports[str(node.task)]
                r.facts, r.problem, r.rtt_s = facts, problem, round(rtt, 3)
                if facts is not None:
                    r.skew_s = round(skew, 3)
    finally:
        backend.close()
    facts = {t: r.facts for t, r in reports.items() if r.facts is not None}
    hosts = {t: r.host for t, r in reports.items()}
    skews = {t: r.skew_s for t, r in reports.items() if r.skew_s is not None}
    findings = (
        evaluate(facts, hosts, legacy_keras=spec.tensorflow.legacy_keras, gpus=plan.nodes[0].gpus, skews=skews)
        if facts
        else []
    )
    for t, r in reports.items():
        if r.problem is not None:
            d = r.problem
            findings.insert(0, Diagnostic(d.message, d.hint, task=t, host=r.host, code=d.code or "interpreter"))
    return PreflightReport(list(reports.values()), findings)


def _pkg(facts: p.NodeFacts | None, *names: str) -> str:
    if facts is None:
        return "-"
    for n in names:
        if facts.packages.get(n):
            return str(facts.packages[n])
    return "-"


def preflight_text(report: PreflightReport) -> str:
    rows = [("TASK", "HOST", "SSH", "HOSTNAME", "PYTHON", "TF", "TF_KERAS", "GPUS", "CLOCK", "RESULT")]
    bad_tasks = {f.task for f in report.findings if f.blocks}
    for h in report.hosts:
        f = h.facts
        models = (
            sorted({f"{g.name} {g.memory_mb / 1024:.0f} GiB" if g.memory_mb else g.name for g in f.gpus}) if f else []
        )
        rows.append(
            (
                h.task,
                h.host,
                h.ssh,
                f.hostname if f else "-",
                f.python if f else "-",
                _pkg(f, "tensorflow", "tensorflow-cpu", "tensorflow-gpu"),
                _pkg(f, "tf_keras"),
                (f"{len(f.gpus)}" + (f" {'/'.join(models)}" if models else "")) if f else "-",
                f"{h.skew_s:+.2f}s" if h.skew_s is not None else "-",
                "FAIL" if (h.facts is None or h.task in bad_tasks) else "ok",
            )
        )
    # The facts are the node's to choose (hostname, GPU names, versions): nothing of them drives a terminal.
    lines = table([tuple(safe_text(str(c)) for c in row) for row in rows])
    problems = [f for f in report.findings if failed(f)]
    if problems:
        lines.append("")
        for f in problems:
            lines.append(safe_text(f.render()))
    lines.append("")
    lines.append("preflight passed" if report.ok else "preflight FAILED")
    return "\n".join(lines)
