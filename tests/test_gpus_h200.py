"""The GPU judgement on the real readings of an NVIDIA H200 (tests/data/h200), a second model beside the
H100 of tests/test_gpus.py: NVML's samples as the node agent takes them pass the protocol's checks, a
healthy H200 at its power cap is named nowhere, alone or beside H100s, and a second program on it is
named with its PID and memory, as `bench/gpu_health.py` named it on that machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.supervise import judge_gpus
from worker_entry import protocol as p

DATA = Path(__file__).parent / "data"
H200 = json.loads((DATA / "h200" / "h200-gpu-health.json").read_text())
H100 = json.loads((DATA / "h100" / "h100-nvml.json").read_text())
TASKS = ["worker:0", "worker:1", "worker:2"]


def busy(phase: str) -> list[dict[str, Any]]:
    """The samples of ``phase`` once the load ran (util ≥ 90 %): the first seconds are the load starting."""
    return [g for s in H200[phase] for g in s["gpus"] if g["util"] >= 90]


def beats(task: str, phase: str = "load", n: int = 4) -> list[list[dict[str, Any]]]:
    samples = busy(phase)
    i = TASKS.index(task)
    return [[samples[(3 * b + i) % len(samples)]] for b in range(n)]


def test_every_h200_sample_passes_the_protocols_checks():
    samples = [g for phase in ("idle", "load", "after", "shared") for s in H200[phase] for g in s["gpus"]]
    assert len(samples) == 46
    for g in samples:
        back = p.GpuSample.from_dict(g).to_dict()
        assert {k: v for k, v in back.items() if v is not None} == g  # every reading kept, in range
    assert len(busy("load")) >= 10 and {tuple(g["throttle"]) for g in busy("load")} == {("power cap",)}


def test_healthy_h200s_at_their_power_cap_are_named_nowhere():
    loaded = {t: beats(t) for t in TASKS}
    assert all(1400 <= g["sm_clock_mhz"] <= 1550 for bs in loaded.values() for b in bs for g in b)  # 1.98 max
    judged = judge_gpus(loaded, models={t: [{"name": "NVIDIA H200"}] for t in TASKS})
    assert judged.problems == () and judged.suspect() is None


def test_an_h200_beside_h100s_is_judged_against_its_own_model_only():
    """A mixed job: two H100 workers and one H200 worker, all healthy under load. The H200's clock is not
    compared with the H100s' (a different model), so nobody is named."""
    h100 = H100["load"]
    samples = {t: [[h100[(3 * b + i) % len(h100)]] for b in range(4)] for i, t in enumerate(TASKS[:2])}
    samples["worker:2"] = beats("worker:2")
    models = {"worker:0": [{"name": "NVIDIA H100 80GB HBM3"}], "worker:1": [{"name": "NVIDIA H100 80GB HBM3"}]}
    judged = judge_gpus(samples, models={**models, "worker:2": [{"name": "NVIDIA H200"}]})
    assert judged.problems == (), judged.problems


def test_a_second_program_on_an_h200_is_named_with_its_pid_and_memory():
    shared = busy("shared")
    assert all(g["processes"] == 2 and len(g["others"]) == 1 for g in shared)
    other = shared[0]["others"][0]
    samples = {t: beats(t) for t in TASKS[:2]}
    samples["worker:2"] = [[g] for g in shared[:4]]
    judged = judge_gpus(samples, models={t: [{"name": "NVIDIA H200"}] for t in TASKS})
    assert [(q.task, q.problem) for q in judged.problems] == [("worker:2", "shared")]
    want = f"shared with a process outside the task: PID {other['pid']} (python3, {other['used_mb']} MB)"
    assert want in judged.problems[0].detail and want in H200["named"]["shared"][0]
    task, cause, detail = judged.suspect()
    assert (task, cause) == ("worker:2", "GPU shared") and want in detail
