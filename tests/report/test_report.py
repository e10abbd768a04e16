"""The report: valid HTML holding every table that ran, skipped/failed producers with the reason,
results.json with every table and the machine header, plots embedded and written beside it."""

import json
from html.parser import HTMLParser

import pytest

from softmaxkit.report import build_report
from softmaxkit.report.progress import progress

from . import fakes

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr", "area", "base", "embed", "track"}


class StrictParser(HTMLParser):
    """Fails on unbalanced tags; collects text, tags and image sources."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.text, self.images, self.tags = [], [], [], [], []
        self.doctype = None

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(path):
    parser = StrictParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


@pytest.fixture
def report(tmp_path, monkeypatch):
    suites, tasks = fakes.install(monkeypatch)
    index = build_report(tmp_path / "out", quick=True, suites=suites, tasks=tasks, seed=3, show_progress=False)
    return index


def test_report_is_valid_html(report):
    parser = parse(report)
    assert parser.doctype.lower() == "doctype html"
    assert parser.errors == [] and parser.stack == []
    assert parser.tags[0] == "html" and {"head", "title", "body", "table"} <= set(parser.tags)


def test_report_contains_every_table_and_reason(report):
    text = " ".join(parse(report).text)
    for title in ("fake bench table", "second fake bench table", "fake arena table seed=3 quick=True"):
        assert title in text
    assert "a<b" in text and "fake notes & more" in text and "fake claim <b>" in text  # escaped, not markup
    assert "fake claim tested" in text and "fake verdict" in text
    assert "module softmaxkit.bench.ghostbench does not exist" in text
    assert "module softmaxkit.arena.ghosttask does not exist" in text
    assert "RuntimeError: boom in fake task" in text
    assert "the subject is being written" in text


def test_report_embeds_and_writes_plots(report):
    images = parse(report).images
    # the fake bench and arena plots, and a ratio chart for the bench table that came without one
    assert len(images) == 3 and all(src.startswith("data:image/png;base64,") for src in images)
    pngs = sorted((report.parent / "figures").glob("*.png"))
    assert len(pngs) == 3 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert any("second-fake-bench-table-ratios" in p.name for p in pngs)


def test_results_json_has_every_table_and_the_machine(report):
    results = json.loads((report.parent / "results.json").read_text())
    assert {"cpu", "threads", "torch", "numba"} <= set(results["machine"])
    status = {(o["kind"], o["name"]): o["status"] for o in results["outcomes"]}
    assert status == {("bench", "fakebench"): "ok", ("bench", "ghostbench"): "skipped",
                      ("arena", "fakeok"): "ok", ("arena", "fakebroken"): "failed",
                      ("arena", "fakeunfinished"): "skipped", ("arena", "ghosttask"): "skipped"}
    fake = next(o for o in results["outcomes"] if o["name"] == "fakebench")
    assert fake["tables"][0]["rows"] == [["a<b", 1.25], ["c", 0.5]]
    assert fake["tables"][0]["figures"][0].startswith("figures/")
    broken = next(o for o in results["outcomes"] if o["name"] == "fakebroken")
    assert broken["claim"] == "broken claim" and "boom" in broken["tables"][0]["skipped"]


def test_progress_without_tqdm_prints_plainly(monkeypatch, capsys):
    from softmaxkit.report import progress as module

    monkeypatch.setattr(module, "_tqdm", None)
    assert list(progress(range(5), desc="work")) == [0, 1, 2, 3, 4]
    err = capsys.readouterr().err
    assert "work: 0/5" in err and "work: done" in err


def test_tables_md_has_every_table(report):
    text = (report.parent / "tables.md").read_text()
    assert "**fake bench table**" in text and "| a<b | 1.25 |" in text
    assert "_skipped: not installed yet: module softmaxkit.arena.ghosttask does not exist_" in text
