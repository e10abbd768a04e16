"""The kernel benchmark's tables are well formed (tiny shapes; no assertion on time)."""

import math

import pytest
import torch

from softmaxkit.bench import kernels as bench


def test_tables_on_tiny_shapes():
    tables = [bench.softmax_table([(4, 256)]), bench.log_softmax_and_backward_table([(4, 256)]),
              bench.topk_table([(2, 300)]), bench.sparse_table([(2, 64)]), bench.preallocated_table([(4, 256)])]
    for table in tables:
        assert table.skipped is None and table.rows
        for row in table.rows:
            assert len(row) == len(table.columns)
            assert all(math.isfinite(v) and v > 0 for v in row if isinstance(v, float))
    assert [row[1] for row in tables[3].rows] == ["sparsemax", "entmax15", "entmax alpha=1.3"]


def test_bench_dispatch_quick_runs(monkeypatch, capsys):
    """``softmaxkit bench dispatch --quick``: the grid and the page-fault table come out
    well formed, with a status computed from their numbers (no assertion on time)."""
    from softmaxkit._table import VERDICTS
    from softmaxkit.bench import dispatch as bench_dispatch
    from softmaxkit.cli import main

    tables = bench_dispatch.run(quick=True)
    grid, thp = tables
    assert len(grid.rows) == (len(bench_dispatch.QUICK_SHAPES) * len(bench_dispatch.OPS)
                              * len(bench_dispatch.PASSES) * len(bench_dispatch.DTYPES))
    assert grid.status in VERDICTS and grid.claim and grid.verdict
    for row in grid.rows:
        assert row[8] in ("aten", "numba", "reference", "triton")
        assert all(math.isfinite(v) and v > 0 for v in row if isinstance(v, float))
    assert len(thp.rows) == 1 and "THP_MEM_ALLOC_ENABLE=1" in thp.notes
    monkeypatch.setattr(bench_dispatch, "run", lambda quick=False: tables)
    assert main(["bench", "dispatch", "--quick"]) == 0
    assert "sk (auto backend) against torch and the numba kernel" in capsys.readouterr().out


def test_bench_dispatch_on_cuda_skips_without_a_gpu_and_its_grid_is_well_formed(monkeypatch):
    """``bench dispatch --device cuda``: without a GPU one skipped table with the reason; its grid
    run on CPU tensors (the Triton kernels interpreted) has a row per cell, auto's choice, and
    no kernel time for log-sum-exp (no Triton kernel)."""
    pytest.importorskip("triton")
    from softmaxkit.bench import dispatch as bench_dispatch
    from softmaxkit.bench import dispatch_gpu

    if not torch.cuda.is_available():
        (table,) = bench_dispatch.run(quick=True, device="cuda")
        assert table.skipped and "CUDA" in table.skipped
    monkeypatch.setattr(dispatch_gpu, "DEVICE", "cpu")
    monkeypatch.setattr(dispatch_gpu, "QUEUE", 1)
    grid = dispatch_gpu.grid_table([("vocab", (2, 64))], repeats=1, budget=0.0)
    assert len(grid.rows) == len(dispatch_gpu.OPS) * len(dispatch_gpu.PASSES) * len(dispatch_gpu.DTYPES)
    for row in grid.rows:
        assert len(row) == len(grid.columns)
        assert math.isnan(row[6]) == (row[2] == "logsumexp")
        assert all(v > 0 for v in (row[5], row[7], row[8]))
    assert grid.claim and grid.verdict and grid.status


