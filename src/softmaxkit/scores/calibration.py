r"""Calibration: temperature scaling, expected calibration error, reliability diagrams.

Guo, Pleiss, Sun & Weinberger (2017), "On calibration of modern neural networks",
arXiv 1706.04599 (temperature scaling, ECE); Kull et al. (2019), "Beyond temperature
scaling", arXiv 1910.12656 (classwise ECE); Naeini, Cooper & Hauskrecht (2015) (ECE).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from .. import functional as F
from .._checks import check_finite, check_int_in_range, check_positive
from ._inputs import check_labels, check_logits_2d, check_probs

STRATEGIES = ("uniform", "quantile")


# ----------------------------------------------------------------------------------------
# temperature scaling
# ----------------------------------------------------------------------------------------

#: Bisection steps of :func:`fit_temperature`: enough to narrow the widest float64 bracket
#: of ``log T`` (about 1420) to below its resolution.
FIT_TEMPERATURE_MAX_STEPS = 200


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor,
                    bounds: tuple[float, float] = (1e-3, 1e3), tol: float = 1e-10) -> float:
    r"""The temperature ``T`` that minimises the negative log-likelihood of ``labels``.

    .. math:: T^\star = \arg\min_{T > 0} \frac1N \sum_i -\log \mathrm{softmax}(z_i / T)_{y_i}

    With :math:`\beta = 1/T` the objective :math:`L(\beta) = \frac1N\sum_i
    \mathrm{LSE}(\beta z_i) - \beta z_{i,y_i}` is convex, with derivative
    :math:`L'(\beta) = \frac1N \sum_i \mathbb{E}_{p_\beta}[z_i] - z_{i,y_i}` increasing in
    :math:`\beta`; the minimiser is its root, found by bisection on :math:`\log\beta` to a
    relative precision ``tol`` (a finite number ``> 0``), in at most
    :data:`FIT_TEMPERATURE_MAX_STEPS` halvings and never past the float64 resolution of
    ``log T`` (a ``tol`` finer than that stops there). Computed in float64. When the root lies outside
    ``bounds`` (e.g. every training prediction is right, so the NLL keeps falling as
    ``T -> 0``), the nearest bound is returned with a ``RuntimeWarning``.

    Returns:
        ``T`` as a Python float; calibrated probabilities are ``softmax(logits / T)``.
    """
    check_logits_2d(logits)
    y = check_labels(labels, logits.shape[0], logits.shape[1]).to(logits.device)
    check_finite(tol, "tol", allow_tensor=False)
    check_positive(tol, "tol", allow_tensor=False)
    if isinstance(bounds, (str, bytes)) or not hasattr(bounds, "__len__") \
            or (isinstance(bounds, torch.Tensor) and bounds.dim() == 0) or len(bounds) != 2:
        raise TypeError(f"bounds must be a pair (low, high) of numbers, got {bounds!r}")
    for i, b in enumerate(bounds):
        check_finite(b, f"bounds[{i}]", allow_tensor=False)
    lo_t, hi_t = (float(b) for b in bounds)
    if not 0 < lo_t < hi_t < math.inf:
        raise ValueError(f"bounds must be (low, high) with 0 < low < high < inf, got {bounds}")
    z = logits.detach().to(torch.float64)
    # -inf is a masked class (probability 0 at every T), as nll and softmax take it
    visible = z > -math.inf
    if not bool((visible | torch.isinf(z)).all()) or bool((z == math.inf).any()):
        raise ValueError("logits must be finite, or -inf at a masked class, to fit a temperature")
    z_true = z.gather(1, y.unsqueeze(1)).squeeze(1)
    if not bool(torch.isfinite(z_true).all()):
        raise ValueError("a label's logit is -inf (a masked class): its likelihood is 0 at every temperature")
    z_visible = z.masked_fill(~visible, 0.0)

    def slope(log_beta: float) -> float:
        p = F.softmax(z, temperature=math.exp(-log_beta))
        return float(((p * z_visible).sum(1) - z_true).mean())

    lo, hi = -math.log(hi_t), -math.log(lo_t)   # log(beta) = -log(T)
    if bool((z.amax(1) == z.masked_fill(~visible, math.inf).amin(1)).all()):
        warnings.warn("every row's logits are equal (or there is one class): the NLL does not depend on T; "
                      "returning 1", RuntimeWarning, stacklevel=2)
        return 1.0
    if slope(hi) <= 0:
        warnings.warn(f"the NLL still decreases at T = {lo_t:g}; returning the lower bound", RuntimeWarning,
                      stacklevel=2)
        return float(lo_t)
    if slope(lo) >= 0:
        warnings.warn(f"the NLL still decreases at T = {hi_t:g}; returning the upper bound", RuntimeWarning,
                      stacklevel=2)
        return float(hi_t)
    for _ in range(FIT_TEMPERATURE_MAX_STEPS):
        if not hi - lo > tol:
            break
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:       # the interval is down to adjacent floats
            break
        if slope(mid) < 0:
            lo = mid
        else:
            hi = mid
    return math.exp(-0.5 * (lo + hi))


def nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of ``labels`` under ``softmax(logits / temperature)``."""
    check_logits_2d(logits)
    y = check_labels(labels, logits.shape[0], logits.shape[1]).to(logits.device)
    logp = F.log_softmax(logits.detach().to(torch.float64), temperature=temperature)
    return float(-logp.gather(1, y.unsqueeze(1)).mean())


