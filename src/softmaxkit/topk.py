"""``softmax_topk`` / ``log_softmax_topk``: the k largest probabilities without the full output.

The public functions; the fused kernel is :mod:`softmaxkit.kernels.cpu.topk`, picked by
:func:`softmaxkit.kernels.dispatch.run`.
"""

from __future__ import annotations

import torch

from ._checks import check_dim, check_floating, check_int_in_range
from .kernels import dispatch
from .normalizers.softmax import log_softmax_reference, softmax_reference


def _check(x, k, dim):
    check_floating(x)
    d = check_dim(x, dim)
    n = x.shape[d] if x.dim() else 1
    if n == 0:
        raise ValueError(f"x has no entry along dim={dim} (shape {tuple(x.shape)}): there is no top-k to take")
    k = check_int_in_range(k, "k", 1, n)
    return k, d


def _top(p, k, dim):
    """The documented order: decreasing value, equal values by increasing index (a stable
    sort; ``torch.topk`` leaves the order of equal values unspecified). A 0-d ``p`` is its own
    top-1, at index 0, as ``torch.topk`` gives it."""
    if p.dim() == 0:
        return p, torch.zeros((), dtype=torch.int64, device=p.device)
    values, indices = torch.sort(p, dim=dim, descending=True, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def _softmax_topk_reference(x, dim=-1, mask=None, k=1):
    return _top(softmax_reference(x, dim, mask), k, dim)


def _log_softmax_topk_reference(x, dim=-1, mask=None, k=1):
    return _top(log_softmax_reference(x, dim, mask), k, dim)


def _topk(x, k, dim, log):
    k, d = _check(x, k, dim)
    if log:
        return dispatch.run("log_softmax_topk", _log_softmax_topk_reference, x, d, k=k)
    return dispatch.run("softmax_topk", _softmax_topk_reference, x, d, k=k)


def softmax_topk(x: torch.Tensor, k: int, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The ``k`` largest entries of ``softmax(x)`` along ``dim`` and their indices.

    .. math:: (p_{(1)}, \dots, p_{(k)}),\quad p = \mathrm{softmax}(x),\ p_{(1)} \ge p_{(2)} \ge \dots

    Same values and indices as ``torch.softmax(x, dim).topk(k, dim)``. The numba kernel
    fuses both (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax",
    arXiv 1805.02867): one read of ``x``, the online normaliser and a size-``k`` heap,
    and only ``k`` values per row written. Order (the same on the kernel and the
    reference path): decreasing probability, equal probabilities by increasing index,
    over the whole row; so where several scores round to the same probability (e.g.
    ones that underflow to 0) the smallest indices among them are returned. (``torch.topk``
    leaves the order of equal values unspecified.) Both paths give the same indices for
    equal scores and for underflowing probabilities; where distinct scores lie closer than
    the spacing of the probabilities, the two paths' probabilities can differ in the last
    bit, and so can the choice among those nearly equal entries.

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
