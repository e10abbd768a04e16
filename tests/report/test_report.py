"""The report: valid HTML that opens with the verdicts and the headline speed, holds every table
that ran and skipped/failed producers with the reason; results.json with a schema version, every
table, each figure's noise and the machine description; plots embedded and written beside it."""

import json
from html.parser import HTMLParser

import pytest

from softmaxkit._table import VERDICTS
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
        self.ids, self.links, self.h2 = [], [], []
        self.verdict_rows, self._cells, self._in_h2 = [], None, False

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        if tag == "tr" and attrs.get("class") == "verdict-row":
            self._cells = []
            self.verdict_rows.append(self._cells)
        if tag == "td" and self._cells is not None:
            self._cells.append("")
        self._in_h2 = tag == "h2"
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag == "tr":
            self._cells = None
        if tag == "h2":
            self._in_h2 = False
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self._cells:
            self._cells[-1] += data
        if self._in_h2:
            self.h2.append(data)


def parse(path):
    parser = StrictParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


@pytest.fixture
def report(tmp_path, monkeypatch):
    suites, tasks = fakes.install(monkeypatch)
    index = build_report(tmp_path / "out", quick=True, suites=suites, tasks=tasks, seed=3, show_progress=False,
                         gpu=False)
    return index


def test_report_is_valid_html(report):
    parser = parse(report)
    assert parser.doctype.lower() == "doctype html"
    assert parser.errors == [] and parser.stack == []
    assert parser.tags[0] == "html" and {"head", "title", "body", "table"} <= set(parser.tags)
    assert len(parser.ids) == len(set(parser.ids)), "duplicate ids"
    assert set(parser.links) <= set(parser.ids), "a link points nowhere"


def test_report_opens_with_verdicts_then_headline_speed(report):
    assert parse(report).h2[:2] == ["Verdicts", "Headline speed"]


def test_verdict_table_has_one_row_per_claim_each_with_one_of_four_verdicts(report):
    results = json.loads((report.parent / "results.json").read_text())
    claims = [t["claim"] for o in results["outcomes"] for t in o["tables"] if t["claim"]]
    rows = parse(report).verdict_rows
    assert len(rows) == len(claims) == 4
    assert sorted(r[0] for r in rows) == sorted(claims)
    assert all(r[3] in VERDICTS for r in rows)
    by_claim = {(r[0], r[3]) for r in rows}
    assert ("fake claim <b>", "held") in by_claim and ("fake claim <b>", "partly") in by_claim
    assert ("broken claim", "not testable") in by_claim          # the producer failed: with its reason
    assert any("boom in fake task" in r[2] for r in rows if r[0] == "broken claim")
    target = next(r for r in rows if r[0].startswith("Target (issue 99)"))
    assert target[1] == "softmaxkit target (issue 99)" and target[3] == "did not hold"
    assert rows[-1] is target  # the project's own targets come after the published claims


def test_headline_speed_names_op_peer_ratio_and_machine(report):
    text = " ".join(parse(report).text)
    assert "softmax forward" in text and "1.6x" in text
    results = json.loads((report.parent / "results.json").read_text())
    assert results["machine"]["cpu"] in text


def test_gpu_part_without_cuda_marks_its_claim_not_testable(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suites, _ = fakes.install(monkeypatch)
    index = build_report(tmp_path / "gpu", quick=True, suites=suites[:1], tasks=["fakeok"], show_progress=False,
                         gpu=True)
    rows = parse(index).verdict_rows
    flash = [r for r in rows if r[0].startswith("FlashSigmoid")]
    assert len(flash) == 1 and flash[0][3] == "not testable" and "no CUDA device" in flash[0][2]
    results = json.loads((index.parent / "results.json").read_text())
    assert results["machine"]["gpu"] == "none"


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
    # the fake bench and arena plots, and ratio charts for the bench tables that came without one
    # (one per quantity: the timed table's speed-up; the second table's "x" column)
    assert len(images) == 4 and all(src.startswith("data:image/png;base64,") for src in images)
    pngs = sorted((report.parent / "figures").glob("*.png"))
    assert len(pngs) == 4 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert any("fake-timed-table-speed-up-vs-torch" in p.name for p in pngs)


def test_results_json_has_every_table_and_the_machine(report):
    results = json.loads((report.parent / "results.json").read_text())
    assert results["schema_version"] == 2
    assert {"cpu", "cores", "logical cpus", "threads", "torch", "numba", "triton", "gpu", "simd"} <= set(results["machine"])
    status = {(o["kind"], o["name"]): o["status"] for o in results["outcomes"]}
    assert status == {("bench", "fakebench"): "ok", ("bench", "ghostbench"): "skipped",
                      ("arena", "fakeok"): "ok", ("arena", "fakebroken"): "failed",
                      ("arena", "fakeunfinished"): "skipped", ("arena", "ghosttask"): "skipped"}
    fake = next(o for o in results["outcomes"] if o["name"] == "fakebench")
    assert fake["tables"][0]["rows"] == [["a<b", 1.25], ["c", 0.5]]
    timed = fake["tables"][1]
    assert timed["noise"][0][:4] == [None, None, 0.02, 0.03]     # labels carry none, timings their spread
    assert timed["noise"][0][4] == pytest.approx((0.02 ** 2 + 0.03 ** 2) ** 0.5)   # a ratio: in quadrature
    assert timed["headline"][0]["ratio"] == 1.6 and timed["headline"][0]["noise"] == pytest.approx(0.036, abs=1e-3)
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


def test_rebuild_renders_the_same_report_from_results_json(report):
    from softmaxkit.report import rebuild

    before = parse(report)
    results = json.loads((report.parent / "results.json").read_text())
    report.write_text("stale")
    assert rebuild(report.parent) == report
    after = parse(report)
    assert after.errors == [] and after.verdict_rows == before.verdict_rows
    assert after.images == before.images and after.ids == before.ids
    again = json.loads((report.parent / "results.json").read_text())
    assert [o["tables"] for o in again["outcomes"]] == [o["tables"] for o in results["outcomes"]]
