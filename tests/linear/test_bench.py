"""`softmaxkit bench linear --quick`: a smoke test (tables, columns, verdict fields); no timing asserted."""

from softmaxkit._table import VERDICTS
from softmaxkit.bench import SUITES, linear


def test_quick_bench_produces_its_tables():
    assert "linear" in SUITES
    tables = linear.run(quick=True)
    titles = [t.title for t in tables]
    assert any("forward: speed-up" in t for t in titles) and any("crossover" in t for t in titles)
    for t in tables:
        assert t.rows and all(len(r) == len(t.columns) for r in t.rows)
        assert t.status is None or t.status in VERDICTS
    fwd = tables[0]
    assert [r[0] for r in fwd.rows] == linear.QUICK_LENGTHS
    assert all(isinstance(x, float) and x > 0 for r in fwd.rows for x in r[1:])
    assert fwd.status == "not testable" and fwd.claim
