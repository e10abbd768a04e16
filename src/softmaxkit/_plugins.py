"""Run the optional producers of result tables (bench suites, arena tasks) one at a time.

A producer is a module exposing ``run(quick=...) -> list[Table]``. Other parts of the
library may not exist yet, or may not be finished: a producer whose module is missing,
fails to import, or raises ``NotImplementedError`` is reported as *skipped* with the
reason; one that raises anything else is reported as *failed* with the error. Neither is
ever dropped silently, and neither stops the other producers.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ._table import Table

OK, SKIPPED, FAILED = "ok", "skipped", "failed"
#: The name that expands to every suite or task.
ALL = "all"


@dataclass
class Outcome:
    """What one producer gave: its tables, or why it gave none.

    Attributes:
        kind: ``"bench"`` or ``"arena"``.
        name: the suite or task name.
        status: ``"ok"``, ``"skipped"`` (subject not installed / not implemented yet) or
            ``"failed"`` (it raised an error).
        tables: the tables it returned; for a skipped or failed producer, one table whose
            ``skipped`` field holds the reason, so that every report shows it.
        reason: why it was skipped or failed (``None`` when ok).
        seconds: wall time it took.
        claim: the arena task's ``CLAIM``, when it has one.
    """

    kind: str
    name: str
    status: str
    tables: list[Table] = field(default_factory=list)
    reason: str | None = None
    seconds: float = 0.0
    claim: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 3), "claim": self.claim,
                "tables": [t.to_dict() for t in self.tables]}


def expand_names(names, known, kind: str) -> list[str]:
    """``names`` in order without repeats, ``"all"`` (or nothing) expanded to every ``known``
    name; ``ValueError`` naming the accepted names otherwise. ``kind`` is e.g. "arena task"."""
    names = list(names) or ["all"]
    out: list[str] = []
    for name in names:
        if name == ALL:
            chosen = list(known)
        elif name in known:
            chosen = [name]
        else:
            raise ValueError(f"unknown {kind} {name!r}; accepted: {', '.join(known)}, all")
        out += [n for n in chosen if n not in out]
    return out


def load(module_name: str):
    """Import ``module_name``; return ``(module, None)`` or ``(None, reason)``."""
    try:
        return importlib.import_module(module_name), None
    except ModuleNotFoundError as err:
        if err.name == module_name:
            return None, f"not installed yet: module {module_name} does not exist"
        return None, f"cannot import {module_name}: {err}"
    except ImportError as err:
        return None, f"cannot import {module_name}: {err}"
    except NotImplementedError as err:
        return None, f"not implemented yet: {err}"


def run(kind: str, name: str, module_name: str, call: Callable[[ModuleType], Any]) -> Outcome:
    """Import ``module_name`` and return ``call(module)``'s tables as an :class:`Outcome`."""
    start = time.perf_counter()
    module, reason = load(module_name)
    title = f"{kind} {name}"
    if module is None:
        return _without_tables(kind, name, SKIPPED, reason, title, start)
    claim = getattr(module, "CLAIM", None)
    try:
        result = call(module)
    except NotImplementedError as err:
        outcome = _without_tables(kind, name, SKIPPED, f"not implemented yet: {err}", title, start)
    except ImportError as err:  # e.g. matplotlib or a peer package not installed
        outcome = _without_tables(kind, name, SKIPPED, f"missing dependency: {err}", title, start)
    except Exception as err:  # a broken producer must not take the whole report down
        traceback.print_exc()
        outcome = _without_tables(kind, name, FAILED, f"failed: {type(err).__name__}: {err}", title, start)
    else:
        tables = [result] if isinstance(result, Table) else list(result or [])
        bad = [type(t).__name__ for t in tables if not isinstance(t, Table)]
        if bad:
            outcome = _without_tables(kind, name, FAILED, f"failed: run() returned {', '.join(bad)}, not Table",
                                      title, start)
        elif tables and all(t.skipped for t in tables):   # (no GPU, no scikit-learn: nothing measured)
            outcome = Outcome(kind, name, SKIPPED, tables, tables[0].skipped, time.perf_counter() - start)
        else:
            outcome = Outcome(kind, name, OK, tables, None, time.perf_counter() - start)
    outcome.claim = claim if isinstance(claim, str) else None
    if outcome.status != OK and outcome.claim:
        outcome.tables[0].claim = outcome.claim
    return outcome


def _without_tables(kind: str, name: str, status: str, reason: str, title: str, start: float) -> Outcome:
    table = Table(title=title, columns=[], skipped=reason)
    return Outcome(kind, name, status, [table], reason, time.perf_counter() - start)
