"""``softmaxkit report``: run the benchmark and the arena, write DIR/index.html and DIR/results.json.

Also DIR/tables.md, the same tables as Markdown.

The page opens with the verdict on every claim tested and the headline speed table
(:mod:`.summary`); with ``compare_with`` (``softmaxkit report --compare OLD``) it then lists
the figures that moved since that run beyond their noise (:mod:`.compare`). It is
self-contained (plots embedded as base64 PNG, also written to DIR/figures/; a benchmark
table that comes without a plot gets one bar chart per quantity among its ratio columns).
results.json (``schema_version`` :data:`.compare.SCHEMA_VERSION`) holds every table with
the noise of each measured figure, the machine description and the run's settings. Both
are rewritten after each suite or task, so an interrupted run still leaves a report of
what finished.

With CUDA available, the GPU variants (:mod:`.gpu`: Triton kernels, SDPA flash) run as a
separate part, and the header names the GPU.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import time
from pathlib import Path
from typing import Any

from .._plugins import Outcome
from . import gpu as _gpu
from . import progress as _progress
from .compare import SCHEMA_VERSION, compare, load_results
from .figures import SavedFigure, ratio_figures, save_figures
from .html import render_html
from .progress import say
from .summary import verdict_rows

__all__ = ["DEFAULT_OUT", "build_report", "rebuild", "results_dict", "write_report"]

DEFAULT_OUT = "softmaxkit-report"


def build_report(out: str | Path = DEFAULT_OUT, quick: bool = False, suites=("all",), tasks=(),
                 seed: int = 0, show_progress: bool = True, compare_with: str | Path | None = None,
                 gpu: bool | None = None) -> Path:
    """Run bench ``suites`` and arena ``tasks`` and write the report into ``out``; return index.html's path.

    ``compare_with``: an earlier report directory or results.json; the report then lists every
    figure that moved beyond its noise (read before anything runs, so a bad path fails at once).
    ``gpu``: run the GPU variants (default: when CUDA is available and a benchmark suite is run).
    """
    return run_report(out, quick, suites, tasks, seed, show_progress, compare_with, gpu)[0]


def run_report(out: str | Path = DEFAULT_OUT, quick: bool = False, suites=("all",), tasks=(),
               seed: int = 0, show_progress: bool = True, compare_with: str | Path | None = None,
               gpu: bool | None = None) -> tuple[Path, list[Outcome]]:
    """:func:`build_report`, returning the outcome of every suite and task too (the CLI's exit status)."""
    from .. import arena, bench

    old = load_results(compare_with) if compare_with is not None else None
    suite_names = bench.check_suites(suites) if suites else []
    task_names = arena.check_tasks(tasks)
    jobs = [("bench", n) for n in suite_names] + [("arena", n) for n in task_names]
    if gpu is None:
        gpu = bool(suite_names) and _gpu.available()
    if gpu:
        jobs.insert(len(suite_names), ("bench", _gpu.NAME))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = bench.machine_header()
    meta = {"command": "softmaxkit report" + (" --quick" if quick else ""), "quick": quick, "seed": seed,
            "started (UTC)": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "GPU variants": "run" if gpu else f"not run: {_gpu.why_not() or 'no benchmark suite selected'}"}
    if old is not None:
        meta["compared with"] = old["label"]
    outcomes: list[Outcome] = []
    figures: dict[int, list[SavedFigure]] = {}
    taken: set[str] = set()
    start = time.perf_counter()
    for kind, name in _progress.progress(jobs, desc="softmaxkit report", enabled=show_progress):
        say(f"[{kind} {name}] running")
        if kind == "bench" and name == _gpu.NAME:
            outcome = _gpu.run_outcome(quick=quick)
        elif kind == "bench":
            outcome = bench.run_suite(name, quick=quick)
        else:
            outcome = arena.run_task(name, quick=quick, seed=seed)
        for table in outcome.tables:
            if kind == "bench" and not table.figures:
                table.figures.extend(ratio_figures(table))
            figures[id(table)] = save_figures(table, out_dir, f"{kind}-{name}-{table.title}", taken)
        outcomes.append(outcome)
        detail = f"{len(outcome.tables)} table(s)" if outcome.status == "ok" else outcome.reason
        say(f"[{kind} {name}] {outcome.status} in {outcome.seconds:.1f} s: {detail}")
        meta["total seconds"] = round(time.perf_counter() - start, 1)
        write_report(out_dir, outcomes, figures, machine, meta, old)
    meta["total seconds"] = round(time.perf_counter() - start, 1)
    return write_report(out_dir, outcomes, figures, machine, meta, old), outcomes


def results_dict(outcomes: list[Outcome], figures: dict[int, list[SavedFigure]], machine: dict, meta: dict) -> dict:
    """What results.json holds: schema version, machine, settings, every outcome with its tables."""
    results: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "machine": machine, "meta": meta, "outcomes": []}
    for outcome in outcomes:
        entry = outcome.to_dict()
        for table, table_dict in zip(outcome.tables, entry["tables"]):
            table_dict["figures"] = [f.path for f in figures.get(id(table), [])]
        results["outcomes"].append(entry)
    return results


