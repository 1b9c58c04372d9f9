"""MultiWorkerMirroredStrategy configured from the tfcluster environment (TensorFlow imported lazily).

The launcher decides the collective implementation, the collective timeout and the coordination
heartbeat per task and passes them as ``TFCLUSTER_*`` variables. ``make_strategy()`` applies them; the
instrumentation (instrument.py) applies the same to a plain ``tf.distribute.MultiWorkerMirroredStrategy()``
so unmodified scripts get them too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..protocol.env import Env
from .progress import emit, warn_once

ENV_COMMUNICATION = Env.COMMUNICATION
ENV_COLLECTIVE_TIMEOUT = Env.COLLECTIVE_TIMEOUT_S
ENV_HEARTBEAT_TIMEOUT = Env.HEARTBEAT_TIMEOUT_S

_IMPLEMENTATIONS = {"nccl": "NCCL", "ring": "RING", "auto": "AUTO", "": "AUTO"}
# MWMS's own choice of coordinated jobs (collective_all_reduce_strategy._initialize_multi_worker).
_COORDINATED_JOBS = ("chief", "worker")


def _float_env(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    value = float(raw)
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be > 0")
    return value


def communication_implementation(env: Mapping[str, str] = os.environ) -> str:
    """``NCCL``, ``RING`` or ``AUTO`` from ``TFCLUSTER_COMMUNICATION`` (unset → AUTO)."""
    raw = env.get(ENV_COMMUNICATION, "").strip().lower()
    try:
        return _IMPLEMENTATIONS[raw]
    except KeyError:
        raise ValueError(f"{ENV_COMMUNICATION}={raw!r}: expected nccl, ring or auto") from None


def collective_timeout_s(env: Mapping[str, str] = os.environ) -> float | None:
    """``TFCLUSTER_COLLECTIVE_TIMEOUT_S`` as seconds, None when unset (TF's default: never)."""
    return _float_env(env, ENV_COLLECTIVE_TIMEOUT)


def heartbeat_timeout_s(env: Mapping[str, str] = os.environ) -> float | None:
    """``TFCLUSTER_HEARTBEAT_TIMEOUT_S`` as seconds, None when unset."""
    return _float_env(env, ENV_HEARTBEAT_TIMEOUT)


def env_configures_communication(env: Mapping[str, str] = os.environ) -> bool:
    """True when the environment asks for anything other than TF's default options."""
    return communication_implementation(env) != "AUTO" or collective_timeout_s(env) is not None


def communication_options(env: Mapping[str, str] = os.environ) -> Any:
    """``tf.distribute.experimental.CommunicationOptions`` from the environment."""
    import tensorflow as tf

    impl = getattr(tf.distribute.experimental.CommunicationImplementation, communication_implementation(env))
    return tf.distribute.experimental.CommunicationOptions(
        implementation=impl, timeout_seconds=collective_timeout_s(env)
    )


def configure_coordination_heartbeat(env: Mapping[str, str] = os.environ, cluster_resolver: Any = None) -> bool:
    """Pre-configure the coordination service with our heartbeat timeout before MWMS is created.

    MWMS configures the coordination service itself only when it is not configured yet
    (``context.context().coordination_service is None``), with ``service_type="standalone"``, the
    leader from ``multi_worker_util.coordination_leader`` and the chief/worker jobs. We do exactly the
    same plus ``heartbeat_timeout_in_ms``, so a stopped peer is detected after our timeout instead of
    TF's default (≈10 s observed). Returns True if it configured anything; a no-op without the
    variable, without a multi-worker TF_CONFIG, for non chief/worker tasks, or when already configured.
    """
    timeout = heartbeat_timeout_s(env)
    if timeout is None:
        return False
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx.coordination_service is not None:
        return False
    resolver = cluster_resolver or tfconfig_cluster_resolver.TFConfigClusterResolver()
    cluster_spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
    if not cluster_spec.as_dict() or resolver.task_type not in _COORDINATED_JOBS:
        return False
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
        for job in _COORDINATED_JOBS
        if job in cluster_spec.jobs
    ]
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=max(1, round(timeout * 1000)),
    )
    return True


