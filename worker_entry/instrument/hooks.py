"""Zero-code instrumentation of training scripts (like ``opentelemetry-instrument`` / ``ddtrace-run``).

worker_entry runs the user's command with ``worker_entry/_site`` first on PYTHONPATH when
``TFCLUSTER_INSTRUMENT=1``; its ``sitecustomize.py`` loads this file by path and calls ``install()``.
``install()`` registers post-import hooks so that, once TensorFlow / Keras are imported:

- ``tf.distribute.MultiWorkerMirroredStrategy`` (``CollectiveAllReduceStrategy.__init__``) gets the
  tfcluster communication options when the script passes none, the coordination heartbeat is
  pre-configured, and a ``strategy`` progress record is emitted once the strategy exists;
- ``Model.fit`` (tf_keras, Keras 2, Keras 3) gets our ProgressCallback appended unless one is there
  (epochs, examples, the evaluate/predict phases);
- in an evaluator task, ``Model.evaluate`` gets an EvaluationCallback that reports each evaluation's
  metrics, step and (under ``SidecarEvaluator``, whose checkpoint listing is hooked) checkpoint;
- the step clock (``stamps.py``) stamps every MWMS collective and every replica function of
  ``strategy.run`` while a ``tf.function`` is traced: ``CollectiveAllReduce._all_reduce`` of
  ``cross_device_ops``, ``MirroredExtended._call_for_each_replica`` (MWMS's), and eager
  ``next()`` on distributed iterators (``input_lib``) — so steps, progress and the straggler signals
  exist for Keras fit and custom loops alike, with no callback.

Every hook is wrapped: a failure prints one ``tfcluster:`` warning line on stderr and the user's call
proceeds exactly as it would without us. This module must import with the standard library only (it
runs in the user's interpreter, which may not have our package installed): it reaches its siblings
through relative imports, whatever name its package was loaded under.
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..protocol.env import OFF_VALUES, Env
from .coordinator import patch_coordinator
from .progress import note_checkpoint, warn_once

ENV_INSTRUMENT = Env.INSTRUMENT
_WRAPPED = "_tfcluster_wrapped"


def enabled(env: Any = os.environ) -> bool:
    """Instrumentation is on unless ``TFCLUSTER_INSTRUMENT`` is 0/false/no/off."""
    return env.get(ENV_INSTRUMENT, "1").strip().lower() not in OFF_VALUES


def _guard(key: str, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated hook body, turning any exception into one warning line."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                warn_once(key, f"instrumentation: {what} failed ({exc!r}); continuing without it")
                return None

        return run

    return deco


# ------------------------------------------------------------------------------------- MWMS hook


def patch_mwms(module: ModuleType) -> bool:
    """Wrap ``CollectiveAllReduceStrategy.__init__`` (what ``tf.distribute.MultiWorkerMirroredStrategy`` is)."""
    cls = module.CollectiveAllReduceStrategy
    original = cls.__init__
    if getattr(original, _WRAPPED, False):
        return False
    signature = inspect.signature(original)

    @_guard("mwms-before", "configuring MultiWorkerMirroredStrategy")
    def before(self: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        from . import strategy as st

        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return None  # let TensorFlow raise its own error for the user's bad call
        resolver = bound.arguments.get("cluster_resolver")
        if bound.arguments.get("communication_options") is None and st.env_configures_communication():
            bound.arguments["communication_options"] = st.communication_options()
            args, kwargs = bound.args[1:], dict(bound.kwargs)
        else:
            args, kwargs = tuple(args), dict(kwargs)
        st.configure_coordination_heartbeat(cluster_resolver=resolver)
        return args, kwargs

    @_guard("mwms-after", "reporting the strategy")
    def after(self: Any) -> None:
        from . import strategy as st

        st.report_strategy(self)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        changed = before(self, args, kwargs)
        if changed is not None:
            args, kwargs = changed
        try:
            original(self, *args, **kwargs)
        except RuntimeError as exc:  # the late-strategy mistake: a hint for the launcher, the error as it was
            from . import strategy as st

            st.hint_failure(exc)
            raise
        after(self)

    setattr(__init__, _WRAPPED, True)
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    cls.__init__ = __init__
    return True


# -------------------------------------------------------------------------------------- fit hook


def _callback_base(keras_package: str) -> type:
    module = sys.modules.get(keras_package) or importlib.import_module(keras_package)
    return module.callbacks.Callback


def _profiling_user_callback(callbacks: list) -> bool:
    """True if a TensorBoard callback will run the profiler itself (two sessions cannot coexist)."""
    return any(type(c).__name__ == "TensorBoard" and (getattr(c, "_start_batch", 0) or 0) > 0 for c in callbacks)


def _batch_dim(spec: Any) -> int | None:
    """The static first dimension of a dataset element's first tensor, if any (for a distributed
    dataset: of its first replica's)."""
    first = spec
    while True:
        if isinstance(first, (tuple, list)) and first:
            first = first[0]
        elif isinstance(first, dict) and first:
            first = next(iter(first.values()))
        elif getattr(first, "_value_specs", None):  # PerReplicaSpec: one spec per local replica
            first = first._value_specs[0]
        else:
            break
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0 and shape[0] is not None:
        return int(shape[0])
    return None


