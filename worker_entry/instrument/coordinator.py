"""A ParameterServerStrategy coordinator's training, counted on the chief (issue 32.1).

The TF docs' parameter-server tutorial trains with ``Model.fit`` (its Keras callback counts those steps)
and then with a ``ClusterCoordinator`` loop: ``coordinator.schedule(step_fn, ...)`` per step, a
``coordinator.join()`` per epoch. Nothing else sees that loop: no MWMS collective runs on the chief, so
the step clock has nothing to stamp. Here each ``schedule`` the script itself calls is one training step
(counted at once: the job's progress is live), and each ``join`` says when the steps scheduled so far
were done — the progress record it writes carries that time, so the run's training ends with the
coordinator's last step, not with its last schedule.

Keras's own ``schedule`` calls (``fit``/``evaluate`` under the strategy schedule their functions too) are
left to the Keras callback: a call whose caller is Keras or TensorFlow is not counted. Stdlib only.
"""

from __future__ import annotations

import functools
import sys
import time
from types import ModuleType
from typing import Any

from .progress import counter

_WRAPPED = "_tfcluster_wrapped"
_NOT_THE_SCRIPT = ("keras", "tf_keras", "tensorflow")


def _from_the_script(depth: int = 2) -> bool:
    """Whether the caller ``depth`` frames up is the user's code (not Keras or TensorFlow)."""
    try:
        caller = sys._getframe(depth).f_globals.get("__name__", "") or ""
    except ValueError:
        return True
    return caller.split(".", 1)[0] not in _NOT_THE_SCRIPT


def patch_coordinator(module: ModuleType) -> bool:
    """Wrap ``ClusterCoordinator.schedule`` (a step) and ``join`` (the steps so far are done)."""
    cls = module.ClusterCoordinator
    schedule, join = cls.schedule, cls.join
    if getattr(schedule, _WRAPPED, False):
        return False
    pending = {"steps": 0}

    @functools.wraps(schedule)
    def scheduled(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = schedule(self, *args, **kwargs)
        if _from_the_script():
            try:
                counter("train").add(1, source="coordinator")
                pending["steps"] += 1
            except Exception:  # counting must never change the user's call
                pass
        return result

    @functools.wraps(join)
    def joined(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = join(self, *args, **kwargs)
        if pending["steps"]:
            pending["steps"] = 0
            try:
                counter("train").settle(time.time())
            except Exception:
                pass
        return result

    setattr(scheduled, _WRAPPED, True)
    cls.schedule, cls.join = scheduled, joined
    return True
