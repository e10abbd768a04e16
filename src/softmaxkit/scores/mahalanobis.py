r"""Mahalanobis-distance OOD score with class means and one tied covariance (Lee et al. 2018).

Lee, Lee, Lee & Shin (2018), "A simple unified framework for detecting out-of-distribution
samples and adversarial attacks", NeurIPS, arXiv 1807.03888. This is the score of their
Eq. (2) on one feature layer; their input pre-processing and the ensemble over layers
are left to the caller (score several layers and combine them).
"""

from __future__ import annotations

import math

import torch

from .._checks import check_at_least, check_floating, check_int_in_range
from ._inputs import check_labels


class Mahalanobis:
    r"""Class-conditional Gaussians with a shared covariance, fitted on features.

    ``fit`` estimates the class means :math:`\mu_c` and the tied covariance

    .. math:: \Sigma = \frac1N \sum_c \sum_{i: y_i = c} (f_i - \mu_c)(f_i - \mu_c)^\top,
              \qquad \Sigma_\lambda = (1 - \lambda)\,\Sigma + \lambda\,\frac{\mathrm{tr}\,\Sigma}{d}\, I

    (maximum-likelihood estimate, as in the paper, shrunk towards a scaled identity by
    ``shrinkage`` = :math:`\lambda \in [0, 1]`). ``score`` returns the paper's confidence

    .. math:: M(f) = \max_c -(f - \mu_c)^\top \Sigma_\lambda^{+} (f - \mu_c)

    (higher = more in-distribution). :math:`\Sigma^{+}` is the pseudo-inverse: with
    ``shrinkage=0`` and a singular covariance (more dimensions than samples, or a feature
    that never varies) the directions of zero variance are *ignored*; use a small
    ``shrinkage > 0`` to count deviations along them. Computed in float64, on the features
    scaled by a power of two (exact, and the score is scale invariant): features of 1e200
    or 1e-200 would overflow or underflow the covariance.

    Example::

        detector = Mahalanobis(shrinkage=0.01).fit(train_features, train_labels)
        scores = detector.score(test_features)
    """

    def __init__(self, shrinkage: float = 0.0):
        check_at_least(shrinkage, 0.0, "shrinkage", allow_tensor=False)
        if shrinkage > 1:
            raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")
        self.shrinkage = float(shrinkage)
        self.means_: torch.Tensor | None = None
        self.covariance_: torch.Tensor | None = None
        self._whiten: torch.Tensor | None = None
        self._scale = 1.0                              # features are fitted and scored times this power of two
        self._scaled_means: torch.Tensor | None = None

    def fit(self, features: torch.Tensor, labels: torch.Tensor, num_classes: int | None = None) -> Mahalanobis:
        """Fit class means and the tied covariance on ``features`` (N, D) with ``labels`` (N,).

        ``num_classes`` defaults to ``labels.max() + 1``; every class must have a sample.
        """
        f = _check_features(features)
        if num_classes is None:
            integer = isinstance(labels, torch.Tensor) and not (
                labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool)
            # (as int64: uint16 / uint32 / uint64 have no max in torch; other kinds: check_labels says why)
            num_classes = int(labels.long().max()) + 1 if integer and labels.numel() else 1
        else:
            num_classes = check_int_in_range(num_classes, "num_classes", 1)
        y = check_labels(labels, f.shape[0], num_classes).to(f.device)
        counts = torch.bincount(y, minlength=num_classes)
        if bool((counts == 0).any()):
            missing = torch.nonzero(counts == 0).flatten().tolist()
            raise ValueError(f"labels has no sample of class(es) {missing}; each class needs one to fit its mean")
        # the squared distance is invariant to scaling the features: scaled by a power of two
        # (exactly) into [0.5, 1), the covariance of features of 1e200 no longer overflows (eigh
        # failed on inf) nor that of features of 1e-200 underflows to 0 (every score was 0)
        scale = _power_of_two_scale(f)
        f = f * scale
        means = torch.zeros(num_classes, f.shape[1], dtype=f.dtype, device=f.device)
        means.index_add_(0, y, f)
        means /= counts.unsqueeze(1).to(f.dtype)
        centred = f - means[y]
        cov = centred.T @ centred / f.shape[0]
        d = cov.shape[0]
        cov = ((1 - self.shrinkage) * cov
               + self.shrinkage * (torch.trace(cov) / d) * torch.eye(d, dtype=f.dtype, device=f.device))
        self._scale, self._scaled_means = scale, means
        self.means_, self.covariance_ = means / scale, cov / (scale * scale)
        self._whiten = _pinv_sqrt(cov)
        return self

    def distances(self, features: torch.Tensor) -> torch.Tensor:
        """Squared Mahalanobis distance of each row to each class mean, shape (N, C), float64.

        Differentiable in ``features`` (the fitted statistics are constants): the gradient of the
        score with respect to the input is what Lee et al.'s input pre-processing perturbs along."""
        if self._whiten is None:
            raise RuntimeError("Mahalanobis is not fitted: call fit(features, labels) first")
        assert self._scaled_means is not None  # fit sets it with _whiten
        f = _check_features(features, detach=False)
        if f.shape[1] != self._scaled_means.shape[1]:
            raise ValueError(f"features must have {self._scaled_means.shape[1]} columns as in fit, got {f.shape[1]}")
        f = f.to(self._whiten.device) * self._scale
        whitened = (f.unsqueeze(1) - self._scaled_means.unsqueeze(0)) @ self._whiten
        return whitened.square().sum(-1)

    def score(self, features: torch.Tensor) -> torch.Tensor:
        """``-min_c`` squared distance: higher = more in-distribution, shape (N,)."""
        return -self.distances(features).amin(1)

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """The class of the nearest mean (the generative classifier of the paper)."""
        return self.distances(features).argmin(1)


def _check_features(features, detach: bool = True) -> torch.Tensor:
    check_floating(features, "features")
    if features.dim() != 2 or features.shape[0] == 0 or features.shape[1] == 0:
        raise ValueError(f"features must have shape (N, D) with N, D >= 1, got {tuple(features.shape)}")
    if not bool(torch.isfinite(features).all()):
        raise ValueError("features must be finite")
    return (features.detach() if detach else features).to(torch.float64)


def _power_of_two_scale(f: torch.Tensor) -> float:
    """``2^-e`` with ``max |f|`` in ``[2^(e-1), 2^e)``: ``f`` times it lies in (-1, 1), with
    every digit kept (1 for an all-zero ``f``; the exponent is kept within float64's range)."""
    largest = float(f.abs().max())
    if largest == 0:
        return 1.0
    return math.ldexp(1.0, -min(max(math.frexp(largest)[1], -1020), 1020))


def _pinv_sqrt(cov: torch.Tensor) -> torch.Tensor:
    """``W`` with ``W W^T = pinv(cov)``: eigenvectors scaled by ``1/sqrt(eigenvalue)``.

    Eigenvalues below ``d * eps * max eigenvalue`` count as zero (the rank cut-off of
    ``numpy.linalg.pinv`` / ``scipy.linalg.pinvh``).
    """
    values, vectors = torch.linalg.eigh(cov)
    cutoff = values.abs().max() * cov.shape[0] * torch.finfo(cov.dtype).eps
    inv_sqrt = torch.where(values > cutoff, values.clamp_min(cutoff).rsqrt(), torch.zeros_like(values))
    return vectors * inv_sqrt
