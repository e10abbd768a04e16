"""Producers of result tables: missing, unfinished, broken and odd ones are reported, never dropped."""

import sys
import types

from softmaxkit._plugins import run
from softmaxkit._table import Table


def _module(monkeypatch, name, **attrs):
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def _raise(err):
    def call(module):
        raise err
    return call


def test_missing_module_is_skipped():
    outcome = run("arena", "x", "softmaxkit.arena.surely_not_here", lambda m: m.run())
    assert outcome.status == "skipped" and "does not exist" in outcome.reason
    assert outcome.tables[0].title == "arena x" and outcome.tables[0].skipped == outcome.reason


def test_module_whose_own_import_fails_names_the_missing_dependency(monkeypatch, tmp_path):
    (tmp_path / "fake_plugin_halfway.py").write_text("import surely_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    outcome = run("arena", "halfway", "fake_plugin_halfway", lambda m: m.run())
    assert outcome.status == "skipped"
    assert outcome.reason == "cannot import fake_plugin_halfway: No module named 'surely_missing_dependency_xyz'"


def test_missing_dependency_at_run_time_is_skipped(monkeypatch):
    name = _module(monkeypatch, "fake_plugin_dep", CLAIM="a claim")
    outcome = run("arena", "dep", name, _raise(ModuleNotFoundError("No module named 'matplotlib'")))
    assert outcome.status == "skipped" and outcome.reason == "missing dependency: No module named 'matplotlib'"
    assert outcome.claim == "a claim" and outcome.tables[0].claim == "a claim"


def test_errors_fail_and_bad_return_values_fail(monkeypatch):
    name = _module(monkeypatch, "fake_plugin_bad")
    outcome = run("bench", "bad", name, _raise(ValueError("wrong shape")))
    assert outcome.status == "failed" and outcome.reason == "failed: ValueError: wrong shape"
    outcome = run("bench", "bad", name, lambda m: ["not a table"])
    assert outcome.status == "failed" and "returned str, not Table" in outcome.reason


def test_a_single_table_is_accepted(monkeypatch):
    name = _module(monkeypatch, "fake_plugin_one")
    outcome = run("bench", "one", name, lambda m: Table(title="t", columns=["a"], rows=[[1]]))
    assert outcome.status == "ok" and [t.title for t in outcome.tables] == ["t"]
    assert outcome.to_dict()["tables"][0]["rows"] == [[1]]


def test_a_producer_whose_every_table_is_skipped_is_reported_skipped(monkeypatch):
    """Audit 2026-12-02: `bench attention --device cuda` without a GPU printed "ok" above a table
    that said "skipped: no CUDA device"."""
    import types

    from softmaxkit import _plugins
    from softmaxkit._table import Table

    module = types.ModuleType("fake_producer")
    module.run = lambda: [Table("t", [], skipped="no CUDA device")]
    monkeypatch.setattr(_plugins, "load", lambda name: (module, None))
    outcome = _plugins.run("bench", "fake", "fake_producer", lambda m: m.run())
    assert outcome.status == _plugins.SKIPPED and outcome.reason == "no CUDA device"
