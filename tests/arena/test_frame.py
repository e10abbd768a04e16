"""The arena's task registry: names, order, and missing tasks reported as skipped."""

import pytest

from softmaxkit import arena, bench


def test_every_task_of_the_issue_is_registered():
    assert list(arena.TASKS)[:3] == ["dispersion", "max_retrieval", "tiny_lm"]
    assert {"ood", "soft_nms", "negation"} <= set(arena.TASKS)


def test_check_tasks_expands_all_and_keeps_order_without_duplicates():
    assert arena.check_tasks([]) == list(arena.TASKS)
    assert arena.check_tasks(["tiny_lm", "dispersion", "tiny_lm"]) == ["tiny_lm", "dispersion"]
    assert bench.check_suites(["ops", "all"]) == ["ops"] + [s for s in bench.SUITES if s != "ops"]


def test_unknown_names_list_the_accepted_ones():
    with pytest.raises(ValueError, match="accepted: dispersion, max_retrieval"):
        arena.check_tasks(["nope"])
    with pytest.raises(ValueError, match="accepted: kernels, attention, losses, ops, dispatch, all"):
        bench.check_suites(["nope"])


def test_a_missing_task_module_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setitem(arena.TASKS, "not_written_yet", "placeholder")
    outcome = arena.run_task("not_written_yet")
    assert outcome.status == "skipped"
    assert outcome.reason == "not installed yet: module softmaxkit.arena.not_written_yet does not exist"
    assert outcome.tables[0].skipped == outcome.reason


def test_real_tasks_declare_a_claim():
    from softmaxkit.arena import dispersion, max_retrieval, tiny_lm

    for module in (dispersion, max_retrieval, tiny_lm):
        assert "arXiv" in module.CLAIM
