"""``softmax_topk`` / ``log_softmax_topk``: the k largest probabilities without the full output."""

from __future__ import annotations

import torch

from .._checks import check_dim, check_floating, check_int_in_range
from . import dispatch


def _check(x, k, dim):
    check_floating(x)
    d = check_dim(x, dim)
    n = x.shape[d] if x.dim() else 1
    k = check_int_in_range(k, "k", 1, n)
    return k, d


def _reference(x, k, dim, log):
    from ..normalizers.softmax import log_softmax, softmax
    with dispatch.use_backend("reference"):
        p = (log_softmax if log else softmax)(x, dim=dim)
    return torch.topk(p, k, dim=dim)


def _topk(x, k, dim, log):
    k, d = _check(x, k, dim)
    fast = dispatch.select("log_softmax_topk" if log else "softmax_topk", x, dim, k=k)
    if fast is not None:
        return fast()
    values, indices = _reference(x, k, d, log)
    return values, indices


def softmax_topk(x: torch.Tensor, k: int, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The ``k`` largest entries of ``softmax(x)`` along ``dim`` and their indices.

    .. math:: (p_{(1)}, \dots, p_{(k)}),\quad p = \mathrm{softmax}(x),\ p_{(1)} \ge p_{(2)} \ge \dots

    Same values and indices as ``torch.softmax(x, dim).topk(k, dim)``. The numba kernel
    fuses both (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax",
    arXiv 1805.02867): one read of ``x``, the online normaliser and a size-``k`` heap,
    and only ``k`` values per row written. Tie rule: entries are sorted by decreasing
    score, equal scores by increasing index; where different scores round to the same
    probability (e.g. several that underflow to 0), the larger score ranks first, so
    indices can then differ from ``torch.topk``'s own order among equal values.

    Args:
        x: scores, float tensor, any shape.
        k: ``1 <= k <= x.shape[dim]``.
        dim: the axis normalised.

    Returns:
        ``(values, indices)``, each of ``x``'s shape with ``dim`` of size ``k``. When
        ``x`` requires grad, the unfused reference (softmax, then topk) runs and the
        values are differentiable.
    """
    return _topk(x, k, dim, log=False)


def log_softmax_topk(x: torch.Tensor, k: int, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The ``k`` largest entries of ``log_softmax(x)`` along ``dim`` and their indices.

    Same as :func:`softmax_topk` with ``x_j - m - log d`` as values (Milakov &
    Gimelshein 2018, arXiv 1805.02867).
    """
    return _topk(x, k, dim, log=True)