def write_report(out_dir: Path, outcomes: list[Outcome], figures: dict[int, list[SavedFigure]],
                 machine: dict, meta: dict, old: dict | None = None) -> Path:
    """Write index.html, results.json and tables.md for ``outcomes`` into ``out_dir``; with ``old``
    (an earlier run's results), the comparison with it too."""
    results = results_dict(outcomes, figures, machine, meta)
    comparison = None
    if old is not None:
        comparison = compare(old, {**json.loads(json.dumps(results, default=str)), "label": str(out_dir)})
        results["comparison"] = comparison.to_dict()
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    index = out_dir / "index.html"
    index.write_text(render_html(outcomes, figures, machine, meta, comparison), encoding="utf-8")
    (out_dir / "tables.md").write_text(render_markdown(outcomes, machine, meta), encoding="utf-8")
    return index


def outcomes_from_results(results: dict, out_dir: Path | None = None):
    """The outcomes a ``results.json`` holds (noise re-attached to the figures that had it), and
    their saved figures (read from ``out_dir``/figures when given)."""
    from .._table import Table
    from ..bench._measure import Measured

    outcomes, figures = [], {}
    for entry in results["outcomes"]:
        tables = []
        for t in entry["tables"]:
            noise = t.get("noise") or [[None] * len(r) for r in t["rows"]]
            rows = [[Measured(v, n) if n is not None and isinstance(v, (int, float)) else v for v, n in zip(r, nr)]
                    for r, nr in zip(t["rows"], noise)]
            table = Table(title=t["title"], columns=t["columns"], rows=rows, claim=t.get("claim"),
                          verdict=t.get("verdict"), notes=t.get("notes"), skipped=t.get("skipped"),
                          status=t.get("status"))
            table.headline = [{**h, "ratio": Measured(h["ratio"], h.get("noise"))} for h in t.get("headline", [])]
            if out_dir is not None:
                figures[id(table)] = [SavedFigure(Path(f).stem, f,
                                                  base64.b64encode((out_dir / f).read_bytes()).decode())
                                      for f in t.get("figures", []) if (out_dir / f).is_file()]
            tables.append(table)
        outcomes.append(Outcome(entry["kind"], entry["name"], entry["status"], tables, entry.get("reason"),
                                entry.get("seconds", 0.0), entry.get("claim")))
    return outcomes, figures


def rebuild(out: str | Path = DEFAULT_OUT) -> Path:
    """Rewrite ``out``/index.html and tables.md from ``out``/results.json and ``out``/figures/ with this
    version's renderer, without running anything (noise re-attached to the figures that had it)."""
    out_dir = Path(out)
    results = load_results(out_dir)
    outcomes, figures = outcomes_from_results(results, out_dir)
    return write_report(out_dir, outcomes, figures, results.get("machine", {}), results.get("meta", {}))


def render_markdown(outcomes: list[Outcome], machine: dict, meta: dict) -> str:
    """Every table as Markdown (what the README's result tables are pasted from)."""
    lines = [f"Machine: {', '.join(f'{k} {v}' for k, v in machine.items())}. Command: `{meta['command']}`.", ""]
    verdicts = verdict_rows(outcomes)
    if verdicts:
        lines += ["#### Verdicts", "", "| claim | source | verdict | section |", "|---|---|---|---|"]
        lines += [f"| {r.claim.replace('|', '/')} | {r.source or '-'} | **{r.status}** | {r.producer} |"
                  for r in verdicts]
        lines.append("")
    for outcome in outcomes:
        lines += [f"#### {outcome.kind} {outcome.name} ({outcome.status}, {outcome.seconds:.0f} s)", ""]
        for table in outcome.tables:
            lines += [table.to_markdown(), ""]
    return "\n".join(lines)
