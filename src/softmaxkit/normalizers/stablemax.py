r"""StableMax: a softmax whose exponential is replaced by a rational map that never underflows.

Prieto, Barsbey, Mediano & Birdal (2025), "Grokking at the Edge of Numerical Stability",
arXiv 2501.04697.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .._rows import nonzero_or_one, prepare_rows
from ..forms import SoftmaxOf
from ..registry import Example, builtin
from ._generic import finish
from .softmax import infinite_limit, limit_rows


def log_s(x: torch.Tensor) -> torch.Tensor:
    """``g(x) = log s(x)``, ``s(x) = x + 1`` for ``x >= 0`` and ``1 / (1 - x)`` below:
    StableMax as ``softmax(log s(x))``."""
    return torch.where(x >= 0, torch.log1p(x.clamp_min(0)), -torch.log1p(-x.clamp_max(0)))


def d_log_s(x: torch.Tensor) -> torch.Tensor:
    """``dg/dx = 1 / (1 + |x|)``."""
    return 1.0 / (1.0 + x.abs())


def stablemax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""StableMax (Prieto et al. 2025): a softmax whose exponential is replaced by a rational map.

    .. math:: \mathrm{StableMax}(x)_i = \frac{s(x_i)}{\sum_j s(x_j)},\quad
              s(x) = \begin{cases} x + 1 & x \ge 0 \\ \frac{1}{1 - x} & x < 0 \end{cases}

    ``s`` grows linearly, so the weights never underflow (the paper's cure for softmax
    collapse). Not shift invariant. A ``-inf`` entry has ``s = 0``; a row with ``+inf``
    entries gives its limit, equal weights on them. Prieto, Barsbey, Mediano & Birdal
    (2025), "Grokking at the Edge of Numerical Stability", arXiv 2501.04697.
    """
    rows = prepare_rows(x, dim, mask)
    finite = rows.visible & ~torch.isinf(rows.x)  # a NaN stays and makes its row NaN
    xs = torch.where(finite, rows.x, torch.zeros_like(rows.x))
    # s(x_i) / sum_j s(x_j) as softmax(log s(x)), shifted by the row's largest log s: at very
    # negative scores (a finfo.min mask fill) s is subnormal, its sum too, and 1 / sum
    # overflowed into NaN gradients
    g = torch.where(finite, log_s(xs), torch.full_like(xs, float("-inf")))
    top = g.amax(-1, keepdim=True) if g.shape[-1] else g.new_zeros(g.shape[:-1] + (1,))
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    weights = torch.where(finite, torch.exp(g - top), torch.zeros_like(xs))
    p = weights / nonzero_or_one(weights.sum(-1, keepdim=True))
    p = torch.where(limit_rows(rows.x, rows.visible), infinite_limit(rows.x.detach(), rows.visible), p)
    return finish(rows, p)


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``g(x) = sign(x) log(1 + |x|)``, ``dg = 1 / (1 + |x|)`` for the fused Triton attention."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def g(x, n, par):
        a = tl.log(1.0 + tl.abs(x))
        return tl.where(x >= 0, a, -a)

    @triton.jit
    def dg(x, n, par):
        return 1.0 / (1.0 + tl.abs(x))

    return TritonPieces(fn=g, dfn=dg)


@functools.cache
def _numba_pieces():
    """``g = sign(x) log(1 + |x|)``, ``dg = 1 / (1 + |x|)`` and ``e^g = s(x)`` (the rational map,
    which never overflows: the kernels skip the maximum) for the CPU fused attention. ``s`` does
    underflow, to ``1 / finfo.max`` (subnormal) at a ``finfo.min`` mask fill: a row of such
    fills only (left padding) has ``1 / sum s = inf``, and the fused path takes those rows through
    ``g`` and the row's maximum instead, as the reference does (see ``NumbaPieces.weight``)."""
    import math

    from numba import njit

    from ..kernels.cpu._intrinsics import cast_like
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def g(x, n, par):
        a = math.log1p(abs(x))
        return a if x >= 0 else -a

    @njit(cache=True, inline="always")
    def dg(x, n, par):
        one = cast_like(1.0, x)
        return one / (one + abs(x))

    @njit(cache=True, inline="always")
    def w(x, n, par):
        one = cast_like(1.0, x)
        return x + one if x >= 0 else one / (one - x)

    return NumbaPieces(fn=g, dfn=dg, weight=w)


SPEC = builtin(
    stablemax, form=SoftmaxOf(g=log_s, dg=d_log_s),
    triton=_triton_pieces,
    numba=_numba_pieces,
    formula="s(x) / sum s(x), s(x) = x+1 (x>=0), 1/(1-x) (x<0)",
    reference="Prieto et al. 2025, arXiv 2501.04697",
    sums_to_one=True, can_be_sparse=False, shift_invariant=False,
    examples=(
        Example(x=(1.0, -1.0), expected=(0.8, 0.2), note="s = 2 and 1/2"),
        Example(x=(0.0, 0.0, 2.0), expected=(0.2, 0.2, 0.6)),
    ),
)
