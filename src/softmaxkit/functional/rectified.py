"""Rectified and elementwise normalizers: softpick, sigmoid, ReLU and l1-normalised rectifiers.

None of these sums to one in general. Conventions as in :mod:`softmaxkit.functional.softmax`:
``mask`` True = visible, masked and ``-inf`` entries get exactly 0, a row with nothing
visible gives zeros, float16/bfloat16 are computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as torch_f

from .._rows import Rows, check_positive, check_real, prepare_rows
from .softmax import _infinite_limit


def _finish(rows: Rows, p: torch.Tensor) -> torch.Tensor:
    return rows.restore(rows.zero_invisible(p))


def _finite_view(rows: Rows):
    """Visible entries that are not infinite (a NaN stays, so its row becomes NaN), and ``x``
    with every other entry replaced by 0."""
    finite = rows.visible & ~torch.isinf(rows.x)
    return finite, torch.where(finite, rows.x, torch.zeros_like(rows.x))


def _positive_infinite_rows(rows: Rows) -> torch.Tensor:
    return (rows.visible & (rows.x == float("inf"))).any(-1, keepdim=True)


def _l1_normalise(rows: Rows, f: torch.Tensor, eps: float) -> torch.Tensor:
    """``f / (sum f + eps)`` over visible entries; rows with a ``+inf`` score give their limit."""
    p = f / (f.sum(-1, keepdim=True) + eps)
    p = torch.where(_positive_infinite_rows(rows), _infinite_limit(rows.x.detach(), rows.visible), p)
    return _finish(rows, p)


def softpick(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    r"""Softpick (Zuhri et al. 2025): rectified, not-sum-to-one softmax.

    .. math::
        \mathrm{softpick}(x)_i = \frac{\mathrm{relu}(e^{x_i} - 1)}{\sum_j |e^{x_j} - 1| + \varepsilon}
        = \frac{\mathrm{relu}(e^{x_i - m} - e^{-m})}{\sum_j |e^{x_j - m} - e^{-m}| + \varepsilon}

    (``m`` = visible row maximum). The two forms differ only in where ``ε`` enters; we
    compute the second, the paper's stable form, which as a function of ``x`` is
    ``relu(e^x - 1) / (Σ|e^x - 1| + ε e^m)``: within a relative ``ε`` of the first.
    Internally it is evaluated with the shift ``c = max(m, 0)`` (numerator and
    denominator times ``e^{m-c}``), so very negative rows do not overflow ``e^{-m}``.
    Entries with ``x <= 0`` get exactly 0, so a row can be all zeros: no attention
    sink is needed. Only visible entries enter the sum; ``-inf`` is masked.

    Zuhri, Fuadi & Aji (2025), "Softpick: No Attention Sink, No Massive Activations with
    Rectified Softmax", arXiv 2504.20966.
    """
    check_positive(eps, "eps", allow_tensor=False)
    rows = prepare_rows(x, dim, mask)
    finite, xs = _finite_view(rows)
    m = xs.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True) if xs.shape[-1] else xs[..., :1]
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    c = m.detach().clamp_min(0.0)
    shifted = torch.where(finite, torch.exp(xs - c) - torch.exp(-c), torch.zeros_like(xs))
    p = torch.relu(shifted) / (shifted.abs().sum(-1, keepdim=True) + eps * torch.exp(m - c))
    p = torch.where(_positive_infinite_rows(rows), _infinite_limit(rows.x.detach(), rows.visible), p)
    return _finish(rows, p)


def sigmoid(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
            bias: float | torch.Tensor | None = None,
            bias_offset: float | torch.Tensor = 0.0) -> torch.Tensor:
    r"""Sigmoid attention weights (Ramapuram et al. 2024), elementwise.

    .. math:: p_i = \sigma(x_i + b + \delta), \quad b = -\log n \text{ by default}

    ``n`` is the number of visible entries of the row, so for causal attention query
    ``i`` uses ``b = -log(i + 1)``. ``bias`` overrides ``b`` (a number or a tensor
    broadcastable to ``x``); ``bias_offset`` ``δ`` is added to either and is what
    :class:`softmaxkit.nn.Normalizer` learns (initialised to 0, i.e. the paper's bias).

    Ramapuram et al. (2024), "Theory, Analysis, and Best Practices for Sigmoid
    Self-Attention" (FlashSigmoid), arXiv 2409.04431.
    """
    if bias is not None:
        check_real(bias, "bias")
    check_real(bias_offset, "bias_offset")
    rows = prepare_rows(x, dim, mask)
    if bias is None:
        b = -torch.log(rows.count.clamp_min(1.0))
    else:
        b = rows.align(bias, "bias")
    b = b + rows.align(bias_offset, "bias_offset")
    visible_x = torch.where(rows.visible, rows.x, torch.zeros_like(rows.x))
    return _finish(rows, torch.sigmoid(visible_x + b))


def relu(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""ReLU attention weights (Wortsman et al. 2023): ``relu(x) / n``.

    .. math:: p_i = \frac{\mathrm{relu}(x_i)}{n}

    with ``n`` the number of visible entries of the row (query ``i`` of causal attention
    divides by ``i + 1``). Wortsman, Lee, Gilmer & Kornblith (2023), "Replacing softmax
    with ReLU in Vision Transformers", arXiv 2309.08586.
    """
    rows = prepare_rows(x, dim, mask)
    visible_x = torch.where(rows.visible, rows.x, torch.zeros_like(rows.x))
    return _finish(rows, torch.relu(visible_x) / rows.count.clamp_min(1.0))


def relu_l1(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    r"""l1-normalised ReLU.

    .. math:: p_i = \frac{\mathrm{relu}(x_i)}{\sum_j \mathrm{relu}(x_j) + \varepsilon}

    Exact zeros wherever ``x <= 0``; a row with no positive entry is all zeros. A
    ``+inf`` score gives the limit: equal weights on the ``+inf`` entries. See Wortsman
    et al. (2023), arXiv 2309.08586, for ReLU in place of softmax.
    """
    check_positive(eps, "eps", allow_tensor=False)
    rows = prepare_rows(x, dim, mask)
    _, xs = _finite_view(rows)
    return _l1_normalise(rows, torch.relu(xs), eps)


def softplus_l1(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    r"""l1-normalised softplus.

    .. math:: p_i = \frac{\log(1 + e^{x_i})}{\sum_j \log(1 + e^{x_j}) + \varepsilon}

    Strictly positive weights that grow linearly (not exponentially) in the score.
    A ``+inf`` score gives the limit: equal weights on the ``+inf`` entries.
    """
    check_positive(eps, "eps", allow_tensor=False)
    rows = prepare_rows(x, dim, mask)
    finite, xs = _finite_view(rows)
    f = torch.where(finite, torch_f.softplus(xs), torch.zeros_like(xs))
    return _l1_normalise(rows, f, eps)
