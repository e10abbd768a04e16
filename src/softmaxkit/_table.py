"""A small result table shared by the benchmark, the arena and the report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: The four verdicts a claim can get; a table that tests a claim sets ``Table.status`` to one.
VERDICTS = ("held", "did not hold", "partly", "not testable")


@dataclass
class Table:
    """One table of results.

    Attributes:
        title: short title, e.g. ``"softmax forward, float32"``.
        columns: column names.
        rows: one list per row, aligned with ``columns`` (numbers or strings).
        claim: for arena tasks and benchmarks of a published figure, the claim tested.
        verdict: one or two sentences: what was measured, matching the claim or not.
        notes: anything a reader needs to interpret the numbers (baselines, sizes, seeds).
        figures: paths of plots (PNG) or ``(name, matplotlib Figure)`` pairs made for it.
        skipped: the reason this table could not be produced, when it could not.
        status: for a table that tests a claim, its verdict, computed next to the
            measurement: one of :data:`VERDICTS` (``"not testable"`` with the reason in
            ``verdict``).
    """

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    claim: str | None = None
    verdict: str | None = None
    notes: str | None = None
    figures: list[Any] = field(default_factory=list)
    skipped: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in VERDICTS:
            raise ValueError(f"status must be one of {VERDICTS} or None, got {self.status!r}")

    def add(self, *values: Any) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"row has {len(values)} values, table {self.title!r} has {len(self.columns)} columns")
        self.rows.append(list(values))

    def to_dict(self) -> dict:
        return {
            "title": self.title, "columns": list(self.columns),
            "rows": [[_plain(v) for v in row] for row in self.rows],
            "claim": self.claim, "verdict": self.verdict, "notes": self.notes, "skipped": self.skipped,
            "status": self.status, "figures": [f if isinstance(f, str) else f[0] for f in self.figures],
        }

    def to_markdown(self) -> str:
        lines = [f"**{self.title}**", ""]
        if self.skipped:
            return "\n".join(lines + [f"_skipped: {self.skipped}_"])
        if self.claim:
            lines += [f"Claim: {self.claim}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(format_value(v) for v in row) + " |")
        if self.verdict:
            lines += ["", f"Measured: {self.verdict}"]
        if self.notes:
            lines += ["", self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()


def format_value(v: Any) -> str:
    """Numbers to 4 significant digits, everything else as ``str``."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.4g}"
    return str(v)


def _plain(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (ValueError, RuntimeError):
            return str(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
