r"""Distance of a softmax output to its predicted class's centroid in softmax space.

For each class ``c`` the centroid :math:`\bar p_c` is the mean softmax vector over the
*correctly* predicted training samples of class ``c``. A new input with softmax ``p`` and
prediction :math:`\hat y = \arg\max p` gets the distance :math:`\|p - \bar p_{\hat y}\|_2`:
small when its softmax looks like the typical confident, correct output of that class.
Per-class thresholds, fitted on held-out in-distribution data, turn it into an accept /
reject rule whose acceptance rate is controlled per predicted class.
"""

from __future__ import annotations

import warnings
from numbers import Real

import numpy as np
import torch

from .. import functional as F
from .._rows import compute_dtype
from ._inputs import check_labels, check_logits_2d
from .metrics import least_count


def centroid_distance(logits: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    r"""Euclidean distance :math:`\|\mathrm{softmax}(z) - \bar p_{\hat y}\|_2` of each row.

    Args:
        logits: (N, C).
        centroids: (C, C), row ``c`` the centroid of class ``c`` (see :func:`fit_centroids`).

    Returns:
        (N,) distances in the logits' dtype (lower = more in-distribution).
    """
    check_logits_2d(logits)
    c = logits.shape[1]
    if not isinstance(centroids, torch.Tensor) or centroids.shape != (c, c):
        shape = tuple(centroids.shape) if isinstance(centroids, torch.Tensor) else type(centroids).__name__
        raise ValueError(f"centroids must be a tensor of shape ({c}, {c}) for {c} classes, got {shape}")
    p = F.softmax(logits.to(compute_dtype(logits.dtype)))
    # the predicted class read from the logits, as fit_centroids and the thresholds read it: the
    # softmax of two adjacent float logits can round to a tie that argmax breaks the other way
    nearest = centroids.to(p)[logits.detach().argmax(1)]
    return (p - nearest).norm(dim=1).to(logits.dtype)


def fit_centroids(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean softmax over the correctly predicted rows of each class, shape (C, C).

    Raises ``ValueError`` naming the classes that have no correct prediction.
    """
    check_logits_2d(logits)
    y = check_labels(labels, logits.shape[0], logits.shape[1]).to(logits.device)
    p = F.softmax(logits.detach().to(torch.float64))
    correct = logits.detach().argmax(1) == y
    counts = torch.bincount(y[correct], minlength=logits.shape[1])
    if bool((counts == 0).any()):
        missing = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"labels: class(es) {missing} have no correctly predicted sample to define a centroid")
    sums = torch.zeros(logits.shape[1], logits.shape[1], dtype=p.dtype, device=p.device)
    sums.index_add_(0, y[correct], p[correct])
    return sums / counts.unsqueeze(1).to(p.dtype)


class CentroidDistance:
    """Softmax-centroid detector: fit centroids, then per-class distance thresholds.

    Example::

        detector = CentroidDistance().fit(train_logits, train_labels)
        detector.fit_thresholds(heldout_logits, accept=0.95)
        keep = detector.accept(test_logits)          # bool, True = in-distribution
        scores = -detector.distance(test_logits)     # higher = in-distribution
    """

    def __init__(self) -> None:
        self.centroids_: torch.Tensor | None = None
        self.thresholds_: torch.Tensor | None = None

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> CentroidDistance:
        self.centroids_ = fit_centroids(logits, labels)
        self.thresholds_ = None
        return self

    def distance(self, logits: torch.Tensor) -> torch.Tensor:
        if self.centroids_ is None:
            raise RuntimeError("CentroidDistance is not fitted: call fit(logits, labels) first")
        return centroid_distance(logits, self.centroids_)

    def fit_thresholds(self, logits: torch.Tensor, accept: float = 0.95) -> torch.Tensor:
        """Per predicted class, the ``accept``-quantile of held-out in-distribution distances.

        A row predicted as class ``c`` is then accepted when its distance is at most
        ``thresholds_[c]``, so about a fraction ``accept`` of in-distribution rows of each
        predicted class is kept. The threshold is the smallest held-out distance such that
        at least a fraction ``accept`` of the ``n_c`` held-out rows predicted ``c`` lie at or
        below it: ``k`` of them, the least ``k`` with ``k / n_c >= accept`` (the rule of
        :func:`softmaxkit.scores.fpr_at_tpr`). A class never predicted on the held-out data gets the pooled threshold
        over all rows (with a ``RuntimeWarning``).
        """
        if isinstance(accept, bool) or not isinstance(accept, Real) or not 0 < accept <= 1:
            raise ValueError(f"accept must be a number in (0, 1], got {accept!r}")
        d = self.distance(logits).detach().to(torch.float64).cpu().numpy()
        assert self.centroids_ is not None  # distance() raised if not fitted
        pred = logits.detach().argmax(1).cpu().numpy()
        pooled = _order_statistic(d, accept)
        thresholds = np.full(self.centroids_.shape[0], pooled)
        unseen = []
        for c in range(len(thresholds)):
            if (pred == c).any():
                thresholds[c] = _order_statistic(d[pred == c], accept)
            else:
                unseen.append(c)
        if unseen:
            warnings.warn(f"classes {unseen} are never predicted on the held-out logits; "
                          "they get the pooled threshold", RuntimeWarning, stacklevel=2)
        self.thresholds_ = torch.as_tensor(thresholds, dtype=torch.float64)
        return self.thresholds_

    def accept(self, logits: torch.Tensor) -> torch.Tensor:
        """True where the distance is within the predicted class's threshold."""
        if self.thresholds_ is None:
            raise RuntimeError("thresholds are not fitted: call fit_thresholds(heldout_logits) first")
        d = self.distance(logits).detach().to(torch.float64).cpu()
        return d <= self.thresholds_[logits.detach().argmax(1).cpu()]


def _order_statistic(values: np.ndarray, fraction: float) -> float:
    """The ``k``-th smallest value, ``k`` the least count with ``k / n >= fraction``
    (:func:`.metrics.least_count`, as :func:`.metrics.fpr_at_tpr` counts)."""
    return float(np.sort(values)[least_count(fraction, len(values)) - 1])
