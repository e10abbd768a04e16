"""``softmaxkit bench attention --quick`` runs and fills its tables (timings are never asserted)."""

import pytest

import softmaxkit as sk
from softmaxkit._table import VERDICTS
from softmaxkit.bench import attention as bench


@pytest.mark.slow
def test_quick_bench_smoke():
    name = next(s.name for s in sk.normalizers() if s.family == "elementwise")
    time_table, memory_table = bench.run(quick=True, names=[name], repeats=1)
    paths = [row[3] for row in time_table.rows]
    assert {"fused", "streaming", "dense"} <= set(paths)
    assert [row[4] for row in time_table.rows].count("auto") == 1
    assert all(isinstance(row[5], float) and row[5] > 0 for row in time_table.rows)
    assert time_table.status == "not testable" and memory_table.status == "not testable"
    assert time_table.status in VERDICTS and time_table.verdict
    assert len(memory_table.rows) == 1 and memory_table.rows[0][3] > 0