def _global_batch_size(x: Any, batch_size: Any) -> int | None:
    """Examples per step across all replicas, if evident: a tf.data dataset's static batch dimension
    (for ``experimental_distribute_dataset`` the original dataset's; for
    ``distribute_datasets_from_function`` the per-replica batch times the replicas in sync), or fit's
    ``batch_size`` for arrays."""
    spec = getattr(x, "element_spec", None)
    if spec is not None:
        if type(x).__module__.startswith("tensorflow.python.distribute"):
            original = getattr(x, "_original_dataset", None)
            if original is not None:  # experimental_distribute_dataset: the dataset holds the global batch
                return _batch_dim(original.element_spec)
            replicas = getattr(getattr(x, "_strategy", None), "num_replicas_in_sync", None)
            per_replica = _batch_dim(spec)
            return per_replica * int(replicas) if per_replica and replicas else None
        return _batch_dim(spec)
    if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
        return int(batch_size) if batch_size else 32  # Keras's default batch size for arrays
    return None


def _arg(args: tuple, kwargs: dict, pos: int | None, name: str) -> Any:
    if pos is not None and len(args) > pos:
        return args[pos]
    return kwargs.get(name)


def _with_callback(
    args: tuple, kwargs: dict, pos: int | None, marker: str, make: Callable[[list], Any]
) -> tuple[tuple, dict] | None:
    """The call's arguments with ``make(existing callbacks)`` appended to its callbacks (at ``pos`` or
    ``callbacks=``), unless one with ``marker`` is there; None: nothing to change."""
    given = _arg(args, kwargs, pos, "callbacks")
    existing = list(getattr(given, "callbacks", given) or [])
    if any(getattr(c, marker, False) for c in existing):
        return None
    cb = make(existing)
    if given is not None and hasattr(given, "callbacks") and hasattr(given, "append"):
        given.append(cb)  # a CallbackList: Keras uses it as is
        return None
    new = [*existing, cb]
    if pos is not None and len(args) > pos:
        args = (*args[:pos], new, *args[pos + 1 :])
    else:
        kwargs = {**kwargs, "callbacks": new}
    return args, kwargs


def _position(signature: inspect.Signature, name: str) -> int | None:
    names = list(signature.parameters)
    return names.index(name) - 1 if name in names else None  # position after self


