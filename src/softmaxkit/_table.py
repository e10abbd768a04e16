"""A small result table shared by the benchmark, the arena and the report."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

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
        headline: for a benchmark table, the figures the report's "Headline speed" table
            shows: dicts ``{"op", "case", "peer", "ratio"}`` added by :meth:`add_headline`,
            ``ratio`` = the peer's time / softmaxkit's time measured in this run (> 1:
            softmaxkit is faster).
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
    headline: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in VERDICTS:
            raise ValueError(f"status must be one of {VERDICTS} or None, got {self.status!r}")

    def add(self, *values: Any) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"row has {len(values)} values, table {self.title!r} has {len(self.columns)} columns")
        self.rows.append(list(values))

    def add_figure(self, name: str, make: Callable[[], Any]) -> None:
        """Attach the figure ``make()`` builds (a matplotlib Figure) as ``name``; without
        matplotlib (a core install: it is in the ``report`` extra) the table keeps its numbers
        and says in its notes that the figure was left out."""
        try:
            self.figures.append((name, make()))
        except ImportError:
            note = f"No figure '{name}': matplotlib is not installed (pip install 'softmaxkit[report]')."
            self.notes = f"{self.notes} {note}" if self.notes else note

    def add_headline(self, op: str, peer: str, ratio: float, case: str = "") -> None:
        """Declare one headline speed figure: ``ratio`` = ``peer``'s time / softmaxkit's time for ``op``
        on ``case`` (a shape or setting), both measured in this run."""
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not ratio > 0:
            raise ValueError(f"ratio must be a positive number (peer time / softmaxkit time), got {ratio!r}")
        self.headline.append({"op": op, "case": case, "peer": peer, "ratio": ratio})

    def to_dict(self) -> dict:
        """Plain data for results.json. ``noise`` parallels ``rows``: each cell's relative
        run-to-run noise where it is a repeated measurement (``bench._measure.Measured``),
        ``None`` elsewhere (labels, single measurements, deterministic results)."""
        return {
            "title": self.title, "columns": list(self.columns),
            "rows": [[_plain(v) for v in row] for row in self.rows],
            "noise": [[noise_of(v) for v in row] for row in self.rows],
            "claim": self.claim, "verdict": self.verdict, "notes": self.notes, "skipped": self.skipped,
            "status": self.status, "figures": [f if isinstance(f, str) else f[0] for f in self.figures],
            "headline": [{**h, "ratio": _plain(h["ratio"]), "noise": noise_of(h["ratio"])} for h in self.headline],
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
        if self.status:
            lines += ["", f"Verdict: **{self.status}**"]
        if self.notes:
            lines += ["", self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()


def verdict_of(checks) -> str:
    """The verdict on a claim made of parts, from one boolean per part measured:
    ``"held"`` if all held, ``"did not hold"`` if none did, ``"partly"`` otherwise, and
    ``"not testable"`` when there is nothing to judge (no parts)."""
    checks = [bool(c) for c in checks]
    if not checks:
        return "not testable"
    if all(checks):
        return "held"
    return "partly" if any(checks) else "did not hold"


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


def noise_of(v: Any) -> float | None:
    """The relative run-to-run noise a measured number carries (``None`` if it carries none)."""
    noise = getattr(v, "noise", None)
    return float(noise) if isinstance(noise, (int, float)) and noise == noise else None


def is_number(v: Any) -> TypeGuard[int | float]:
    """An int or float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def label_columns(columns, rows) -> int:
    """How many leading columns name a row: those whose values are all strings or integers
    (shape, op, normalizer, L), at least one, and more until the labels are unique."""
    count = 0
    for i in range(len(columns)):
        values = [row[i] for row in rows if i < len(row)]
        if values and all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
            count += 1
        else:
            break
    count = max(count, 1) if columns else 0
    while count < len(columns) and len({tuple(map(str, row[:count])) for row in rows}) < len(rows):
        count += 1
    return count


def row_label(columns, row, count: int) -> str:
    """A row's name from its first ``count`` cells: text as it is, numbers as ``column=value``."""
    parts = []
    for column, value in zip(columns[:count], row[:count]):
        if isinstance(value, str):
            parts.append(value)
        else:
            parts.append(f"{column}={format_value(value)}")
    return ", ".join(parts)


def row_labels(table: Table) -> list[str]:
    """Every row's name (see :func:`label_columns` and :func:`row_label`)."""
    count = label_columns(table.columns, table.rows)
    return [row_label(table.columns, row, count) for row in table.rows]


def _plain(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (ValueError, RuntimeError):
            return str(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if isinstance(v, float) and type(v) is not float:  # a Measured number: its noise goes to "noise"
        return float(v)
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
