"""A report as a web page: real tables, advice as wrapped text, goodput as a bar, the pictures inlined.

Hand-written HTML (the standard library's ``html.escape`` for every value) rather than a template
engine: the page is a dozen fixed sections, and one file that can be mailed or attached to a ticket
needs no dependency beyond matplotlib for its pictures. Every value shown came from the run directory
(a node's hostnames and messages included): all of it is escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .goodputmodel import CATEGORIES, Goodput
from .recovery import recovery_lines

CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}"
    "h2{margin-top:1.6em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;font-size:13px;margin:.5em 0;display:block;overflow-x:auto;max-width:100%}"
    "th,td{padding:3px 8px;border-bottom:1px solid #eee;white-space:nowrap}th{background:#f4f4f4;text-align:left}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}tr.flag td{background:#fff4e5}"
    "pre{background:#f6f6f6;padding:.8em;font-size:13px;white-space:pre-wrap;overflow-wrap:anywhere}"
    "li{margin:.3em 0;overflow-wrap:anywhere}img{max-width:100%}figure{margin:1.5em 0}"
    "figcaption{color:#555;font-size:14px}.bar{display:flex;height:22px;border:1px solid #999;margin:.5em 0}"
    ".bar span{display:block;height:100%}.key{display:inline-block;width:.9em;height:.9em;margin-right:.4em;"
    "vertical-align:middle}details{margin-top:2em}"
)
#: The goodput bar's colours: the productive share green, what was lost in warm to cold colours.
GOODPUT_COLORS = {
    "productive_s": "#59a14f",
    "startup_s": "#bab0ac",
    "input_stall_s": "#4e79a7",
    "straggler_wait_s": "#f28e2b",
    "redone_s": "#ff9da7",
    "host_lost_s": "#b07aa1",
    "failure_s": "#e15759",
    "teardown_s": "#9c755f",
    "gather_s": "#76b7b2",
    "other_s": "#d4d4d4",
}


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


class Page:
    """The sections of one page, in order; ``render`` gives the document."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []

    def h2(self, text: str) -> None:
        self.parts.append(f"<h2>{esc(text)}</h2>")

    def p(self, text: str) -> None:
        self.parts.append(f"<p>{esc(text)}</p>")

    def ul(self, items: Iterable[str], cls: str = "") -> None:
        lis = "".join(f"<li>{esc(i)}</li>" for i in items)
        self.parts.append(f'<ul class="{cls}">{lis}</ul>' if cls else f"<ul>{lis}</ul>")

    def pre(self, text: str) -> None:
        """Lines whose columns line up (a split, a GPU list): kept as they are, wrapped when too long."""
        self.parts.append(f"<pre>{esc(text)}</pre>")

    def table(self, head: Sequence[str], rows: Iterable[Sequence[Any]], flagged: set[int] | None = None) -> None:
        """A real table: numbers right-aligned, flagged rows (stragglers) highlighted."""
        out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in head), "</tr></thead><tbody>"]
        for i, row in enumerate(rows):
            out.append('<tr class="flag">' if flagged and i in flagged else "<tr>")
            for cell in row:
                numeric = isinstance(cell, (int, float)) or (isinstance(cell, str) and _numeric(cell))
                out.append(f'<td class="n">{esc(cell)}</td>' if numeric else f"<td>{esc(cell)}</td>")
            out.append("</tr>")
        out.append("</tbody></table>")
        self.parts.append("".join(out))

    def goodput_bar(self, g: Goodput) -> None:
        """The wall time as one bar split into goodput's categories, and its key with seconds and shares."""
        wall = float(g.wall_s or 0.0)
        gp = g.goodput
        head = f"goodput {gp:.1%} of {wall:.1f} s wall time" if gp is not None else f"goodput unknown ({wall:.1f} s)"
        self.parts.append(f"<p><b>{esc(head)}</b>{'' if g.finished else ' (so far)'}</p>")
        spans, keys = [], []
        for k, label in CATEGORIES.items():
            v = float(g.seconds.get(k) or 0.0)
            share = v / wall if wall > 0 else 0.0
            if v <= 0:
                continue
            color = GOODPUT_COLORS.get(k, "#ccc")
            spans.append(
                f'<span style="width:{100 * share:.2f}%;background:{color}" title="{esc(label)}: {v:.1f} s"></span>'
            )
            keys.append(
                f'<li><span class="key" style="background:{color}"></span>{esc(label)}: {v:.1f} s ({share:.1%})</li>'
            )
        self.parts.append(f'<div class="bar" role="img" aria-label="{esc(head)}">{"".join(spans)}</div>')
        self.parts.append(f"<ul>{''.join(keys)}</ul>")
        notes = [
            f"attempt {a.attempt}: lost {a.lost_work_s or 0:.1f} s of training ({a.backup})"
            for a in g.attempts
            if a.backup
        ]
        notes += [line.strip() for line in recovery_lines(g)]  # the cost of each failure, as the text says it
        if notes or g.notes:
            self.ul([*notes, *(str(n) for n in g.notes)])

    def figure(self, caption: str, png: Path) -> None:
        data = base64.b64encode(png.read_bytes()).decode()
        self.parts.append(
            f'<figure><img alt="{esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>"
        )

    def details(self, summary: str, text: str) -> None:
        self.parts.append(f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>")

    def render(self) -> str:
        return "\n".join(
            [
                "<!doctype html>",
                '<html lang="en"><head><meta charset="utf-8">',
                '<meta name="viewport" content="width=device-width, initial-scale=1">',
                f"<title>{esc(self.title)}</title><style>{CSS}</style></head><body>",
                f"<h1>{esc(self.title)}</h1>",
                *self.parts,
                "</body></html>",
            ]
        )


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
