"""Keeps README.md's generated sections in step with the code and the latest committed run.

``python -m softmaxkit.report.readme`` rewrites, between their markers:

* ``<!-- section:normalizers -->``: the registry table (what ``softmaxkit list`` prints);
* ``<!-- section:headline -->``: the verdict counts and the headline speed table of the run
  committed as ``docs/results.json`` (copy a report's ``results.json`` there after
  ``make demo`` on an idle machine).

Tests fail when the README's sections differ from what this module generates.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

from .. import registry
from .compare import load_results, machine_line
from .summary import headline_rows, verdict_rows

SECTIONS = ("normalizers", "headline")
RESULTS = Path("docs") / "results.json"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- section:{name} -->", f"<!-- /section:{name} -->"


def _markdown_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return lines


def normalizer_section() -> str:
    """The README's normalizer table, generated from the registry."""
    table = registry.table()
    lines = ["## Normalizers", "",
             "Generated from the registry (`softmaxkit list` prints the same table; regenerate with "
             "`python -m softmaxkit.report.readme`). Every name works with "
             "`sk.normalize(x, name, dim=-1, mask=None, **params)`, has a function `sk.<name>`, runs in "
             "`sk.attention` and `sk.nn.Attention`, and is a Hugging Face `attn_implementation` "
             "`softmaxkit_<name>`.", ""]
    rows = [[f"`{row[0]}`"] + [str(v) for v in row[1:]] for row in table.rows if not registry.get(row[0]).user]
    return "\n".join(lines + _markdown_table(table.columns, rows))


def headline_section(results_path: Path) -> str:
    """Verdict counts and the headline speed table of the committed run."""
    from . import outcomes_from_results

    results = load_results(results_path)
    outcomes, _ = outcomes_from_results(results)
    verdicts = Counter(row.status for row in verdict_rows(outcomes))
    meta = results.get("meta", {})
    lines = ["## Headline figures", "",
             f"From the run committed as `{RESULTS.as_posix()}` ({machine_line(results.get('machine', {}))}; "
             f"`{meta.get('command', 'softmaxkit report --quick')}`). Reproduce with `make demo` and read "
             "`softmaxkit-report/index.html`; the report holds every table, its noise and its plots. "
             "Verdicts on the claims tested: " + ", ".join(f"{n} {s}" for s, n in sorted(verdicts.items())) + ".",
             ""]
    rows = []
    for h in headline_rows(outcomes):
        if not h.declared:  # a table's worst "speed-up" cell: in the report, not a headline figure
            continue
        noise = f" ± {h.noise * 100:.0f}%" if h.noise else ""
        rows.append([h.op, h.case, h.peer, f"{float(h.ratio):.3g}x{noise}",
                     "faster" if h.ratio >= 1 else "slower"])
    return "\n".join(lines + _markdown_table(["op", "case", "softmaxkit vs", "peer time / softmaxkit time", ""],
                                             rows))


def generated(name: str, root: Path) -> str:
    generators = {"normalizers": normalizer_section, "headline": lambda: headline_section(root / RESULTS)}
    return generators[name]()


def current_section(text: str, name: str = "normalizers") -> str:
    start, end = markers(name)
    match = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), text, re.S)
    if match is None:
        raise ValueError(f"README has no {start} ... {end} markers")
    return match.group(1)


def update(path: Path) -> bool:
    """Rewrite every generated section of the README at ``path``; returns True if it changed."""
    text = original = path.read_text()
    for name in SECTIONS:
        start, end = markers(name)
        old = current_section(text, name)
        text = text.replace(start + "\n" + old + "\n" + end, start + "\n" + generated(name, path.parent) + "\n" + end)
    if text == original:
        return False
    path.write_text(text)
    return True


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    print("updated" if update(target) else "up to date")
