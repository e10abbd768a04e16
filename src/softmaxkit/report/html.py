"""The report as one self-contained HTML page (tables, claims, verdicts, embedded PNG plots)."""

from __future__ import annotations

from html import escape

from .._plugins import Outcome
from .._table import Table, format_value
from .figures import SavedFigure

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.claim { background: #eef4ff; padding: 0.4em 0.8em; border-left: 4px solid #4a7bd0; }
.verdict { background: #effaef; padding: 0.4em 0.8em; border-left: 4px solid #3a9a3a; }
.skipped { background: #fff6e0; padding: 0.4em 0.8em; border-left: 4px solid #d0a000; }
.failed { background: #ffecec; padding: 0.4em 0.8em; border-left: 4px solid #d04040; }
.notes { color: #555; font-size: 0.9em; } img { max-width: 100%; border: 1px solid #ddd; margin: 0.4em 0; }
"""


def render_html(outcomes: list[Outcome], figures: dict[int, list[SavedFigure]], machine: dict, meta: dict) -> str:
    """The whole report. ``figures`` maps ``id(table)`` to its saved figures."""
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>softmaxkit report</title>", f"<style>{_STYLE}</style>", "</head>", "<body>",
             "<h1>softmaxkit report</h1>", _meta(machine, meta), _contents(outcomes)]
    for kind, heading in (("bench", "Benchmarks"), ("arena", "Arena: published claims")):
        chosen = [o for o in outcomes if o.kind == kind]
        if not chosen:
            continue
        parts.append(f"<h2>{heading}</h2>")
        for outcome in chosen:
            parts.append(_outcome(outcome, figures))
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def _meta(machine: dict, meta: dict) -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
                   for k, v in {**meta, **machine}.items())
    return f'<table class="machine">{rows}</table>'


def _anchor(outcome: Outcome) -> str:
    return f"{outcome.kind}-{outcome.name}"


def _contents(outcomes: list[Outcome]) -> str:
    items = "".join(
        f'<li><a href="#{escape(_anchor(o))}">{escape(o.kind)} {escape(o.name)}</a>: {escape(o.status)}'
        f" ({o.seconds:.1f} s)</li>" for o in outcomes)
    return f"<h2>Contents</h2><ul>{items}</ul>"


def _outcome(outcome: Outcome, figures: dict[int, list[SavedFigure]]) -> str:
    parts = [f'<section id="{escape(_anchor(outcome))}">',
             f"<h3>{escape(outcome.kind)} {escape(outcome.name)}</h3>"]
    if outcome.claim:
        parts.append(f'<p class="claim"><b>Claim.</b> {escape(outcome.claim)}</p>')
    for table in outcome.tables:
        parts.append(_table(table, figures.get(id(table), []), failed=outcome.status == "failed",
                            show_claim=table.claim != outcome.claim))
    parts.append("</section>")
    return "\n".join(parts)


def _table(table: Table, saved: list[SavedFigure], failed: bool, show_claim: bool) -> str:
    parts = [f"<h4>{escape(table.title)}</h4>"]
    if table.skipped:
        css = "failed" if failed else "skipped"
        parts.append(f'<p class="{css}"><b>{css.capitalize()}.</b> {escape(table.skipped)}</p>')
        return "\n".join(parts)
    if table.claim and show_claim:
        parts.append(f'<p class="claim"><b>Claim.</b> {escape(table.claim)}</p>')
    head = "".join(f"<th>{escape(str(c))}</th>" for c in table.columns)
    body = []
    for row in table.rows:
        cells = "".join(
            f'<td class="num">{escape(format_value(v))}</td>' if _is_number(v) else f"<td>{escape(format_value(v))}</td>"
            for v in row)
        body.append(f"<tr>{cells}</tr>")
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    if table.verdict:
        parts.append(f'<p class="verdict"><b>Measured.</b> {escape(table.verdict)}</p>')
    if table.notes:
        parts.append(f'<p class="notes">{escape(table.notes)}</p>')
    for fig in saved:
        parts.append(f'<figure><img alt="{escape(fig.name)}" src="data:image/png;base64,{fig.png_base64}">'
                     f'<figcaption>{escape(fig.name)} (<a href="{escape(fig.path)}">{escape(fig.path)}</a>)'
                     "</figcaption></figure>")
    return "\n".join(parts)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
