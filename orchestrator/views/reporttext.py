"""The text of `tfcluster report`, read from the typed model (``reportmodel.Report``)."""

from __future__ import annotations

from typing import Any

from ..core.text import table
from .control import throughput_lines
from .evaluations import evaluation_lines
from .goodput import goodput_lines
from .loss import loss_lines
from .noise_scale import noise_lines
from .outliers import shown
from .pace import pace_lines
from .reportmodel import Report, flat_workers
from .reshapes import reshape_lines
from .split import split_lines


def report_text(rep: Report) -> str:
    """The report as a person reads it: the workers' table, the split, what was named, the advice."""
    lines = [f"job {rep.job}   run {rep.run_dir}", ""]
    head = ("TASK", "HOST", "STEPS", "STEP ms", "STEPS/s", "EX/s", "INPUT", "COMPUTE", "IN COLL", "AFTER", "OWN WORK")
    rows = [(*head, "REL", "IND", "CPU WAIT%", "CPU%", "RSS MB")]
    listed, spread = shown(flat_workers(rep.workers), rep.straggler_tasks())
    lines += [*spread, ""] if spread else []
    for t in listed:
        w = rep.workers[t]
        fig = w.figures
        rows.append(
            (
                t,
                str(w.host or ""),
                _s(fig.steps),
                _s(w.step_ms),
                _s(fig.steps_per_s),
                _s(fig.examples_per_s, ".0f"),
                _s(w.part("input_ms")),
                _s(w.part("compute_ms")),
                _s(w.part("collective_ms")),
                _s(w.after_ms),
                _s(w.part("pre_collective_ms")),
                _s(w.relative_score, ".2f"),
                _s(w.individual_score, ".2f"),
                _s(w.evidence.get("wait_pct")),
                _s(fig.cpu_pct),
                _s(w.rss_mb_max),
            )
        )
    lines += table(rows)
    lines += throughput_lines(dict(rep.throughput))
    gm = rep.gpu_models
    busy = {m: c for m, c in rep.gpu_clocks.items() if c.get("clock_mhz")}
    if gm.per_host or busy:
        lines += ["", "GPUs:" + ("  MIXED MODELS: every step waits for the slowest GPU" if gm.mixed else "")]
        lines += [f"  {h}: {', '.join(models)}" for h, models in gm.per_host.items()]
        lines += [f"  {m}: {c['busy']} busy, median SM clock {c['clock_mhz'] / 1000:.2f} GHz" for m, c in busy.items()]
    if rep.pace:
        lines += ["", *pace_lines(rep.pace)]
    if rep.split:
        lines += ["", *split_lines(rep.split, over(rep))]
        lines += [
            f"scaling efficiency ≈ {rep.efficiency:.0%} (time outside the all-reduce and the wait for the slowest "
            "worker / step time: N workers give efficiency x N times one worker)",
        ]
    if rep.stragglers:
        lines += ["", "straggler events:"] + [f"  {s.task} ({s.host}): {s.message}" for s in rep.stragglers]
        if not rep.window and rep.analysis.suggested_last_s:
            lines.append(
                f"  (the split above is over the whole run; `--last {rep.analysis.suggested_last_s}s` splits only the "
                "steps since the first straggler appeared)"
            )
    if rep.slowing:
        lines += ["", "slowing workers:"] + [f"  {s.task} ({s.host}): {s.message}" for s in rep.slowing]
    if rep.roles is not None:
        lines += ["", f"roles ({rep.roles.strategy}):"]
        then = {"restart": "restarted in place", "report": "reported, training went on"}
        for e in rep.roles.events:
            if e.task is None:
                lines.append(f"  {e.message}")
            else:
                did = f"{then['restart']} ({e.restarts})" if e.action == "restart" else then.get(str(e.action), "")
                lines.append(f"  {e.task} ({e.host}): {e.message}; {did}")
        if not rep.roles.events:
            lines.append("  every task of every role ran to the end")
    lines += evaluation_lines(dict(rep.evaluations or {})) + reshape_lines(rep.reshapes)
    if rep.loss:
        lines += ["", *loss_lines(rep.loss)]
    if rep.noise_scale.windows or rep.loss:
        lines += ["", *noise_lines(rep.noise_scale)]
    lines += ["", "advice:"] + [f"  - {a}" for a in rep.advice]
    if rep.goodput:
        lines += ["", *goodput_lines(rep.goodput)]
    return "\n".join(lines)


def over(rep: Report) -> str:
    """What the split's figures are means of (the text and the page say the same)."""
    text = "step-weighted means of its step-clock windows"
    return text + (f" of the last {rep.window.last_s:g} s" if rep.window else "")


def _s(v: Any, fmt: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, fmt)
    return str(v)