# ----------------------------------------------------------------------------------------
# binning, reliability diagram, ECE
# ----------------------------------------------------------------------------------------

@dataclass
class ReliabilityDiagram:
    """Binned confidence against accuracy.

    Attributes:
        edges: (n_bins + 1,) bin edges; bin ``b`` holds confidences in ``(edges[b], edges[b+1]]``
            (the first bin also holds ``edges[0]``).
        confidence: (n_bins,) mean confidence per bin (NaN for an empty bin).
        accuracy: (n_bins,) fraction of hits per bin (NaN for an empty bin).
        count: (n_bins,) number of samples per bin.
    """

    edges: torch.Tensor
    confidence: torch.Tensor
    accuracy: torch.Tensor
    count: torch.Tensor

    @property
    def ece(self) -> float:
        r""":math:`\sum_b \frac{|B_b|}{N} |\mathrm{acc}_b - \mathrm{conf}_b|` over non-empty bins."""
        full = self.count > 0
        n = self.count.sum()
        gap = (self.accuracy[full] - self.confidence[full]).abs()
        return float((self.count[full].to(gap.dtype) * gap).sum() / n)


def _quantiles(values: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear interpolation between the order statistics at
    ``q (n - 1)``) for any ``n``: torch's refuses more than 2^24 values ("input tensor is too
    large"), e.g. the token-level confidences of a language-model evaluation."""
    ordered = values.sort().values
    position = q * (len(ordered) - 1)
    below = position.floor().long()
    above = position.ceil().long()
    return torch.lerp(ordered[below], ordered[above], position - below.to(position.dtype))


def _bin(confidence: torch.Tensor, hits: torch.Tensor, n_bins: int, strategy: str) -> ReliabilityDiagram:
    if strategy == "uniform":
        edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64)
    else:
        edges = _quantiles(confidence, torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64))
    index = torch.searchsorted(edges[1:-1].contiguous(), confidence.contiguous())  # (e_b, e_{b+1}] -> b
    count = torch.bincount(index, minlength=n_bins)
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, index, confidence)
    hit_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, index, hits.to(torch.float64))
    denom = count.to(torch.float64)
    empty = count == 0
    nan = torch.full_like(denom, float("nan"))
    return ReliabilityDiagram(
        edges=edges,
        confidence=torch.where(empty, nan, conf_sum / denom.clamp_min(1)),
        accuracy=torch.where(empty, nan, hit_sum / denom.clamp_min(1)),
        count=count,
    )


def _check_binning(n_bins, strategy) -> int:
    n_bins = check_int_in_range(n_bins, "n_bins", 1)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
    return n_bins


def reliability_diagram(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15,
                        strategy: str = "uniform") -> ReliabilityDiagram:
    """Top-label reliability diagram: bins of ``max(probs)`` against the accuracy in each bin.

    ``strategy="uniform"``: ``n_bins`` equal-width bins on [0, 1]; ``"quantile"``: edges at
    the quantiles of the confidences, so bins hold about equally many samples (tied
    confidences always share a bin, so some bins may be empty). Empty bins are reported
    with NaN confidence and accuracy and skipped by :attr:`ReliabilityDiagram.ece`.

    Args:
        probs: (N, C) probabilities; rows must sum to one (pass ``softmax(logits)``).
        labels: (N,) class indices.
    """
    n_bins = _check_binning(n_bins, strategy)
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1]).to(p.device)
    confidence, prediction = p.max(1)
    return _bin(confidence.cpu(), (prediction == y).cpu(), n_bins, strategy)


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15, strategy: str = "uniform") -> float:
    r"""Expected calibration error of the top label (Naeini et al. 2015; Guo et al. 2017).

    .. math:: \mathrm{ECE} = \sum_{b=1}^{B} \frac{|B_b|}{N}\,
              \bigl|\mathrm{acc}(B_b) - \mathrm{conf}(B_b)\bigr|

    over the bins of :func:`reliability_diagram` (same arguments).
    """
    return reliability_diagram(probs, labels, n_bins, strategy).ece


def classwise_ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15,
                  strategy: str = "uniform") -> float:
    r"""Classwise ECE (Kull et al. 2019): the ECE of every class's probability, averaged.

    .. math:: \mathrm{cwECE} = \frac1C \sum_{c=1}^{C} \sum_{b} \frac{|B_{c,b}|}{N}\,
              \bigl|\mathrm{freq}_c(B_{c,b}) - \mathrm{mean}\,p_c(B_{c,b})\bigr|

    where the bins :math:`B_{c,b}` split all N samples by their probability ``p_c`` and
    :math:`\mathrm{freq}_c` is the fraction of them whose label is ``c``.
    """
    n_bins = _check_binning(n_bins, strategy)
    p = check_probs(probs).cpu()
    y = check_labels(labels, p.shape[0], p.shape[1]).cpu()
    errors = [_bin(p[:, c].contiguous(), y == c, n_bins, strategy).ece for c in range(p.shape[1])]
    return float(sum(errors) / len(errors))