def patch_fit(cls: type, keras_package: str) -> bool:
    """Wrap ``cls.fit`` to append a ProgressCallback unless the call already has one."""
    original = cls.fit
    if getattr(original, _WRAPPED, False):
        return False
    signature = inspect.signature(original)
    cb_pos, x_pos, bs_pos = (_position(signature, n) for n in ("callbacks", "x", "batch_size"))

    @_guard("fit-hook", "adding the progress callback to fit")
    def add_callback(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        from .keras_callback import callback_class

        def make(existing: list) -> Any:
            batch = _global_batch_size(_arg(args, kwargs, x_pos, "x"), _arg(args, kwargs, bs_pos, "batch_size"))
            return callback_class(_callback_base(keras_package))(
                batch_size=batch, tf_profiler=not _profiling_user_callback(existing)
            )

        return _with_callback(args, kwargs, cb_pos, "_tfcluster_progress", make)

    return _wrap_method(cls, "fit", original, add_callback)


# --------------------------------------------------------------------------------- evaluate hook


def is_evaluator(env: Any = os.environ) -> bool:
    """This process is an evaluator task (``TFCLUSTER_TASK_TYPE``, else ``TF_CONFIG``'s task type)."""
    kind = env.get(Env.TASK_TYPE)
    if not kind:
        import json

        try:
            kind = ((json.loads(env.get(Env.TF_CONFIG) or "{}") or {}).get("task") or {}).get("type")
        except (ValueError, AttributeError):
            return False
    return kind == "evaluator"


def patch_evaluate(cls: type, keras_package: str) -> bool:
    """Wrap ``cls.evaluate``: in an evaluator task, an EvaluationCallback reports each evaluation's
    metrics (not the validation inside ``fit``, which calls ``evaluate`` with ``_use_cached_eval_dataset``)."""
    original = cls.evaluate
    if getattr(original, _WRAPPED, False):
        return False
    cb_pos = _position(inspect.signature(original), "callbacks")

    @_guard("evaluate-hook", "adding the evaluation callback to evaluate")
    def add_callback(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if kwargs.get("_use_cached_eval_dataset") or not is_evaluator():
            return None
        from .keras_callback import evaluation_callback_class

        make = lambda existing: evaluation_callback_class(_callback_base(keras_package))()  # noqa: E731
        return _with_callback(args, kwargs, cb_pos, "_tfcluster_evaluation", make)

    return _wrap_method(cls, "evaluate", original, add_callback)


def _wrap_method(cls: type, name: str, original: Callable, add_callback: Callable) -> bool:
    """``cls.name`` calls ``original`` with the arguments ``add_callback`` gave it a callback in (or
    unchanged when it returns None), marked so it is never wrapped twice."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        changed = add_callback(args, kwargs)
        if changed is not None:
            args, kwargs = changed
        return original(self, *args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    setattr(cls, name, wrapper)
    return True


def patch_sidecar(module: ModuleType) -> bool:
    """Wrap the sidecar evaluator module's ``list_checkpoint_attributes``: ``SidecarEvaluator.start``
    calls it with each checkpoint it has just restored, right before evaluating it — so the next
    evaluation names that checkpoint (``progress.note_checkpoint``)."""
    original = module.list_checkpoint_attributes
    if getattr(original, _WRAPPED, False):
        return False

    @functools.wraps(original)
    def list_checkpoint_attributes(ckpt_dir_or_file: Any) -> Any:
        try:
            note_checkpoint(ckpt_dir_or_file)
        except Exception as exc:  # pragma: no cover - note_checkpoint only assigns
            warn_once("sidecar-hook", f"instrumentation: noting the checkpoint failed ({exc!r})")
        return original(ckpt_dir_or_file)

    setattr(list_checkpoint_attributes, _WRAPPED, True)
    module.list_checkpoint_attributes = list_checkpoint_attributes
    return True


# ---------------------------------------------------------------------------- post-import hooks


def _stamps(name: str) -> Callable[[ModuleType], Any]:
    def hook(module: ModuleType) -> Any:
        from .stepclock import collectives, stamps

        return getattr(stamps if hasattr(stamps, name) else collectives, name)(module)

    return hook


def _keras(cls: type, keras_package: str) -> None:
    patch_fit(cls, keras_package)
    patch_evaluate(cls, keras_package)


# module name -> hook run right after that module has executed
HOOKS: dict[str, Callable[[ModuleType], Any]] = {
    "tensorflow.python.distribute.collective_all_reduce_strategy": patch_mwms,
    "tensorflow.python.distribute.mirrored_strategy": _stamps("patch_extended"),  # MWMS's base
    "tensorflow.python.distribute.cross_device_ops": _stamps("patch_cross_device_ops"),
    "tensorflow.python.distribute.input_lib": _stamps("patch_input_lib"),
    "tf_keras.src.engine.training": lambda m: _keras(m.Model, "tf_keras"),
    "keras.src.backend.tensorflow.trainer": lambda m: _keras(m.TensorFlowTrainer, "keras"),  # Keras 3
    "keras.src.engine.training": lambda m: _keras(m.Model, "keras"),  # Keras 2.13-2.15
    "keras.engine.training": lambda m: _keras(m.Model, "keras"),  # Keras <= 2.12
    "tensorflow.python.distribute.coordinator.cluster_coordinator": patch_coordinator,  # PS: a schedule, a step
    "tf_keras.src.utils.sidecar_evaluator": patch_sidecar,
    "keras.src.utils.sidecar_evaluator": patch_sidecar,  # Keras 2.13-2.15 (Keras 3 has no SidecarEvaluator)
}


def _run_hook(name: str, hook: Callable[[ModuleType], Any], module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:
        warn_once(f"hook-{name}", f"instrumentation: hook for {name} failed ({exc!r}); continuing without it")


class PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta path finder that finds nothing itself: it asks the other finders and wraps the loader's
    ``exec_module`` so a hook runs right after one of the watched modules has been executed."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], Any]]) -> None:
        self.hooks = hooks
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        busy = self._local.__dict__.setdefault("busy", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        except Exception:
            return None  # let the normal machinery (without us) find it and report its own errors
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        try:
            _wrap_exec_module(spec.loader, fullname, hook)
        except Exception as exc:
            warn_once(f"wrap-{fullname}", f"instrumentation: cannot hook {fullname} ({exc!r})")
        return spec


def _wrap_exec_module(loader: Any, name: str, hook: Callable[[ModuleType], Any]) -> None:
    original = loader.exec_module  # bound method of this module's own loader instance

    def exec_module(module: ModuleType) -> None:
        try:
            del loader.exec_module  # leave the loader as we found it
        except AttributeError:
            pass
        original(module)
        _run_hook(name, hook, module)

    loader.exec_module = exec_module


_installed: PostImportFinder | None = None


def install(env: Any = os.environ) -> bool:
    """Register the post-import hooks (idempotent); patch at once what is already imported."""
    global _installed
    if not enabled(env) or _installed is not None:
        return False
    _installed = PostImportFinder(HOOKS)
    sys.meta_path.insert(0, _installed)
    for name, hook in HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:
            _run_hook(name, hook, module)
    return True


def uninstall() -> None:
    """Remove the post-import hooks (patches already applied stay)."""
    global _installed
    if _installed is not None:
        try:
            sys.meta_path.remove(_installed)
        except ValueError:
            pass
        _installed = None
