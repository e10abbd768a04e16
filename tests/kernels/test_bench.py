"""The kernel benchmark's tables are well formed (tiny shapes; no assertion on time)."""

import math

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
