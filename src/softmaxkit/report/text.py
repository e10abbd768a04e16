"""Tables as aligned plain text, for the terminal."""

from __future__ import annotations

import textwrap

from .._table import Table, format_value


def render_text(table: Table, width: int = 100) -> str:
    """``table`` as an aligned text table, with its claim, verdict and notes wrapped below."""
    lines = [table.title, "=" * min(len(table.title), width)]
    if table.skipped:
        lines.append(f"skipped: {table.skipped}")
        return "\n".join(lines)
    if table.claim:
        lines += textwrap.wrap("Claim: " + table.claim, width)
    cells = [[str(c) for c in table.columns]] + [[format_value(v) for v in row] for row in table.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    numeric = [all(_is_number(r[i]) for r in table.rows) and bool(table.rows) for i in range(len(table.columns))]

    def fmt(row: list[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(parts).rstrip()

    if table.columns:
        lines.append(fmt(cells[0]))
        lines.append("  ".join("-" * w for w in widths))
        lines += [fmt(row) for row in cells[1:]]
    if table.verdict:
        lines += textwrap.wrap("Measured: " + table.verdict, width)
    if table.status:
        lines.append(f"Verdict: {table.status}")
    if table.notes:
        lines += textwrap.wrap("Notes: " + table.notes, width)
    return "\n".join(lines)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
