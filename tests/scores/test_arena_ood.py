"""The worked example (arena task ``ood``) in quick mode: it runs and its tables are sound."""

import sys

import pytest

from softmaxkit.arena import ood

pytest.importorskip("sklearn.datasets")


def test_quick_run_tables():
    ood_table, calibration, cascade = ood.run(quick=True, seed=0)
    assert ood_table.rows and ood_table.verdict and ood_table.claim
    names = [row[0] for row in ood_table.rows]
    assert names[0] == "MSP" and any(n.startswith("ODIN") for n in names) and any("Mahalanobis" in n for n in names)
    for row in ood_table.rows:
        assert all(0.0 <= v <= 1.0 for v in row[1:])
    # the digits 0-4 classifier separates digits 5-9 far better than chance with MSP
    assert ood_table.rows[0][1] > 0.75
    assert len(calibration.rows) == 2 and calibration.rows[0][0] == "T = 1"
    assert calibration.figures and calibration.figures[0][0] == "reliability diagram"
    last, optimal = cascade.rows[0], cascade.rows[1]
    assert last[-1] == 0.0 and 0.0 <= optimal[-1] < 1.0
    assert optimal[2] >= last[2] - ood.DELTA - 1e-12     # the budget holds on the calibration split


def test_skipped_without_sklearn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)   # import now raises ImportError
    (table,) = ood.run(quick=True)
    assert table.skipped and "scikit-learn" in table.skipped
