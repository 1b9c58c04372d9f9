"""The live monitor's view of the GPUs: each task's recent NVML samples and models, judged by ``gpus``.

The judgement runs once every live task with GPUs has sent a new sample (a round of heartbeats), over
each task's last ``beats`` samples: one odd sample neither names a GPU nor clears it. A problem is
announced once (a ``gpu_problem`` event) and again only after it was gone for ``clear_after`` rounds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from .gpus import GpuJudgement, GpuProblem, judge_gpus

BEATS = 3  # heartbeats of GPU samples per task a judgement looks at
CLEAR_AFTER = 3  # rounds without a problem before it may be announced again


class GpuWatch:
    def __init__(self, beats: int = BEATS, clear_after: int = CLEAR_AFTER) -> None:
        self.samples: dict[str, deque[list[dict[str, Any]]]] = {}
        self.models: dict[str, list[dict[str, Any]]] = {}
        self.judgement = GpuJudgement()
        self._beats = beats
        self._clear_after = clear_after
        self._fresh: set[str] = set()
        self._announced: dict[tuple[str, int, str], int] = {}  # key -> rounds since last seen

    def on_models(self, task: str, gpus: list[dict[str, Any]]) -> None:
        """The task's GPU models (its hello's facts: ``name`` per GPU, in index order)."""
        self.models[task] = list(gpus)

    def on_sample(self, task: str, gpus: list[dict[str, Any]]) -> None:
        self.samples.setdefault(task, deque(maxlen=self._beats)).append(gpus)
        self._fresh.add(task)

    def forget(self, task: str) -> None:
        """A task that ended: its GPUs are no longer judged (nor anyone's peers)."""
        self.samples.pop(task, None)
        self._fresh.discard(task)

    def judge(self, live: Iterable[str], work: Mapping[str, Mapping[str, Any]]) -> list[GpuProblem]:
        """When every live task with GPUs has a new sample: judge, and return the problems to announce."""
        tasks = [t for t in live if t in self.samples]
        if not tasks or any(t not in self._fresh for t in tasks):
            return []
        self._fresh.clear()
        self.judgement = judge_gpus({t: list(self.samples[t]) for t in tasks}, self.models, work)
        now = {p.key: p for p in self.judgement.problems}
        new = [p for key, p in now.items() if key not in self._announced]
        for key in list(self._announced):
            self._announced[key] = 0 if key in now else self._announced[key] + 1
            if self._announced[key] >= self._clear_after:
                del self._announced[key]
        for p in new:
            self._announced[p.key] = 0
        return new
