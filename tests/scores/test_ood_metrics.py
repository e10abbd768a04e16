"""auroc / aupr / fpr_at_tpr against scikit-learn (test oracle) and by hand."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softmaxkit.scores import aupr, auroc, fpr_at_tpr, ood_metrics

metrics = pytest.importorskip("sklearn.metrics")


def _oracle(s_in, s_out, tpr=0.95):
    y = np.r_[np.ones(len(s_in)), np.zeros(len(s_out))]
    s = np.r_[s_in, s_out]
    fpr, tprs, _ = metrics.roc_curve(y, s, drop_intermediate=False)
    return (metrics.roc_auc_score(y, s), metrics.average_precision_score(y, s),
            metrics.average_precision_score(1 - y, -s), fpr[np.searchsorted(tprs, tpr, side="left")])


def _cases():
    rng = np.random.default_rng(0)
    for n_in, n_out in [(1, 1), (7, 3), (100, 250), (333, 77)]:
        a, b = rng.normal(size=n_in), rng.normal(size=n_out) - 0.7
        yield a, b                                          # continuous
        yield np.round(a * 2) / 2, np.round(b * 2) / 2      # heavily tied
        yield rng.integers(0, 3, n_in).astype(float), rng.integers(0, 3, n_out).astype(float)  # 3 values
    yield np.zeros(10), np.zeros(20)                        # all tied


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("tpr", [0.95, 0.5, 1.0, 0.3333])
def test_metrics_equal_sklearn(case, tpr):
    a, b = case
    want_auc, want_ap_in, want_ap_out, want_fpr = _oracle(a, b, tpr)
    assert abs(auroc(a, b) - want_auc) <= 1e-9
    assert abs(aupr(a, b) - want_ap_in) <= 1e-9
    assert abs(aupr(a, b, positive="out") - want_ap_out) <= 1e-9
    assert abs(fpr_at_tpr(a, b, tpr) - want_fpr) <= 1e-9


def test_metrics_by_hand():
    s_in, s_out = [3.0, 2.0, 1.0], [2.0, 0.0]
    # pairs: (3,2) win (3,0) win (2,2) tie (2,0) win (1,2) loss (1,0) win -> 4.5 / 6
    assert auroc(s_in, s_out) == 0.75
    # ranking: 3(in) | 2(in),2(out) tied | 1(in) | 0(out)
    # thresholds: 3 -> P=1, R=1/3 ; 2 -> P=2/3, R=2/3 ; 1 -> P=3/4, R=1
    assert aupr(s_in, s_out) == pytest.approx(1 / 3 * 1 + 1 / 3 * 2 / 3 + 1 / 3 * 3 / 4)
    # TPR 2/3 first reached at threshold 2, which accepts one of two OOD
    assert fpr_at_tpr(s_in, s_out, tpr=0.6) == 0.5
    assert fpr_at_tpr(s_in, s_out, tpr=1.0) == 0.5
    assert fpr_at_tpr(s_in, s_out, tpr=0.3) == 0.0
    assert auroc([1.0], [0.0]) == 1.0 and auroc([0.0], [1.0]) == 0.0
    # infinities rank like any other value (scikit-learn rejects them, so by hand)
    assert auroc([1.0, np.inf], [-np.inf, 1.0]) == 0.875  # 3 wins + 1 tie of 4
    assert fpr_at_tpr([1.0, np.inf], [-np.inf, 1.0], tpr=1.0) == 0.5
    m = ood_metrics(torch.tensor(s_in), torch.tensor(s_out), tpr=0.6)
    assert m["auroc"] == 0.75 and m["fpr_at_tpr"] == 0.5


def test_inputs_accepted_and_rejected():
    t = torch.tensor([0.2, 0.9], dtype=torch.float16)
    assert auroc(t, np.array([0.1])) == 1.0
    with pytest.raises(ValueError, match="scores_in"):
        auroc([], [1.0])
    with pytest.raises(ValueError, match="scores_out"):
        auroc([1.0], [[1.0, 2.0]])
    with pytest.raises(ValueError, match="NaN"):
        aupr([np.nan], [1.0])
    with pytest.raises(ValueError, match="positive"):
        aupr([1.0], [0.0], positive="both")
    with pytest.raises(ValueError, match="tpr"):
        fpr_at_tpr([1.0], [0.0], tpr=0.0)
    with pytest.raises(TypeError, match="scores_in"):
        auroc(["a"], [0.0])

_small_ints = st.lists(st.integers(-3, 3), min_size=1, max_size=40)


@settings(deadline=None, max_examples=40, derandomize=True)
@given(_small_ints, _small_ints, st.sampled_from([0.05, 0.5, 0.9, 0.95, 1.0]))
def test_metrics_equal_sklearn_on_random_ties(a, b, tpr):
    a, b = np.asarray(a, float), np.asarray(b, float)
    want_auc, want_ap_in, want_ap_out, want_fpr = _oracle(a, b, tpr)
    assert abs(auroc(a, b) - want_auc) <= 1e-9
    assert abs(aupr(a, b) - want_ap_in) <= 1e-9
    assert abs(aupr(a, b, positive="out") - want_ap_out) <= 1e-9
    assert abs(fpr_at_tpr(a, b, tpr) - want_fpr) <= 1e-9


def test_strings_none_and_tensors_without_values_are_refused_by_name():
    """Hostile sweep: ["0.9"] was read as 0.9 (numpy parses the string), None was "must be 1-d, got
    shape ()", and a meta tensor raised NotImplementedError from the copy."""
    for bad in (["0.9", "0.1"], np.array(["0.9"]), None):
        with pytest.raises(TypeError, match="scores_in"):
            auroc(bad, [0.0])
        with pytest.raises(TypeError, match="scores_out"):
            fpr_at_tpr([1.0], bad)
    with pytest.raises((TypeError, ValueError), match="scores_out"):   # (OverflowError before)
        auroc([1.0], [10 ** 400])
    with pytest.raises(ValueError, match="scores_in must hold values"):
        aupr(torch.empty(3, device="meta"), [0.0])
    assert auroc(np.array([True, False]), [0.5]) == 0.5   # (bool and integer arrays are numbers)
    assert auroc(np.array([2, 0], dtype=np.uint8), [1]) == 0.5
