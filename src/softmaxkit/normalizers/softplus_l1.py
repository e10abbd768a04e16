r"""l1-normalised softplus: ``softplus(x) / (sum softplus(x) + eps)``: positive weights that grow
linearly, not exponentially, in the score."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as torch_f

from .._checks import check_positive
from ..forms import SumNormalized
from ..registry import Example, builtin
from ._generic import from_form


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``h(x) = log(1 + e^x)``."""
    return torch_f.softplus(x)


def d_softplus(x: torch.Tensor) -> torch.Tensor:
    """``dh/dx = sigmoid(x)``."""
    return torch.sigmoid(x)


FORM = SumNormalized(h=softplus, dh=d_softplus)


def softplus_l1(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    r"""l1-normalised softplus.

    .. math:: p_i = \frac{\log(1 + e^{x_i})}{\sum_j \log(1 + e^{x_j}) + \varepsilon}

    Strictly positive weights that grow linearly (not exponentially) in the score.
    A ``+inf`` score gives the limit: equal weights on the ``+inf`` entries. The
    l1-normalised rectifier family of ReLU attention (Wortsman et al. 2023, arXiv 2309.08586).
    """
    check_positive(eps, "eps", allow_tensor=False, finite=True)
    return from_form(FORM, x, dim, mask, {"eps": eps})


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``h = softplus(x)``, ``dh = sigmoid(x)`` for the fused Triton attention."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    # log(1 + e) as log(u) e / (u - 1), u = 1 + e (Goldberg 1991): exact to a few ulp where
    # log(1 + e) alone returns 0 for e below float32's epsilon (scores below about -17: a row
    # of negative scores, whose weights are ratios of such tails, was off by up to 100%)
    @triton.jit
    def h(x, n, par):
        e = tl.exp(-tl.abs(x))
        u = 1.0 + e
        return tl.maximum(x, 0.0) + tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))

    @triton.jit
    def dh(x, n, par):
        return tl.sigmoid(x)

    return TritonPieces(fn=h, dfn=dh)


@functools.cache
def _numba_pieces():
    """``h = softplus(x)``, ``dh = sigmoid(x)`` for the CPU fused attention's row kernels.

    ``softplus(x) = max(x, 0) + log(1 + e)``, ``e = e^{-|x|} <= 1``, with
    ``log(1 + e) = 2 atanh(s) = 2 sum_k s^{2k+1} / (2k + 1)``, ``s = e / (2 + e) <= 1/3``:
    19 terms (float64) or 7 (float32) put the truncation below half an ulp (relative
    ``9^{-k} / (2k + 1)``), and the series vectorises (no libm call)."""
    from numba import njit, types
    from numba.extending import overload

    from ..kernels.cpu._exp import exp_nonpositive_fast
    from ..kernels.cpu._intrinsics import cast_like, divide_finite, held_constant
    from ..kernels.cpu.pieces import NumbaPieces

    def log1p_unit(e):
        raise NotImplementedError("numba only")

    @overload(log1p_unit, inline="always")
    def _log1p_unit(e):
        terms = 7 if e == types.float32 else 19

        def impl(e):
            two = held_constant(cast_like(2.0, e))
            s = divide_finite(e, two + e)   # e in [0, 1]
            s2 = s * s
            q = held_constant(cast_like(1.0 / (2 * terms - 1), e))
            for k in range(terms - 2, -1, -1):
                q = q * s2 + held_constant(cast_like(1.0 / (2 * k + 1), e))
            return two * s * q
        return impl

    @njit(cache=True, inline="always")
    def h(x, n, par):
        return max(x, cast_like(0.0, x)) + log1p_unit(exp_nonpositive_fast(-abs(x)))

    @njit(cache=True, inline="always")
    def dh(x, n, par):
        e = exp_nonpositive_fast(-abs(x))
        return divide_finite(cast_like(1.0, x) if x >= 0 else e, cast_like(1.0, x) + e)

    return NumbaPieces(fn=h, dfn=dh)

SPEC = builtin(
    softplus_l1, form=FORM, formula="softplus(x) / (sum softplus(x) + eps)",
    triton=_triton_pieces,
    numba=_numba_pieces,
    reference="l1-normalised softplus (rectifier family of Wortsman et al. 2023, arXiv 2309.08586)",
    sums_to_one=False, can_be_sparse=False, shift_invariant=False,
    examples=(Example(x=(0.0, 0.0), expected=(0.5, 0.5), params={"eps": 1e-300}),),
)
