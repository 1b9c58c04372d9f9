"""Plain-text tables for the console (the --json forms are the objects' to_dict)."""

from __future__ import annotations


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
