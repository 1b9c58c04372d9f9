"""Pure preflight rules: node facts (from worker_entry) → findings, each with the fix.

Used by `tfcluster preflight` (all rules, one table) and by `launch` before it says go.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from . import __version__

CLOCK_SKEW_WARN_S = 1.0
LOW_DISK_BYTES = 1 << 30


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    message: str
    task: str | None = None
    host: str | None = None
    severity: str = "error"  # error | warning | info
    fix: str = ""

    @property
    def blocks(self) -> bool:
        return not self.ok and self.severity == "error"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tf_version(pkgs: dict[str, str | None]) -> str | None:
    return pkgs.get("tensorflow") or pkgs.get("tensorflow-cpu") or pkgs.get("tensorflow-gpu")


def evaluate(
    facts: dict[str, dict[str, Any]],
    hosts: dict[str, str],
    *,
    legacy_keras: bool,
    gpus: int,
    skews: dict[str, float] | None = None,
) -> list[Finding]:
    """Rules across hosts. `facts` and `hosts` are keyed by task ('worker:0'); skews in seconds."""
    out: list[Finding] = []
    for task, f in facts.items():
        for severity, key in (("error", "problems"), ("warning", "warnings")):
            for p in f.get(key, []):
                p = p if isinstance(p, dict) else {"message": str(p)}
                out.append(
                    Finding(
                        p.get("check", "node"), False, p["message"], task, hosts.get(task), severity, p.get("fix", "")
                    )
                )

    def same(check: str, value_of: Any, what: str, fix: str, severity: str = "error") -> None:
        values = {t: value_of(f) for t, f in facts.items()}
        counts = Counter(values.values())
        if len(counts) <= 1:
            value = next(iter(counts), None)
            out.append(
                Finding(
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
                    Finding(
                        check,
                        False,
                        f"{what} is {v or 'not installed'} here but {majority or 'not installed'} on the other hosts",
                        t,
                        hosts.get(t),
                        severity=severity,
                        fix=fix,
                    )
                )

    pkgs = {t: f.get("packages", {}) for t, f in facts.items()}
    same(
        "python",
        lambda f: ".".join(str(f.get("python", "")).split(".")[:2]),
        "Python version",
        "use the same Python everywhere (job.python)",
        severity="warning",
    )
    same(
        "tensorflow",
        lambda f: _tf_version(f.get("packages", {})),
        "TensorFlow",
        "install the same TensorFlow version on every host",
    )
    same(
        "tf_keras", lambda f: f.get("packages", {}).get("tf_keras"), "tf_keras", "install the same tf_keras everywhere"
    )
    same(
        "tfcluster",
        lambda f: f.get("packages", {}).get("tfcluster"),
        "tfcluster",
        "install the same tfcluster everywhere",
        "warning",
    )

    for t, p in pkgs.items():
        if p.get("tfcluster") and p.get("tfcluster") != __version__:
            out.append(
                Finding(
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
            Finding(
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
                Finding(
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
                Finding(
                    "keras",
                    False,
                    f"Keras {keras} with tensorflow.legacy_keras: false: Keras 3 breaks multi-worker model.fit "
                    "under MWMS (keras-team/keras#20585)",
                    t,
                    hosts.get(t),
                    fix="set tensorflow.legacy_keras: true and install tf_keras",
                )
            )

    models = {t: tuple(sorted({g.get("name") for g in f.get("gpus", [])})) for t, f in facts.items()}
    distinct = {m for m in models.values() if m}
    if len(distinct) > 1:
        desc = "; ".join(f"{t}: {', '.join(m) or 'none'}" for t, m in models.items())
        out.append(
            Finding(
                "gpus",
                False,
                f"mixed GPU models ({desc}): every step waits for the slowest GPU",
                severity="warning",
                fix="use identical GPUs per job, or expect the slowest model's speed",
            )
        )
    if gpus:
        counts = {t: len(f.get("gpus", [])) for t, f in facts.items()}
        out.append(Finding("gpus", True, f"GPUs visible per host: {counts}", severity="info"))

    for t, skew in (skews or {}).items():
        if abs(skew) > CLOCK_SKEW_WARN_S:
            out.append(
                Finding(
                    "clock",
                    False,
                    f"clock is {skew:+.1f}s off the launcher's: timestamps across hosts will not line up",
                    t,
                    hosts.get(t),
                    severity="warning",
                    fix="run NTP/chrony on every host",
                )
            )
    for t, f in facts.items():
        disk = f.get("disk")
        if disk and disk.get("free_bytes", LOW_DISK_BYTES) < LOW_DISK_BYTES:
            out.append(
                Finding(
                    "disk",
                    False,
                    f"only {disk['free_bytes'] / 1e9:.2f} GB free at {disk['path']} (checkpoint dir)",
                    t,
                    hosts.get(t),
                    severity="warning",
                    fix="free disk space or move checkpoint.dir",
                )
            )
    return out
