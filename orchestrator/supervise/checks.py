"""Pure preflight rules: node facts (from worker_entry's hello or probe) → diagnostics, each with its fix.

Used by `tfcluster preflight` (all rules, one table) and by `launch` before it says go.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from worker_entry.protocol import NodeFacts

from .. import __version__
from ..core.diagnostics import Diagnostic, Severity

CLOCK_SKEW_WARN_S = 1.0
LOW_DISK_BYTES = 1 << 30


def finding(
    check: str,
    ok: bool,
    message: str,
    task: str | None = None,
    host: str | None = None,
    severity: Severity = "error",
    fix: str = "",
) -> Diagnostic:
    """A check's outcome: passed checks are ``info``, failed ones keep their severity."""
    return Diagnostic(message, fix, task=task, host=host, code=check, severity="info" if ok else severity)


def failed(d: Diagnostic) -> bool:
    return d.severity != "info"


def _tf_version(pkgs: dict[str, str | None]) -> str | None:
    return pkgs.get("tensorflow") or pkgs.get("tensorflow-cpu") or pkgs.get("tensorflow-gpu")


def evaluate(
    facts: dict[str, NodeFacts],
    hosts: dict[str, str],
    *,
    legacy_keras: bool,
    gpus: int,
    skews: dict[str, float] | None = None,
) -> list[Diagnostic]:
    """Rules across hosts. `facts` and `hosts` are keyed by task ('worker:0'); skews in seconds."""
    out: list[Diagnostic] = []
    for task, f in facts.items():
        for severity, problems in (("error", f.problems), ("warning", f.warnings)):
            for p in problems:
                out.append(finding(p.check, False, p.message, task, hosts.get(task), severity, p.fix))

    def same(check: str, value_of: Any, what: str, fix: str, severity: Severity = "error") -> None:
        values = {t: value_of(f) for t, f in facts.items()}
        counts = Counter(values.values())
        if len(counts) <= 1:
            value = next(iter(counts), None)
            out.append(
                finding(
                    check,
                    True,
                    f"{what}: {value if value is not None else 'not installed'} everywhere",
                    severity="info",
                )
            )
            return
        majority = counts.most_common(1)[0][0]
        for t, v in values.items():
            if v != majority:
                out.append(
                    finding(
                        check,
                        False,
                        f"{what} is {v or 'not installed'} here but {majority or 'not installed'} on the other hosts",
                        t,
                        hosts.get(t),
                        severity=severity,
                        fix=fix,
                    )
                )

    pkgs = {t: f.packages for t, f in facts.items()}
    same(
        "python",
        lambda f: ".".join(f.python.split(".")[:2]),
        "Python version",
        "use the same Python everywhere (job.python)",
        severity="warning",
    )
    same(
        "tensorflow",
        lambda f: _tf_version(f.packages),
        "TensorFlow",
        "install the same TensorFlow version on every host",
    )
    same("tf_keras", lambda f: f.packages.get("tf_keras"), "tf_keras", "install the same tf_keras everywhere")
    same(
        "tfcluster",
        lambda f: f.packages.get("tfcluster"),
        "tfcluster",
        "install the same tfcluster everywhere",
        "warning",
    )

    for t, p in pkgs.items():
        if p.get("tfcluster") and p.get("tfcluster") != __version__:
            out.append(
                finding(
                    "tfcluster",
                    False,
                    f"tfcluster {p.get('tfcluster')} on this host, {__version__} on the launcher",
                    t,
                    hosts.get(t),
                    severity="warning",
                    fix="install the launcher's tfcluster version on the hosts",
                )
            )

    with_tf = [t for t, p in pkgs.items() if _tf_version(p)]
    if not with_tf:
        out.append(
            finding(
                "tensorflow",
                False,
                "no TensorFlow for job.python on any host (fine if the command runs another interpreter)",
                severity="warning",
                fix="pip install 'tfcluster[tf]' on the hosts, or point job.python at the training venv",
            )
        )
    for t in with_tf:
        p = pkgs[t]
        keras = p.get("keras") or ""
        if legacy_keras and not p.get("tf_keras"):
            out.append(
                finding(
                    "keras",
                    False,
                    "TF_USE_LEGACY_KERAS=1 (tensorflow.legacy_keras) but tf_keras is not installed: tf.keras "
                    "would fail to import",
                    t,
                    hosts.get(t),
                    fix=f"pip install --no-deps tf_keras=={_tf_version(p)} (matching TensorFlow)",
                )
            )
        elif not legacy_keras and keras.split(".")[0].isdigit() and int(keras.split(".")[0]) >= 3 and len(facts) > 1:
            out.append(
                finding(
                    "keras",
                    False,
                    f"Keras {keras} with tensorflow.legacy_keras: false: Keras 3 breaks multi-worker model.fit "
                    "under MWMS (keras-team/keras#20585)",
                    t,
                    hosts.get(t),
                    fix="set tensorflow.legacy_keras: true and install tf_keras",
                )
            )

    models = {t: tuple(sorted({f"{g.name} ({g.memory_mb / 1024:.0f} GiB)" for g in f.gpus})) for t, f in facts.items()}
    distinct = {m for m in models.values() if m}
    if len(distinct) > 1:
        desc = "; ".join(f"{t}: {', '.join(m) or 'none'}" for t, m in models.items())
        out.append(
            finding(
                "gpus",
                False,
                f"mixed GPU models ({desc}): every step waits for the slowest GPU",
                severity="warning",
                fix="use identical GPUs per job, or expect the slowest model's speed",
            )
        )
    if gpus or distinct:
        per = {t: f"{len(f.gpus)}x {', '.join(models[t]) or 'none'}" for t, f in facts.items()}
        out.append(finding("gpus", True, f"GPUs per host: {per}", severity="info"))

    for t, skew in (skews or {}).items():
        if abs(skew) > CLOCK_SKEW_WARN_S:
            out.append(
                finding(
                    "clock",
                    False,
                    f"clock is {skew:+.1f}s off the launcher's: its records are put on the launcher's clock "
                    "(shifted by the skew measured at its hello), its own log's times are not",
                    t,
                    hosts.get(t),
                    severity="warning",
                    fix="run NTP/chrony on every host",
                )
            )
    for t, f in facts.items():
        disk = f.disk
        if disk is not None and disk.free_bytes < LOW_DISK_BYTES:
            out.append(
                finding(
                    "disk",
                    False,
                    f"only {disk.free_bytes / 1e9:.2f} GB free at {disk.path} (checkpoint dir)",
                    t,
                    hosts.get(t),
                    severity="warning",
                    fix="free disk space or move checkpoint.dir",
                )
            )
    return out
