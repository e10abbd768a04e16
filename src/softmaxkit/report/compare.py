"""Two runs compared: every figure that moved by more than its run-to-run noise, regressions marked.

``softmaxkit compare A B`` prints it; ``softmaxkit report --compare OLD`` adds it to the
report. A and B are report directories or their ``results.json`` files.

Which figures are compared, and against what:

* A benchmark figure that is a repeated measurement carries its relative noise in
  results.json (``noise`` beside ``rows``: 1.4826 x MAD / median of the repeats, combined in
  quadrature through ratios; see :class:`softmaxkit.bench._measure.Measured`). It *moved*
  when ``|new - old| / |old| > K * sqrt(noise_old^2 + noise_new^2)``, K = :data:`K`.
  A benchmark figure with no noise estimate in either run (a single measurement, such as a
  peak memory) is counted as not judged and not listed.
* Arena figures come from fixed seeds, so they are deterministic: any change beyond
  floating-point round-off (relative 1e-9) is listed.
* A claim whose verdict changed is listed too.

A move is a *regression* when it goes the worse way for its column: longer times, larger
"x copy" or "/ SDPA" ratios and memory, smaller speed-ups, higher losses and error rates,
lower accuracies (see :func:`direction`); figures of a baseline (torch, the copy, a peer)
and columns with no better side are listed as moved, without a mark.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .._table import VERDICTS, is_number, label_columns, row_label

__all__ = [
    "SCHEMA_VERSION",
    "Change",
    "Comparison",
    "K",
    "compare",
    "compare_files",
    "direction",
    "load_results",
    "render_text",
]

#: results.json's layout version (1: no "schema_version" key, no noise; 2: noise, headline, machine).
SCHEMA_VERSION = 2
#: how many combined noise standard deviations a figure must move by to be listed.
K = 3.0
#: relative change below which a deterministic (arena) figure counts as unchanged.
EXACT = 1e-9


@dataclass
class Change:
    kind: str
    producer: str
    table: str
    row: str
    column: str
    old: object
    new: object
    noise: float | None       # combined relative noise (None: deterministic figure)
    regression: bool
    note: str = ""

    @property
    def relative(self) -> float | None:
        if is_number(self.old) and is_number(self.new) and self.old != 0:
            return (self.new - self.old) / abs(self.old)
        return None

    def describe(self) -> str:
        rel = self.relative
        moved = f"{_fmt(self.old)} -> {_fmt(self.new)}"
        if rel is not None:
            moved += f" ({rel:+.1%}"
            moved += f", noise {self.noise:.1%})" if self.noise is not None else ", deterministic)"
        return moved


@dataclass
class Comparison:
    old_label: str
    new_label: str
    old_machine: dict
    new_machine: dict
    changes: list[Change] = field(default_factory=list)
    verdicts: list[Change] = field(default_factory=list)
    compared: int = 0          # figures present in both runs and judged
    not_judged: int = 0        # benchmark figures without a noise estimate
    only_old: list[str] = field(default_factory=list)   # tables in the old run only
    only_new: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes + self.verdicts if c.regression]

    def to_dict(self) -> dict:
        def plain(c: Change) -> dict:
            return {"kind": c.kind, "producer": c.producer, "table": c.table, "row": c.row, "column": c.column,
                    "old": c.old, "new": c.new, "noise": c.noise, "relative": c.relative,
                    "regression": c.regression, "note": c.note}
        return {"old": self.old_label, "new": self.new_label, "K": K, "compared": self.compared,
                "not judged": self.not_judged, "changes": [plain(c) for c in self.changes],
                "verdicts": [plain(c) for c in self.verdicts], "only old": self.only_old, "only new": self.only_new}


def load_results(path: str | Path) -> dict:
    """A run's results.json, given the file or the report directory holding it."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise ValueError(f"no results.json at {str(path)!r}: give a report directory or its results.json")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(results, dict) or "outcomes" not in results:
        raise ValueError(f"{str(path)!r} is not a softmaxkit results.json (no 'outcomes')")
    version = results.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"{str(path)!r} has schema_version {version!r}; this softmaxkit reads 1 to {SCHEMA_VERSION}")
    problem = _structure_problem(results)
    if problem:
        raise ValueError(f"{str(path)!r} is not a softmaxkit results.json: {problem}")
    results.setdefault("label", str(path))
    return results


