"""Runs compared: a doctored copy of a results.json has exactly its doctored figures flagged."""

import copy
import json

import pytest

from softmaxkit.cli import main
from softmaxkit.report import build_report
from softmaxkit.report.compare import (
    K,
    compare,
    compare_files,
    direction,
    load_results,
    render_text,
)

from . import fakes


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    suites, tasks = fakes.install(monkeypatch)
    build_report(tmp_path / "old", quick=True, suites=suites, tasks=tasks, show_progress=False, gpu=False)
    return tmp_path / "old"


def _table(results, producer, title_start):
    outcome = next(o for o in results["outcomes"] if o["name"] == producer)
    return next(t for t in outcome["tables"] if t["title"].startswith(title_start))


def doctor(results):
    """Change some figures beyond their noise, some within it; return the copy and the expected flags."""
    new = copy.deepcopy(results)
    timed = _table(new, "fakebench", "fake timed table")
    noise = timed["noise"]
    # beyond: kernel ms of 64x64 up by 10 noises (slower: a regression), speed-up of 1024x1024 up (better)
    timed["rows"][0][3] *= 1 + 10 * K * noise[0][3] / 3
    timed["rows"][2][4] *= 1 + 2 * K * noise[2][4]
    # within: torch ms of 256x256 by half the threshold; kernel ms of 1024x1024 by a third
    timed["rows"][1][2] *= 1 + 0.5 * K * noise[1][2]
    timed["rows"][2][3] *= 1 - 0.3 * K * noise[2][3]
    # an arena figure (fixed seeds: deterministic) and a verdict
    arena = _table(new, "fakeok", "fake arena table")
    arena["rows"][1][1] = 0.51
    arena["status"] = "did not hold"
    expected = {("fake timed table", "64x64, softmax", "kernel ms"),
                ("fake timed table", "1024x1024, softmax", "speedup vs torch"),
                (arena["title"], "c", "ratio")}
    return new, expected


def test_doctored_copy_flags_exactly_the_changed_figures(run_dir):
    old = load_results(run_dir)
    new, expected = doctor(old)
    result = compare(old, new)
    assert {(c.table, c.row, c.column) for c in result.changes} == expected
    marks = {(c.row, c.column): c.regression for c in result.changes}
    assert marks[("64x64, softmax", "kernel ms")] is True                  # slower
    assert marks[("1024x1024, softmax", "speedup vs torch")] is False       # faster
    assert [(v.old, v.new, v.regression) for v in result.verdicts] == [("partly", "did not hold", True)]
    assert len(result.regressions) == 2
    # the same run against itself: nothing moved
    same = compare(old, copy.deepcopy(old))
    assert same.changes == [] and same.verdicts == [] and same.compared == result.compared


def test_compare_command_prints_the_moves(run_dir, tmp_path, capsys):
    new, _ = doctor(load_results(run_dir))
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps(new))
    assert main(["compare", str(run_dir), str(doctored)]) == 0
    out = capsys.readouterr().out
    assert "3 moved beyond" in out and "REGRESSION 64x64, softmax | kernel ms" in out
    assert "REGRESSION verdict arena fakeok" in out
    assert out == render_text(compare_files(run_dir, doctored)) + "\n"


def test_report_compare_adds_the_section(run_dir, tmp_path, monkeypatch):
    suites, _ = fakes.install(monkeypatch)
    index = build_report(tmp_path / "new", quick=True, suites=suites, tasks=["fakeok"], show_progress=False,
                         gpu=False, compare_with=run_dir / "results.json")
    html = index.read_text()
    assert '<h2 id="comparison">Compared with an earlier run</h2>' in html
    assert html.index('id="headline"') < html.index('id="comparison"') < html.index("<h2>Run</h2>")
    results = json.loads((index.parent / "results.json").read_text())
    assert results["meta"]["compared with"].endswith("results.json")
    assert "changes" in results["comparison"] and results["comparison"]["only old"]  # tasks not rerun


def test_bad_paths_are_refused_with_the_argument_named(tmp_path):
    with pytest.raises(ValueError, match="no results.json"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="not a softmaxkit results.json"):
        load_results(tmp_path)
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "nowhere"), str(tmp_path)])


@pytest.mark.parametrize("outcomes", [5, ["x"], [{"kind": "bench", "tables": []}], [{"kind": "bench", "name": "a",
                                      "tables": 3}], [{"kind": "bench", "name": "a", "tables": [{"rows": []}]}],
                                      [{"kind": "bench", "name": "a", "tables": [{"title": "t", "rows": [1]}]}],
                                      # hostile sweep: these passed the check and compare raised TypeError
                                      [{"kind": "bench", "name": "a", "tables": [{"title": "t", "rows": [["x", 1.0]],
                                                                                  "noise": [[None, "0.1"]]}]}],
                                      [{"kind": "bench", "name": "a", "tables": [{"title": "t", "rows": [["x", 1.0]],
                                                                                  "noise": [[None, -0.1]]}]}],
                                      [{"kind": "bench", "name": "a", "tables": [{"title": "t", "status": ["held"]}]}],
                                      [{"kind": "bench", "name": "a", "tables": [{"title": "t", "columns": ["x", 5]}]}],
                                      {"machine": 5}])
def test_malformed_results_are_refused_up_front(outcomes, tmp_path, run_dir, capsys):
    """Audit 2026-12-03: a results.json of the wrong shape crashed compare with a TypeError,
    and report --compare only after running its job."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"outcomes": [], **outcomes} if isinstance(outcomes, dict) else {"outcomes": outcomes}))
    with pytest.raises(ValueError, match="not a softmaxkit results.json"):
        load_results(bad)
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(bad), str(run_dir)])
    assert exit_.value.code == 2 and "Traceback" not in capsys.readouterr().err
    load_results(run_dir)   # a real run's results pass


def test_version_1_results_load_and_are_judged_only_where_they_can_be(run_dir):
    new = load_results(run_dir)
    old = copy.deepcopy(new)
    del old["schema_version"]
    for outcome in old["outcomes"]:
        for table in outcome["tables"]:
            table.pop("noise", None)
    old["schema_version"] = 1
    same = compare(load_results(run_dir), new)
    assert same.changes == [] and same.not_judged == 2   # the bench "ratio" figures carry no noise
    result = compare(old, new)   # no noise in the old run: the new run's own noise is used
    assert result.changes == [] and (result.compared, result.not_judged) == (same.compared, same.not_judged)


@pytest.mark.parametrize("column, row, sign", [
    ("speedup vs torch", "", 1), ("speed-up (x)", "", 1), ("kernel ms", "", -1), ("kernel x copy", "", -1),
    ("torch ms", "", 0), ("torch x copy", "", 0), ("fwd / SDPA", "", -1), ("ms", "plain torch: F.cross_entropy", 0),
    ("val loss", "", -1), ("accuracy", "", 1), ("n=16", "", 0), ("ms", "forward, exp-weighted avg_pool", 0),
])
def test_direction(column, row, sign):
    assert direction(column, row) == sign
