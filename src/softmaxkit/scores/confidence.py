r"""Confidence scores computed from logits, one value per row.

Direction: :func:`msp`, :func:`max_logit`, :func:`energy` and :func:`label_non_uniformity`
are *higher = more confident / more in-distribution*; :func:`entropy` is a measure of
uncertainty (*lower* = more in-distribution), so pass ``-entropy(logits)`` to the
metrics in :mod:`softmaxkit.scores.metrics`, which take higher = in-distribution.

Every function reduces over ``dim`` (default -1), accepts a bool ``mask`` broadcastable
to the logits (True = visible class), computes float16/bfloat16 in float32 and returns
the input dtype. The softmax math goes through :mod:`softmaxkit.functional`.
"""

from __future__ import annotations

import torch

from .. import functional as F
from .._checks import check_positive
from .._rows import compute_dtype, prepare_rows


def _rows(logits, dim, mask):
    rows = prepare_rows(logits, dim, mask, name="logits")
    if rows.x.shape[-1] == 0:
        raise ValueError(f"logits must have at least one class along dim={dim}, got shape {tuple(logits.shape)}")
    return rows


def _in_compute_dtype(logits: torch.Tensor) -> torch.Tensor:
    return logits.to(compute_dtype(logits.dtype))


def _visible(rows) -> torch.Tensor:
    """The rows' visibility back in the caller's layout."""
    return rows.visible.reshape(()) if rows.scalar else rows.visible.movedim(-1, rows.dim)


def msp(logits: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
        temperature: float = 1.0) -> torch.Tensor:
    r"""Maximum softmax probability, :math:`\max_i \mathrm{softmax}(z / T)_i`.

    The OOD baseline of Hendrycks & Gimpel (2017), "A baseline for detecting misclassified
    and out-of-distribution examples in neural networks", arXiv 1610.02136. Lies in
    ``[1/C, 1]`` (``C`` visible classes); a row with nothing visible gives 0.
    """
    _rows(logits, dim, mask)
    p = F.softmax(_in_compute_dtype(logits), dim=dim, mask=mask, temperature=temperature)
    return p.amax(dim).to(logits.dtype)


def max_logit(logits: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Maximum logit, :math:`\max_i z_i`, over the visible classes.

    Hendrycks et al. (2022), "Scaling out-of-distribution detection for real-world
    settings", arXiv 1911.11132. A row with nothing visible gives ``-inf``.
    """
    rows = _rows(logits, dim, mask)
    out = rows.x.masked_fill(~rows.visible, float("-inf")).amax(-1, keepdim=True)
    return rows.restore(out, reduced=True)


def energy(logits: torch.Tensor, temperature: float = 1.0, dim: int = -1,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Negative free energy, :math:`T \log \sum_i e^{z_i / T}` (higher = in-distribution).

    Liu, Wang, Owens & Li (2020), "Energy-based out-of-distribution detection",
    arXiv 2010.03759, define the energy :math:`E(x; T) = -T \log \sum_i e^{z_i/T}` and
    flag inputs of high energy; this function returns :math:`-E`, so that, like every
    score here, larger means more in-distribution. A row with nothing visible gives ``-inf``.
    """
    check_positive(temperature, "temperature", allow_tensor=False, finite=True)
    _rows(logits, dim, mask)
    z = _in_compute_dtype(logits)
    if temperature >= 1:
        return (temperature * F.logsumexp(z / temperature, dim=dim, mask=mask)).to(logits.dtype)
    # T log sum e^{z/T} = m + T log sum e^{(z - m)/T} with m the largest visible logit: z / T
    # itself overflows for |z| > T finfo.max (3e38 over T = 0.5 gave inf)
    if temperature < torch.finfo(z.dtype).tiny:   # T rounds to 0 (or loses digits) in z's dtype: 0 / 0 gave NaN
        z = z.double()
    visible = z if mask is None else z.masked_fill(~mask, float("-inf"))
    m = visible.detach().amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = F.logsumexp((z - m) / temperature, dim=dim, mask=mask)
    return (m.squeeze(dim) + temperature * lse).to(logits.dtype)


def entropy(logits: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Shannon entropy of the softmax, :math:`H = -\sum_i p_i \log p_i`, in nats.

    An uncertainty: ``0`` for a one-hot softmax, ``log C`` for a uniform one. *Lower*
    is more in-distribution; use ``-entropy(logits)`` as an OOD score. Classes whose
    probability is exactly 0 contribute 0 (the limit of ``p log p``); a row with nothing
    visible gives 0.
    """
    _rows(logits, dim, mask)
    z = _in_compute_dtype(logits)
    p = F.softmax(z, dim=dim, mask=mask)
    logp = F.log_softmax(z, dim=dim, mask=mask)
    # log p read only where p > 0: the product's gradient p' log p is 0 * -inf (NaN) elsewhere
    terms = p * torch.where(p > 0, logp, torch.zeros((), dtype=p.dtype, device=p.device))
    return (0.0 - terms.sum(dim)).to(logits.dtype)  # 0.0 - s: no negative zero


def label_non_uniformity(logits: torch.Tensor, dim: int = -1,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Wasserstein-1 distance between the softmax and the uniform distribution.

    Under the 0/1 ground metric (:math:`d(i, j) = 1` for :math:`i \ne j`) the
    Wasserstein-1 distance between two distributions on the classes *is* their total
    variation distance, so

    .. math:: \mathrm{LNU}(z) = W_1(p, u) = \tfrac12 \sum_i \left| p_i - \tfrac1C \right|,
              \quad p = \mathrm{softmax}(z)

    with ``C`` the number of visible classes. ``0`` for a uniform softmax, ``1 - 1/C`` for
    a one-hot one; higher = more confident. A row with nothing visible gives 0.
    """
    rows = _rows(logits, dim, mask)
    p = F.softmax(_in_compute_dtype(logits), dim=dim, mask=mask)
    visible = _visible(rows)
    uniform = 1.0 / visible.sum(dim, keepdim=True).clamp_min(1).to(p.dtype)
    gap = torch.where(visible, (p - uniform).abs(), torch.zeros((), dtype=p.dtype, device=p.device))
    return (0.5 * gap.sum(dim)).to(logits.dtype)
