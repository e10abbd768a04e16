"""``softmaxkit report``: run the benchmark and the arena, write DIR/index.html and DIR/results.json.

Also DIR/tables.md, the same tables as Markdown.

The page is self-contained (plots embedded as base64 PNG, also written to DIR/figures/;
a benchmark table that comes without a plot gets a bar chart of its ratio columns);
results.json holds every table, the machine header and the run's settings. Both are
rewritten after each suite or task, so an interrupted run still leaves a report of what
finished.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from pathlib import Path

from .._plugins import Outcome
from . import progress as _progress
from .figures import SavedFigure, ratio_figure, save_figures
from .html import render_html
from .progress import say

__all__ = ["build_report", "write_report", "DEFAULT_OUT"]

DEFAULT_OUT = "softmaxkit-report"


def build_report(out: str | Path = DEFAULT_OUT, quick: bool = False, suites=("all",), tasks=(),
                 seed: int = 0, show_progress: bool = True) -> Path:
    """Run bench ``suites`` and arena ``tasks`` and write the report into ``out``; return index.html's path."""
    from .. import arena, bench

    suite_names = bench.check_suites(suites) if suites else []
    task_names = arena.check_tasks(tasks)
    jobs = [("bench", n) for n in suite_names] + [("arena", n) for n in task_names]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = bench.machine_header()
    meta = {"command": "softmaxkit report" + (" --quick" if quick else ""), "quick": quick, "seed": seed,
            "started (UTC)": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")}
    outcomes: list[Outcome] = []
    figures: dict[int, list[SavedFigure]] = {}
    taken: set[str] = set()
    start = time.perf_counter()
    for kind, name in _progress.progress(jobs, desc="softmaxkit report", enabled=show_progress):
        say(f"[{kind} {name}] running")
        if kind == "bench":
            outcome = bench.run_suite(name, quick=quick)
        else:
            outcome = arena.run_task(name, quick=quick, seed=seed)
        for table in outcome.tables:
            if kind == "bench" and not table.figures:
                plot = ratio_figure(table)
                if plot is not None:
                    table.figures.append(("ratios", plot))
            figures[id(table)] = save_figures(table, out_dir, f"{kind}-{name}-{table.title}", taken)
        outcomes.append(outcome)
        detail = f"{len(outcome.tables)} table(s)" if outcome.status == "ok" else outcome.reason
        say(f"[{kind} {name}] {outcome.status} in {outcome.seconds:.1f} s: {detail}")
        meta["total seconds"] = round(time.perf_counter() - start, 1)
        write_report(out_dir, outcomes, figures, machine, meta)
    meta["total seconds"] = round(time.perf_counter() - start, 1)
    return write_report(out_dir, outcomes, figures, machine, meta)


def write_report(out_dir: Path, outcomes: list[Outcome], figures: dict[int, list[SavedFigure]],
                 machine: dict, meta: dict) -> Path:
    """Write index.html and results.json for ``outcomes`` into ``out_dir``."""
    results = {"machine": machine, "meta": meta, "outcomes": []}
    for outcome in outcomes:
        entry = outcome.to_dict()
        for table, table_dict in zip(outcome.tables, entry["tables"]):
            table_dict["figures"] = [f.path for f in figures.get(id(table), [])]
        results["outcomes"].append(entry)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    index = out_dir / "index.html"
    index.write_text(render_html(outcomes, figures, machine, meta), encoding="utf-8")
    (out_dir / "tables.md").write_text(render_markdown(outcomes, machine, meta), encoding="utf-8")
    return index


def render_markdown(outcomes: list[Outcome], machine: dict, meta: dict) -> str:
    """Every table as Markdown (what the README's result tables are pasted from)."""
    lines = [f"Machine: {', '.join(f'{k} {v}' for k, v in machine.items())}. Command: `{meta['command']}`.", ""]
    for outcome in outcomes:
        lines += [f"#### {outcome.kind} {outcome.name} ({outcome.status}, {outcome.seconds:.0f} s)", ""]
        for table in outcome.tables:
            lines += [table.to_markdown(), ""]
    return "\n".join(lines)
