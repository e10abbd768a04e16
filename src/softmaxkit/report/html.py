"""The report as one self-contained HTML page.

It opens with the verdict on every claim tested and the headline speed table
(:mod:`.summary`), then, when runs are compared, the figures that moved (:mod:`.compare`),
then every table with its claim, verdict, notes and embedded PNG plots.
"""

from __future__ import annotations

from html import escape

from .._plugins import Outcome
from .._table import Table, format_value
from .figures import SavedFigure
from .summary import headline_rows, table_anchor, verdict_rows

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
table.summary td { vertical-align: top; }
table.verdicts { width: 100%; table-layout: fixed; font-size: 0.85em; }
table.verdicts col.c-claim { width: 32%; } table.verdicts col.c-source { width: 14%; }
table.verdicts col.c-measured { width: 34%; } table.verdicts col.c-verdict { width: 11%; }
table.verdicts col.c-section { width: 9%; } table.verdicts td.measured { font-size: 0.92em; color: #333; }
.v { font-weight: bold; white-space: nowrap; padding: 0.1em 0.4em; border-radius: 3px; }
.v-held { background: #d8f0d8; } .v-did-not-hold { background: #f8d8d8; }
.v-partly { background: #fff0c0; } .v-not-testable { background: #e4e4e4; }
.regression { color: #a00000; font-weight: bold; } .lead { color: #444; }
"""


def render_html(outcomes: list[Outcome], figures: dict[int, list[SavedFigure]], machine: dict, meta: dict,
                comparison=None) -> str:
    """The whole report. ``figures`` maps ``id(table)`` to its saved figures; ``comparison``
    (a :class:`.compare.Comparison`) adds the section of figures that moved."""
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>softmaxkit report</title>", f"<style>{_STYLE}</style>", "</head>", "<body>",
             "<h1>softmaxkit report</h1>", _machine_line(machine, meta),
             _verdicts(outcomes), _headline(outcomes, machine)]
    if comparison is not None:
        parts.append(render_comparison(comparison))
    parts += ["<h2>Run</h2>", _meta(machine, meta), _contents(outcomes)]
    for kind, heading in (("bench", "Benchmarks"), ("arena", "Arena: published claims")):
        chosen = [o for o in outcomes if o.kind == kind]
        if not chosen:
            continue
        parts.append(f"<h2>{heading}</h2>")
        for outcome in chosen:
            parts.append(_outcome(outcome, figures))
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def _machine_name(machine: dict) -> str:
    name = f"{machine.get('cpu', 'unknown CPU')}"
    if "cores" in machine:
        name += f", {machine['cores']} cores"
    name += f", {machine.get('threads', '?')} torch threads"
    if machine.get("gpu") not in (None, "none"):
        name += f", GPU {machine['gpu']}"
    return name


def _machine_line(machine: dict, meta: dict) -> str:
    return (f'<p class="lead">Measured on <b>{escape(_machine_name(machine))}</b> '
            f"(torch {escape(str(machine.get('torch', '?')))}, numba {escape(str(machine.get('numba', '?')))}, "
            f"triton {escape(str(machine.get('triton', '?')))}) "
            f"by <code>{escape(str(meta.get('command', '')))}</code>, "
            f"started {escape(str(meta.get('started (UTC)', '?')))} UTC.</p>")


def _verdict_badge(status: str) -> str:
    return f'<span class="v v-{status.replace(" ", "-")}">{escape(status)}</span>'


def _verdicts(outcomes: list[Outcome]) -> str:
    rows = verdict_rows(outcomes)
    intro = ("<p>Every published claim (and every speed target of softmaxkit itself) that this run tested. "
             "The verdict is computed by the task's code from the numbers measured here: <i>held</i>, "
             "<i>partly</i> (some parts or some cases), <i>did not hold</i>, or <i>not testable</i> on this "
             "machine (with the reason).</p>")
    if not rows:
        return '<h2 id="verdicts">Verdicts</h2>' + intro + "<p>No claim was tested in this run.</p>"
    counts = ", ".join(f"{sum(r.status == v for r in rows)} {v}" for v in ("held", "partly", "did not hold",
                                                                           "not testable"))
    body = []
    for r in rows:
        measured = r.reason if r.status == "not testable" and r.reason else r.measured
        body.append(
            f'<tr class="verdict-row"><td class="claim-text">{escape(r.claim)}</td><td>{escape(r.source or "-")}</td>'
            f'<td class="measured">{escape(measured)}</td><td>{_verdict_badge(r.status)}</td>'
            f'<td><a href="#{escape(r.anchor)}">{escape(r.producer)}</a></td></tr>')
    return (f'<h2 id="verdicts">Verdicts</h2>{intro}<p>{len(rows)} claims: {escape(counts)}.</p>'
            '<table class="summary verdicts"><colgroup><col class="c-claim"><col class="c-source">'
            '<col class="c-measured"><col class="c-verdict"><col class="c-section"></colgroup>'
            '<thead><tr><th>claim</th><th>source</th><th>measured here</th>'
            f"<th>verdict</th><th>section</th></tr></thead><tbody>{''.join(body)}</tbody></table>")


def _headline(outcomes: list[Outcome], machine: dict) -> str:
    rows = headline_rows(outcomes)
    heading = '<h2 id="headline">Headline speed</h2>'
    if not rows:
        return heading + "<p>No benchmark ran in this run.</p>"
    body = []
    for r in rows:
        noise = f" &plusmn; {100 * r.noise:.0f}%" if r.noise is not None else ""
        word = "faster" if r.ratio > 1 else "slower" if r.ratio < 1 else "same"
        case = r.case + ("" if r.declared else " *")
        body.append(f'<tr><td>{escape(r.op)}</td><td>{escape(case)}</td><td>{escape(r.peer)}</td>'
                    f'<td class="num"><b>{r.ratio:.3g}x</b>{noise}</td><td>{word}</td>'
                    f'<td><a href="#{escape(r.anchor)}">table</a></td></tr>')
    note = ("<p class=\"notes\">ratio = the peer's time / softmaxkit's time, both measured in this run "
            f"on {escape(_machine_name(machine))}; above 1 softmaxkit is faster. &plusmn; is the run-to-run noise "
            "(robust spread of the repeats). * = the benchmark declares no headline: its worst case is shown.</p>")
    return (heading + '<table class="summary headline"><thead><tr><th>op</th><th>case</th><th>softmaxkit vs</th>'
            f"<th>ratio</th><th></th><th>section</th></tr></thead><tbody>{''.join(body)}</tbody></table>" + note)


def render_comparison(c) -> str:
    """The "Compared with an earlier run" section."""
    from .compare import K, machine_line

    parts = ['<h2 id="comparison">Compared with an earlier run</h2>',
             (f"<p>Old: <code>{escape(c.old_label)}</code> ({escape(machine_line(c.old_machine))}).<br>"
              f"New: <code>{escape(c.new_label)}</code> ({escape(machine_line(c.new_machine))}).</p>"),
             (f"<p>{c.compared} figures compared; {len(c.changes)} moved by more than {K:g} times their run-to-run "
              f"noise (benchmarks) or changed at all (arena, fixed seeds); <span class=\"regression\">"
              f"{len(c.regressions)} regressions</span>. {c.not_judged} benchmark figures without a noise estimate "
              "(single measurements) were not judged.</p>")]
    rows = []
    for ch in c.verdicts + c.changes:
        mark = '<span class="regression">regression</span>' if ch.regression else ""
        rows.append(f"<tr><td>{escape(ch.kind)} {escape(ch.producer)}</td><td>{escape(ch.table)}</td>"
                    f"<td>{escape(ch.row)}</td><td>{escape(ch.column)}</td><td>{escape(ch.describe())}</td>"
                    f"<td>{mark}</td></tr>")
    if rows:
        parts.append('<table class="summary comparison"><thead><tr><th>producer</th><th>table</th><th>row</th>'
                     f"<th>figure</th><th>old -> new</th><th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    else:
        parts.append("<p>Nothing moved beyond its noise.</p>")
    for label, keys in (("Tables only in the old run", c.only_old), ("Tables only in the new run", c.only_new)):
        if keys:
            parts.append(f"<p>{label}: {escape('; '.join(keys))}.</p>")
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
                            show_claim=table.claim != outcome.claim,
                            anchor=table_anchor(outcome.kind, outcome.name, table.title)))
    parts.append("</section>")
    return "\n".join(parts)


def _table(table: Table, saved: list[SavedFigure], failed: bool, show_claim: bool, anchor: str) -> str:
    parts = [f'<h4 id="{escape(anchor)}">{escape(table.title)}</h4>']
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
            f'<td class="num">{escape(format_value(v))}</td>' if _is_number(v)
            else f"<td>{escape(format_value(v))}</td>"
            for v in row)
        body.append(f"<tr>{cells}</tr>")
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    if table.verdict:
        badge = f" {_verdict_badge(table.status)}" if table.status else ""
        parts.append(f'<p class="verdict"><b>Measured.</b> {escape(table.verdict)}{badge}</p>')
    if table.notes:
        parts.append(f'<p class="notes">{escape(table.notes)}</p>')
    for fig in saved:
        parts.append(f'<figure><img alt="{escape(fig.name)}" src="data:image/png;base64,{fig.png_base64}">'
                     f'<figcaption>{escape(fig.name)} (<a href="{escape(fig.path)}">{escape(fig.path)}</a>)'
                     "</figcaption></figure>")
    return "\n".join(parts)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