def strategy_record(strategy: Any) -> dict[str, Any]:
    """The fields of the ``strategy`` progress record for a built MWMS."""
    extended = strategy.extended
    options = extended._communication_options
    impl = options.implementation.name.lower()  # "auto", "ring" or "nccl"
    if impl == "auto":
        # What MWMS resolves AUTO to: NCCL for GPU all-reduce, RING otherwise.
        devices = getattr(extended, "_devices", ()) or ()
        impl = "nccl" if any("GPU" in str(d).upper() for d in devices) else "ring"
    return {"communication": impl, "timeout_s": options.timeout_seconds}


def report_strategy(strategy: Any) -> bool:
    """Emit the ``strategy`` record once per strategy object. Never raises."""
    try:
        if getattr(strategy, "_tfcluster_reported", False):
            return False
        record = strategy_record(strategy)
        try:
            strategy._tfcluster_reported = True
        except Exception:
            pass
        return emit("strategy", **record)
    except Exception as exc:
        warn_once("strategy-record", f"could not report the strategy: {exc!r}")
        return False


#: TensorFlow's words when MWMS is built after the eager context started (a dataset, tensor or model first):
#: ``context.configure_collective_ops`` refuses, and every worker fails with this RuntimeError.
LATE_STRATEGY = "must be configured at program startup"
_NOT_THE_SCRIPT = (os.sep + "tensorflow" + os.sep, os.sep + "keras" + os.sep, os.sep + "tf_keras" + os.sep)


def script_frame(frame: Any = None) -> tuple[str, int] | None:
    """(file, line) of the innermost caller outside TensorFlow, Keras and tfcluster: the script's line
    that made the failing call."""
    import sys

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame = frame or sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        path = os.path.abspath(name)
        if not name.startswith("<") and not path.startswith(ours) and not any(d in path for d in _NOT_THE_SCRIPT):
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def hint_failure(exc: BaseException) -> bool:
    """MWMS's constructor raised ``exc``: when it is the late-strategy mistake, tell the launcher (a
    ``hint`` record: the code and the script's line; the launcher words it). Never raises."""
    try:
        if not isinstance(exc, RuntimeError) or LATE_STRATEGY not in str(exc):
            return False
        if getattr(exc, "_tfcluster_hinted", False):  # make_strategy() under the hooks: told once
            return False
        exc._tfcluster_hinted = True  # type: ignore[attr-defined]
        where = script_frame()
        fields: dict[str, Any] = {"code": "late_strategy"}
        if where is not None:
            fields.update(file=os.path.basename(where[0])[:255], line=where[1])
        return emit("hint", **fields)
    except Exception:
        return False


def make_strategy(**overrides: Any) -> Any:
    """``tf.distribute.MultiWorkerMirroredStrategy`` configured from the tfcluster environment.

    ``overrides`` are passed to the constructor (``cluster_resolver=``, ``communication_options=``)
    and win over the environment. The coordination heartbeat is pre-configured first, and a
    ``strategy`` progress record tells worker_entry that the task is up.
    """
    import tensorflow as tf

    if "communication_options" not in overrides or overrides["communication_options"] is None:
        overrides["communication_options"] = communication_options()
    try:
        configure_coordination_heartbeat(cluster_resolver=overrides.get("cluster_resolver"))
    except Exception as exc:  # a missing heartbeat tweak must not stop training
        warn_once("heartbeat", f"could not pre-configure the coordination heartbeat: {exc!r}")
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(**overrides)
    except RuntimeError as exc:
        hint_failure(exc)
        raise
    report_strategy(strategy)
    return strategy


def task_from_tf_config(env: Mapping[str, str] = os.environ) -> tuple[str | None, int | None, int]:
    """(task type, task index, number of tasks) from TF_CONFIG; (None, None, 1) without one."""
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return None, None, 1
    config = json.loads(raw)
    task = config.get("task") or {}
    cluster = config.get("cluster") or {}
    n = sum(len(v) for k, v in cluster.items() if k in _COORDINATED_JOBS) or 1
    index = task.get("index")
    return task.get("type"), None if index is None else int(index), n