def test_crossovers_pool_runs_per_shape_and_name_known_cells(monkeypatch):
    """``--crossovers --runs 2``: a row per run and shape; the win rule sees each shape once,
    as the median of its runs (here forced: the kernel's ratios 0.5 then 2.0 give 1.25,
    a loss, where either run alone would decide the other way)."""
    from softmaxkit.bench import dispatch as bench_dispatch
    from softmaxkit.kernels import dispatch

    cells = len(bench_dispatch.OPS) * len(bench_dispatch.PASSES) * len(bench_dispatch.DTYPES)
    timings = iter([(1.0, 0.5)] * cells + [(1.0, 2.0)] * cells)   # run 1, then run 2
    monkeypatch.setattr(bench_dispatch, "interleaved_times", lambda fns, repeats: next(timings))
    shapes = [("vocab", (2, 4096))]
    table, wins = bench_dispatch.crossovers(threads=(1,), repeats=1, shapes=shapes, runs=2)
    assert len(table.rows) == 2 * cells and {row[0] for row in table.rows} == {1, 2}
    assert wins == frozenset()   # every cell: ratios 0.5 (run 1) or 2.0 (run 2) -> median 1.25
    timings = iter([(1.0, 0.5)] * 1000)
    table, wins = bench_dispatch.crossovers(threads=(1,), repeats=1, shapes=shapes, runs=2)
    assert len(wins) == cells and all(key[3] == dispatch.shape_class(2, 4096) for key in wins)


def test_crossovers_measure_only_the_passes_asked_for(monkeypatch):
    from softmaxkit.bench import dispatch as bench_dispatch

    monkeypatch.setattr(bench_dispatch, "interleaved_times", lambda fns, repeats: (1.0, 0.5))
    table, wins = bench_dispatch.crossovers(threads=(1,), repeats=1, shapes=[("vocab", (2, 4096))],
                                            passes=("fwd+bwd",))
    assert {row[6] for row in table.rows} == {"fwd+bwd"}
    assert wins and {key[2] for key in wins} == {"fwd+bwd"}


def test_crossovers_time_aten_as_auto_runs_it():
    """The crossovers' aten side is ``auto`` with no kernel win (the lane's checks and huge
    pages included); the table and the long-row rule come back afterwards, also on error."""
    from softmaxkit.bench import dispatch as bench_dispatch
    from softmaxkit.kernels import dispatch
    long_row = torch.zeros(1, dispatch.LONG_FLOAT32_ROW)
    assert dispatch._numba_wins("softmax", long_row)
    with pytest.raises(RuntimeError):
        with bench_dispatch._aten_lanes():
            assert not dispatch._numba_wins("softmax", long_row)
            assert not dispatch._numba_wins("logsumexp", torch.zeros(64, 4096))
            raise RuntimeError
    assert dispatch._numba_wins("softmax", long_row)


def test_dispatch_cell_over_the_limit_is_measured_again(monkeypatch):
    """A cell whose auto time is over the limit is measured again (at most REMEASURES more
    times, stopping once within) and each callable keeps its fastest time; a cell within the
    limit is measured once; a cell where auto stays slower is measured REMEASURES + 1 times."""
    from softmaxkit.bench import dispatch as bench_dispatch

    x = torch.randn(2, 64)
    calls = []

    def fake(times):
        it = iter(times)

        def timed(fns, repeats, budget=None):
            calls.append(len(fns))
            return next(it)
        return timed

    monkeypatch.setattr(bench_dispatch, "interleaved_times", fake([(1.0, 2.0, 1.5), (1.2, 0.9, 0.93)]))
    assert bench_dispatch._cell_times("softmax", x, "fwd", 1, None) == [1.0, 0.9, 0.93]
    assert calls == [3, 3]
    calls.clear()
    monkeypatch.setattr(bench_dispatch, "interleaved_times", fake([(1.0, 2.0, 1.02)]))
    assert bench_dispatch._cell_times("softmax", x, "fwd", 1, None) == [1.0, 2.0, 1.02]
    assert calls == [3]
    calls.clear()
    slower = [(1.0, 2.0, 1.3), (0.9, 2.0, 1.2), (1.1, 1.9, 1.25), (0.1, 0.1, 0.1)]
    monkeypatch.setattr(bench_dispatch, "interleaved_times", fake(slower))
    assert bench_dispatch.REMEASURES == 2
    assert bench_dispatch._cell_times("softmax", x, "fwd", 1, None) == [0.9, 1.9, 1.2]
    assert calls == [3, 3, 3]
