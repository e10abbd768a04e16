"""The two tables the report opens with: the verdict on every claim tested, and the headline speed.

Both are collected from the producers' tables, so a new bench suite or arena task appears
here as soon as it sets ``Table.claim`` and ``Table.status`` (verdicts) or calls
``Table.add_headline`` (speed); a benchmark table that declares no headline but has a
"speed-up" column still contributes its worst case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._plugins import OK, Outcome
from .._table import VERDICTS, Table, is_number, noise_of, row_labels
from .figures import slug

__all__ = ["HeadlineRow", "VerdictRow", "claim_source", "headline_rows", "table_anchor", "verdict_rows"]


@dataclass
class VerdictRow:
    claim: str
    source: str
    measured: str
    status: str       # one of VERDICTS
    reason: str       # why "not testable" (empty otherwise)
    anchor: str       # id of the table's section in index.html
    producer: str     # "arena soft_nms"


@dataclass
class HeadlineRow:
    op: str
    case: str
    peer: str
    ratio: float      # peer time / softmaxkit time (> 1: softmaxkit faster)
    noise: float | None
    anchor: str
    declared: bool    # False: taken from a "speed-up" column (worst row)


def table_anchor(kind: str, name: str, title: str) -> str:
    """The HTML id of a table's section: stable across runs (kind, producer, title)."""
    return slug(f"{kind}-{name}-{title}")


_TARGET = re.compile(r"^\s*(Target \(issue \d+\))")
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
_PAREN = re.compile(r"\(([^()]*)\)")


def claim_source(claim: str) -> str:
    """Where a claim comes from, read off its text: "softmaxkit target (issue N)"; a short leading
    "Authors Year (arXiv id):" (the year outside parentheses); else the parenthesised references
    that name a year (each cut at its first colon); "" when none is named."""
    target = _TARGET.match(claim)
    if target:
        return "softmaxkit " + target.group(1)[0].lower() + target.group(1)[1:]
    head, colon, _ = claim.partition(":")
    year = _YEAR.search(head)
    if colon and len(head) <= 60 and year and "(" not in head[:year.start()]:
        return head.strip()
    found = [group.split(":")[0].strip() for group in _PAREN.findall(claim) if _YEAR.search(group.split(":")[0])]
    return "; ".join(dict.fromkeys(found))


def verdict_rows(outcomes: list[Outcome]) -> list[VerdictRow]:
    """One row per table that carries a claim, in report order (an arena task's ``CLAIM`` counts
    when none of its tables carries one). Published claims first, the project's own targets after."""
    rows: list[VerdictRow] = []
    for outcome in outcomes:
        producer = f"{outcome.kind} {outcome.name}"
        claimed = [t for t in outcome.tables if t.claim]
        if not claimed and outcome.claim:
            first = outcome.tables[0] if outcome.tables else Table(title=producer, columns=[])
            claimed = [Table(title=first.title, columns=[], claim=outcome.claim, skipped=first.skipped)]
        for table in claimed:
            status, reason = _status(outcome, table)
            rows.append(VerdictRow(
                claim=table.claim or "", source=claim_source(table.claim or ""),
                measured=table.verdict or "", status=status, reason=reason,
                anchor=table_anchor(outcome.kind, outcome.name, table.title), producer=producer))
    return sorted(rows, key=lambda r: r.source.startswith("softmaxkit target"))


def _status(outcome: Outcome, table: Table) -> tuple[str, str]:
    if table.skipped:
        return "not testable", table.skipped
    if outcome.status != OK:
        return "not testable", outcome.reason or outcome.status
    if table.status in VERDICTS:
        return table.status, (table.verdict or "") if table.status == "not testable" else ""
    return "not testable", "the producer computed no verdict for this claim"


_SPEEDUP = re.compile(r"speed-?up", re.IGNORECASE)
_VS = re.compile(r"\bvs\.?\s+(.+)$", re.IGNORECASE)


def headline_rows(outcomes: list[Outcome]) -> list[HeadlineRow]:
    """Declared headline figures of every benchmark table that ran, and for a table that declares
    none, the worst row of its first "speed-up" column."""
    rows: list[HeadlineRow] = []
    for outcome in outcomes:
        if outcome.kind != "bench" or outcome.status != OK:
            continue
        for table in outcome.tables:
            if table.skipped or not table.rows:
                continue
            anchor = table_anchor(outcome.kind, outcome.name, table.title)
            if table.headline:
                rows += [HeadlineRow(h["op"], h.get("case", ""), h["peer"], float(h["ratio"]), noise_of(h["ratio"]),
                                     anchor, True) for h in table.headline]
                continue
            row = _worst_speedup(table, anchor)
            if row is not None:
                rows.append(row)
    return rows


def _worst_speedup(table: Table, anchor: str) -> HeadlineRow | None:
    for i, column in enumerate(table.columns):
        if not _SPEEDUP.search(str(column)):
            continue
        cells = [(row[i], label) for row, label in zip(table.rows, row_labels(table))
                 if i < len(row) and is_number(row[i]) and row[i] > 0]
        if not cells:
            continue
        value, label = min(cells, key=lambda c: c[0])
        peer = _VS.search(str(column))
        return HeadlineRow(op=table.title, case=f"{label} (worst of {len(cells)})",
                           peer=peer.group(1) if peer else "the table's baseline", ratio=float(value),
                           noise=noise_of(value), anchor=anchor, declared=False)
    return None
