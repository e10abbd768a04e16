"""The softmaxkit command: help everywhere, list, bench, arena and report at tiny sizes."""

import json

import pytest

from softmaxkit import registry
from softmaxkit.cli import main

from .report import fakes


@pytest.mark.parametrize("argv", [["--help"], ["list", "--help"], ["bench", "--help"], ["arena", "--help"],
                                  ["report", "--help"]])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: softmaxkit" in capsys.readouterr().out


def test_list_prints_every_normalizer_aligned(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("name "))
    rows = lines[header + 2: header + 2 + len(registry.names())]
    assert [row.split()[0] for row in rows] == registry.names()
    column = lines[header].index("definition")
    assert all(row[column - 2: column] == "  " for row in rows)  # every row breaks at the same column


def test_unknown_names_are_usage_errors(capsys):
    for argv in (["bench", "nosuch"], ["arena", "nosuch"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert "nosuch" in capsys.readouterr().err


def test_bench_reports_missing_suite_as_skipped(monkeypatch, capsys):
    fakes.install(monkeypatch)
    assert main(["bench", "all", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "machine: cpu=" in out and "fake bench table" in out
    assert "bench ghostbench: skipped" in out and "softmaxkit.bench.ghostbench does not exist" in out


def test_arena_exit_status_reflects_failures(monkeypatch, capsys):
    fakes.install(monkeypatch)
    assert main(["arena", "fakeok", "fakeunfinished", "--quick", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "fake arena table seed=5 quick=True" in out and "arena fakeunfinished: skipped" in out
    assert main(["arena", "fakebroken"]) == 1


def test_report_writes_html_and_json(monkeypatch, tmp_path, capsys):
    fakes.install(monkeypatch)
    out = tmp_path / "rep"
    assert main(["report", "--quick", "--out", str(out), "--arena", "fakeok", "ghosttask"]) == 0
    assert (out / "index.html").is_file()
    results = json.loads((out / "results.json").read_text())
    assert [o["name"] for o in results["outcomes"]] == ["fakebench", "ghostbench", "fakeok", "ghosttask"]
    assert results["meta"]["quick"] is True
    assert "wrote" in capsys.readouterr().out


def test_report_without_bench(monkeypatch, tmp_path):
    fakes.install(monkeypatch)
    assert main(["report", "--out", str(tmp_path), "--bench", "--arena", "fakeok"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [o["name"] for o in results["outcomes"]] == ["fakeok"]