def _structure_problem(results: dict) -> str | None:
    """What in ``results`` does not have the shape :func:`compare` reads, or None."""
    outcomes = results["outcomes"]
    if not isinstance(outcomes, list):
        return f"'outcomes' must be a list, got {type(outcomes).__name__}"
    if not isinstance(results.get("machine", {}), dict):
        return f"'machine' must be an object, got {type(results['machine']).__name__}"
    for i, outcome in enumerate(outcomes):
        if not isinstance(outcome, dict):
            return f"outcome {i} must be an object, got {type(outcome).__name__}"
        for key in ("kind", "name"):
            if not isinstance(outcome.get(key), str):
                return f"outcome {i} has no string {key!r}"
        tables = outcome.get("tables", [])
        if not isinstance(tables, list):
            return f"outcome {i} ('tables') must hold a list"
        for j, table in enumerate(tables):
            if not isinstance(table, dict) or not isinstance(table.get("title"), str):
                return f"table {j} of outcome {i} must be an object with a string 'title'"
            rows = table.get("rows", [])
            if not isinstance(table.get("columns", []), list) or not isinstance(rows, list) \
                    or not all(isinstance(row, list) for row in rows):
                return f"table {j} of outcome {i} must hold 'columns' and 'rows' as lists"
            noise = table.get("noise")
            if noise is not None and (not isinstance(noise, list) or not all(isinstance(r, list) for r in noise)):
                return f"table {j} of outcome {i} must hold 'noise' as a list of rows"
            # (compare reads these: a string noise or a list status raised TypeError in the terminal)
            if noise is not None and not all(v is None or (is_number(v) and not v < 0) for r in noise for v in r):
                return f"table {j} of outcome {i} must hold numbers >= 0 or null in 'noise'"
            if not all(isinstance(c, str) for c in table.get("columns", [])):
                return f"table {j} of outcome {i} must hold strings in 'columns'"
            if not isinstance(table.get("status"), (str, type(None))):
                return f"table {j} of outcome {i} must hold a string 'status' or none"
    return None


_HIGHER = re.compile(r"speed-?up|accuracy|auroc|aupr|\bap\b|ap@|ndcg|savings|soft-nms - ", re.IGNORECASE)
_LOWER = re.compile(r"\bms\b|x copy|/ sdpa|/ dense|time vs|memory vs|\bmib\b|\bloss\b|fpr|\bece\b|\bnll\b|error|"
                    r"\|.*\|", re.IGNORECASE)
_BASELINE = re.compile(r"^(torch|aten|copy|peer|dense|sdpa|ensemble-boxes|entmax|plain torch|exp-weighted)\b",
                       re.IGNORECASE)


def direction(column: str, row: str = "") -> int:
    """+1 when a larger value of ``column`` is better, -1 when smaller is, 0 when neither side is
    better or the figure measures a baseline (a ``torch ms`` column, a ``plain torch`` row)."""
    if _BASELINE.search(column.strip()) or any(_BASELINE.search(part.strip()) for part in row.split(",")):
        return 0
    if _HIGHER.search(column):
        return 1
    if _LOWER.search(column):
        return -1
    return 0


def _tables(results: dict) -> dict:
    out = {}
    for outcome in results.get("outcomes", []):
        for table in outcome.get("tables", []):
            key = (outcome["kind"], outcome["name"], table["title"])
            out[key] = (outcome, table)
    return out


def _cells(table: dict) -> dict:
    """``(row label, column) -> (value, noise)`` for every numeric cell outside the label columns."""
    columns, rows = table.get("columns", []), table.get("rows", [])
    noise = table.get("noise") or [[None] * len(r) for r in rows]
    count = label_columns(columns, rows)
    out: dict[tuple[str, str], tuple] = {}
    seen: dict[str, int] = {}
    for row, row_noise in zip(rows, noise):
        label = row_label(columns, row, count)
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label += f" #{seen[label]}"
        for j in range(count, min(len(columns), len(row))):
            value = row[j]
            if is_number(value):
                out[(label, columns[j])] = (value, row_noise[j] if j < len(row_noise) else None)
    return out


_RANK = {"held": 3, "partly": 2, "did not hold": 1, "not testable": 0}


