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


def _no_run(monkeypatch):
    """Fail the test if the report starts running any benchmark or arena task."""
    from softmaxkit import arena, bench

    def refuse(*args, **kwargs):
        raise AssertionError("the report ran work before checking it could be written")

    monkeypatch.setattr(bench, "run_suite", refuse)
    monkeypatch.setattr(arena, "run_task", refuse)


def test_report_without_matplotlib_stops_before_running(monkeypatch, tmp_path, capsys):
    """A core install (no matplotlib): one line naming the pip command, exit 2, nothing run."""
    import sys

    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` raises ImportError
    out = tmp_path / "rep"
    assert main(["report", "--quick", "--out", str(out), "--arena", "fakeok"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "matplotlib" in err and "pip install 'softmaxkit[report]'" in err
    assert not out.exists()


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_report_out_that_cannot_be_written_is_a_one_line_error(where, monkeypatch, tmp_path, capsys):
    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    regular = tmp_path / "results.txt"
    regular.write_text("keep me\n")
    out = regular if where == "file" else regular / "sub" / "dir"
    assert main(["report", "--quick", "--out", str(out), "--arena", "fakeok"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --out")
    assert str(out) in err and "Traceback" not in captured.err
    assert regular.read_text() == "keep me\n"


def test_report_out_in_a_read_only_directory(monkeypatch, tmp_path, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("root can write into a read-only directory; the path-under-a-file case covers this")
    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["report", "--out", str(locked / "rep"), "--arena", "fakeok"]) == 2
        assert capsys.readouterr().err.strip().startswith("error: --out")
    finally:
        locked.chmod(0o700)


def test_report_out_without_write_permission_simulated(monkeypatch, tmp_path, capsys):
    """The read-only case as root sees it: the write probe is refused (EACCES)."""
    from softmaxkit.report import preflight

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    monkeypatch.setattr(preflight.tempfile, "TemporaryFile", refuse)
    assert main(["report", "--out", str(tmp_path), "--arena", "fakeok"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {str(tmp_path)!r} cannot be written: Permission denied"


def test_report_exit_status_reflects_failures(monkeypatch, tmp_path):
    """Audit 2026-12-02: report exited 0 when a task failed (bench and arena exit 1)."""
    fakes.install(monkeypatch)
    assert main(["report", "--out", str(tmp_path / "a"), "--bench", "--arena", "fakebroken"]) == 1


@pytest.mark.parametrize("argv", [["--bench", "nosuch", "--arena", "fakeok"], ["--bench", "--arena", "nosuch"],
                                  ["--bench", "--arena", "fakeok", "--compare", "/nonexistent/results.json"]])
def test_report_checks_its_arguments_before_creating_out(argv, monkeypatch, tmp_path, capsys):
    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--out", str(out), *argv])
    assert exit_.value.code == 2 and not out.exists()


@pytest.mark.parametrize("command", [["arena", "fakeok"], ["report", "--arena", "fakeok"]])
@pytest.mark.parametrize("seed", ["-1", "x", "1.5", "4294967296", "20000000000000"])
def test_a_seed_that_is_not_a_nonnegative_integer_is_a_usage_error(command, seed, monkeypatch, tmp_path, capsys):
    """Audit 2026-12-03: --seed -1 ran the task, which died in numpy's SeedSequence with a traceback.
    Hostile sweep: --seed 20000000000000 ran arena dispersion, which failed on "Overflow when unpacking
    long long" (seed * 1_000_003 past 2^64 in torch's generator); seeds are now below 2^32."""
    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    out = ["--out", str(tmp_path / "never")] if command[0] == "report" else []
    with pytest.raises(SystemExit) as exit_:
        main([*command, *out, "--seed", seed])
    assert exit_.value.code == 2 and "--seed" in capsys.readouterr().err


def test_report_refuses_an_empty_out(monkeypatch, tmp_path, capsys):
    """An empty --out (an unset shell variable) wrote index.html and results.json into the cwd."""
    fakes.install(monkeypatch)
    _no_run(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--out", "", "--bench", "--arena", "fakeok"]) == 2
    assert "--out is empty" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_python_dash_m_runs_the_command():
    """Hostile sweep: ``python -m softmaxkit`` said "No module named softmaxkit.__main__"."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import softmaxkit

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(softmaxkit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "softmaxkit", "bench", "nosuch"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("softmaxkit: error: ")
    assert "nosuch" in run.stderr and "Traceback" not in run.stderr
