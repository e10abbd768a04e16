"""Jobs of the training tasks run on worker processes and come back in order."""

import operator

import torch

from softmaxkit.arena._runtime import machine_threads, map_jobs


def test_map_jobs_in_process_restores_threads():
    before = torch.get_num_threads()
    assert map_jobs(operator.add, [(1, 2), (3, 4)], desc="t", workers=1, show_progress=False) == [3, 7]
    assert torch.get_num_threads() == before


def test_map_jobs_on_two_processes_keeps_order():
    jobs = [(i, 10) for i in range(5)]
    assert map_jobs(operator.mul, jobs, desc="t", workers=2, show_progress=False) == [0, 10, 20, 30, 40]


def test_machine_threads_is_positive():
    assert machine_threads() >= 1


def test_why_skipped_tells_unfinished_from_broken():
    from softmaxkit.arena._runtime import cell_for, why_skipped

    assert why_skipped(NotImplementedError("being written")) == "not implemented yet: being written"
    broken = why_skipped(TypeError("bad call\nmore detail"))
    assert broken == "failed: TypeError: bad call"
    assert cell_for(broken) == "failed" and cell_for("not implemented yet: x") == "skipped"