def compare(old: dict, new: dict, k: float = K) -> Comparison:
    """Every figure of ``new`` that moved from ``old`` beyond its noise; verdicts that changed."""
    result = Comparison(old.get("label", "old"), new.get("label", "new"), old.get("machine", {}),
                        new.get("machine", {}))
    old_tables, new_tables = _tables(old), _tables(new)
    result.only_old = [" / ".join(key) for key in old_tables if key not in new_tables]
    result.only_new = [" / ".join(key) for key in new_tables if key not in old_tables]
    for key, (_outcome, table) in new_tables.items():
        if key not in old_tables:
            continue
        kind, producer, title = key
        old_table = old_tables[key][1]
        if table.get("status") != old_table.get("status") and table.get("claim"):
            before, after = old_table.get("status"), table.get("status")
            result.verdicts.append(Change(kind, producer, title, "verdict", "status", before, after, None,
                                          _RANK.get(after, 0) < _RANK.get(before, 0)
                                          and (after in VERDICTS or after is None)))
        old_cells, new_cells = _cells(old_table), _cells(table)
        for cell, (value, noise) in new_cells.items():
            if cell not in old_cells:
                continue
            before, old_noise = old_cells[cell]
            change = _judge(kind, producer, title, cell, before, old_noise, value, noise, k)
            if change is None:
                result.not_judged += 1
                continue
            result.compared += 1
            if change is not False:
                result.changes.append(change)
    return result


def _judge(kind, producer, title, cell, old, old_noise, new, new_noise, k):
    """A Change when the figure moved, False when it did not, None when it cannot be judged."""
    row, column = cell
    if kind == "arena":
        noise = None
        moved = abs(new - old) > EXACT * max(abs(old), abs(new), 1e-300)
    else:
        if old_noise is None and new_noise is None:
            return None
        noise = math.hypot(old_noise or 0.0, new_noise or 0.0)
        if old == 0:
            moved = new != 0 and noise == 0
        else:
            moved = abs(new - old) / abs(old) > k * noise
    if not moved:
        return False
    sign = direction(column, row)
    worse = sign != 0 and (new - old) * sign < 0
    return Change(kind, producer, title, row, column, old, new, noise, worse)


def compare_files(old: str | Path, new: str | Path, k: float = K) -> Comparison:
    """:func:`compare` of two report directories or results.json files."""
    return compare(load_results(old), load_results(new), k)


def _fmt(v) -> str:
    from .._table import format_value
    return format_value(v)


def machine_line(machine: dict) -> str:
    keys = ("cpu", "cores", "threads", "simd", "gpu", "torch", "numba", "triton")
    return ", ".join(f"{k} {machine[k]}" for k in keys if k in machine)


def render_text(c: Comparison) -> str:
    """The comparison for the terminal."""
    lines = [f"old: {c.old_label}", f"     {machine_line(c.old_machine)}",
             f"new: {c.new_label}", f"     {machine_line(c.new_machine)}",
             (f"{c.compared} figures compared ({c.not_judged} benchmark figures without a noise estimate not "
              f"judged); {len(c.changes)} moved beyond K = {K:g} x their noise, {len(c.regressions)} regressions."),
             ""]
    if c.old_machine and c.new_machine and machine_line(c.old_machine) != machine_line(c.new_machine):
        lines.insert(4, "note: the machines differ; speed figures are not comparable one to one.")
    for v in c.verdicts:
        mark = "REGRESSION " if v.regression else ""
        lines.append(f"{mark}verdict {v.kind} {v.producer} / {v.table}: {v.old} -> {v.new}")
    if c.verdicts:
        lines.append("")
    current = None
    for ch in c.changes:
        where = f"{ch.kind} {ch.producer} / {ch.table}"
        if where != current:
            lines.append(where)
            current = where
        mark = "REGRESSION " if ch.regression else ""
        lines.append(f"  {mark}{ch.row} | {ch.column}: {ch.describe()}")
    for label, keys in (("only in the old run", c.only_old), ("only in the new run", c.only_new)):
        if keys:
            lines.append(f"{label}: " + "; ".join(keys))
    if not c.changes and not c.verdicts:
        lines.append("nothing moved beyond its noise.")
    return "\n".join(lines)
