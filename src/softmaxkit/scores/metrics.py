r"""Threshold-free OOD / failure-detection metrics, exact with ties.

Convention, everywhere in :mod:`softmaxkit.scores`: **in-distribution is the positive
class, and a higher score means more in-distribution.** A detector accepts an input
when its score is ``>= t``. Scores whose natural direction is the other way (entropy,
distances) are negated first.

* :func:`auroc`: area under the ROC curve = :math:`P(s_{in} > s_{out}) + \tfrac12 P(s_{in} = s_{out})`.
* :func:`aupr`: average precision. ``positive="in"`` (AUPR-In): in-distribution is
  positive, ranked by the score; ``positive="out"`` (AUPR-Out): OOD is positive, ranked
  by the *negated* score.
* :func:`fpr_at_tpr`: the fraction of OOD accepted at the highest threshold that
  accepts at least a fraction ``tpr`` of in-distribution inputs (FPR@95TPR for 0.95).

These equal scikit-learn's ``roc_auc_score``, ``average_precision_score`` and the FPR of
the first point of ``roc_curve(..., drop_intermediate=False)`` whose TPR reaches ``tpr``,
with labels 1 = in-distribution. Inputs are 1-d tensors, arrays or sequences; NaN is
rejected, ``+-inf`` ranks as expected.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from ._inputs import as_score_array

AUPR_POSITIVES = ("in", "out")


def auroc(scores_in, scores_out) -> float:
    r"""Area under the ROC curve, in-distribution positive (Mann-Whitney with half ties).

    .. math:: \mathrm{AUROC} = \frac{1}{n_{in} n_{out}} \sum_{i, j}
              \bigl[\mathbb 1(s^{in}_i > s^{out}_j) + \tfrac12 \mathbb 1(s^{in}_i = s^{out}_j)\bigr]

    Counted exactly in integers (one division at the end).
    """
    s_in = as_score_array(scores_in, "scores_in")
    s_out = np.sort(as_score_array(scores_out, "scores_out"))
    below = np.searchsorted(s_out, s_in, side="left").astype(np.int64)
    at_or_below = np.searchsorted(s_out, s_in, side="right").astype(np.int64)
    twice_wins = int((below + at_or_below).sum())   # 2 * (#greater) + (#equal)
    return twice_wins / (2 * len(s_in) * len(s_out))


def aupr(scores_in, scores_out, positive: str = "in") -> float:
    r"""Area under the precision-recall curve as average precision.

    .. math:: \mathrm{AP} = \sum_k (R_k - R_{k-1})\, P_k

    over the distinct thresholds in decreasing order (tied scores enter together), with
    :math:`R_0 = 0`. ``positive="in"``: AUPR-In (in-distribution positive, ranked by score);
    ``positive="out"``: AUPR-Out (OOD positive, ranked by ``-score``).
    """
    s_in = as_score_array(scores_in, "scores_in")
    s_out = as_score_array(scores_out, "scores_out")
    if positive == "in":
        return _average_precision(s_in, s_out)
    if positive == "out":
        return _average_precision(-s_out, -s_in)
    raise ValueError(f"positive must be one of {', '.join(map(repr, AUPR_POSITIVES))}, got {positive!r}")


def _average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    scores = np.concatenate([pos, neg])
    is_pos = np.concatenate([np.ones(len(pos), np.int64), np.zeros(len(neg), np.int64)])
    order = np.argsort(-scores, kind="stable")
    scores, is_pos = scores[order], is_pos[order]
    group_end = np.flatnonzero(np.r_[scores[1:] != scores[:-1], True])
    tp = np.cumsum(is_pos)[group_end]
    seen = group_end + 1
    precision = tp / seen
    new_tp = np.diff(np.r_[0, tp])
    return float(np.sum(new_tp * precision) / len(pos))


def fpr_at_tpr(scores_in, scores_out, tpr: float = 0.95) -> float:
    r"""False-positive rate at the threshold that first reaches true-positive rate ``tpr``.

    The threshold is the :math:`k`-th largest in-distribution score, :math:`k` the smallest
    integer with :math:`k / n_{in} \ge` ``tpr``; the result is the fraction of OOD scores
    ``>=`` it. Ties are accepted together (any lower FPR would need a threshold that
    splits a tie, which no detector can do).
    """
    if isinstance(tpr, bool) or not isinstance(tpr, Real) or not 0 < tpr <= 1:
        raise ValueError(f"tpr must be a number in (0, 1], got {tpr!r}")
    s_in = np.sort(as_score_array(scores_in, "scores_in"))[::-1]
    s_out = np.sort(as_score_array(scores_out, "scores_out"))
    threshold = s_in[least_count(tpr, len(s_in)) - 1]
    accepted = len(s_out) - np.searchsorted(s_out, threshold, side="left")
    return float(accepted / len(s_out))


def least_count(fraction: float, n: int) -> int:
    """The least ``k`` in ``[1, n]`` with ``k / n >= fraction`` as floating point has it
    (``ceil(fraction * n)`` alone is one too many where the product rounds up:
    0.07 x 10^7 = 700000.0000000001)."""
    k = min(max(math.ceil(fraction * n), 1), n)
    while k > 1 and (k - 1) / n >= fraction:
        k -= 1
    while k < n and k / n < fraction:
        k += 1
    return k


def ood_metrics(scores_in, scores_out, tpr: float = 0.95) -> dict[str, float]:
    """``{"auroc", "aupr_in", "aupr_out", "fpr_at_tpr"}`` in one call."""
    return {
        "auroc": auroc(scores_in, scores_out),
        "aupr_in": aupr(scores_in, scores_out, "in"),
        "aupr_out": aupr(scores_in, scores_out, "out"),
        "fpr_at_tpr": fpr_at_tpr(scores_in, scores_out, tpr),
    }
