r"""Sigmoid attention weights: ``sigmoid(x + b)`` entry by entry, ``b = -log n`` by default.

Ramapuram et al. (2024), "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention" (FlashSigmoid), arXiv 2409.04431.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from .._checks import check_finite
from ..forms import Elementwise
from ..registry import Example, Learnable, builtin
from ._generic import from_form


def _bias(bias: Any, bias_offset: Any, n: Any) -> Any:
    b = -(torch.log(n) if isinstance(n, torch.Tensor) else math.log(float(n))) \
        if bias is None else bias
    return b + bias_offset


def biased_sigmoid(x: torch.Tensor, bias: Any, bias_offset: Any, n: Any) -> torch.Tensor:
    """``h(x) = sigmoid(x + b + delta)``, ``b = -log n`` unless ``bias`` is given."""
    return torch.sigmoid(x + _bias(bias, bias_offset, n))


def d_biased_sigmoid(x: torch.Tensor, bias: Any, bias_offset: Any, n: Any) -> torch.Tensor:
    """``dh/dx = h (1 - h)``."""
    h = biased_sigmoid(x, bias, bias_offset, n)
    return h * (1 - h)


FORM = Elementwise(h=biased_sigmoid, dh=d_biased_sigmoid)


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
        check_finite(bias, "bias")
    check_finite(bias_offset, "bias_offset")
    return from_form(FORM, x, dim, mask, {"bias": bias, "bias_offset": bias_offset})


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``h = sigmoid(x + b + delta)`` for the fused Triton attention (packed: ``[bias given], bias, delta``)."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def h(x, n, par):
        b = tl.where(tl.load(par) != 0, tl.load(par + 1), -tl.log(n))
        return tl.sigmoid(x + b + tl.load(par + 2))

    @triton.jit
    def dh(x, n, par):
        b = tl.where(tl.load(par) != 0, tl.load(par + 1), -tl.log(n))
        s = tl.sigmoid(x + b + tl.load(par + 2))
        return s * (1.0 - s)

    @triton.jit
    def dpar(x, n, par, K: tl.constexpr):
        b = tl.where(tl.load(par) != 0, tl.load(par + 1), -tl.log(n))
        s = tl.sigmoid(x + b + tl.load(par + 2))
        if K == 0:
            out = tl.zeros(x.shape, tl.float32)
        elif K == 1:
            out = tl.where(tl.load(par) != 0, s * (1.0 - s), 0.0)
        else:
            out = s * (1.0 - s)
        return out

    def values(params):
        bias = params["bias"]
        return (0.0 if bias is None else 1.0, 0.0 if bias is None else bias, params["bias_offset"])

    return TritonPieces(fn=h, dfn=dh, dpar=dpar, values=values, uses_n=True)


@functools.cache
def _numba_pieces():
    """``h = sigmoid(x + a)``, ``a = b + delta`` per row, for the CPU fused attention's row kernels
    (packed: ``[bias given], bias, delta``)."""
    import numpy as np
    from numba import njit

    from ..kernels.cpu._exp import exp_nonpositive_fast
    from ..kernels.cpu._intrinsics import cast_like, divide_finite
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def row(n, par):
        return (par[1] if par[0] != 0 else -np.log(n)) + par[2]

    # e = exp(-|z|) <= 1: sigmoid(z) = 1 / (1 + e) for z >= 0, e / (1 + e) below, never
    # overflowing; the divisor lies in [1, 2] (its square in [1, 4])
    @njit(cache=True, inline="always")
    def h(x, a, par):
        z = x + a
        e = exp_nonpositive_fast(-abs(z))
        return divide_finite(cast_like(1.0, x) if z >= 0 else e, cast_like(1.0, x) + e)

    @njit(cache=True, inline="always")
    def dh(x, a, par):
        e = exp_nonpositive_fast(-abs(x + a))
        d = cast_like(1.0, x) + e
        return divide_finite(e, d * d)

    def values(params):
        bias = params["bias"]
        return (0.0 if bias is None else 1.0, 0.0 if bias is None else bias, params["bias_offset"])

    return NumbaPieces(fn=h, dfn=dh, row=row, values=values)


SPEC = builtin(
    sigmoid, form=FORM, formula="sigmoid(x + b), b = -log n by default",
    triton=_triton_pieces,
    numba=_numba_pieces,
    reference="Ramapuram et al. 2024, arXiv 2409.04431",
    sums_to_one=False, can_be_sparse=False, shift_invariant=False,
    learnable={"bias_offset": Learnable(0.0)},
    examples=(
        Example(x=(0.6931471805599453, 0.0), expected=(0.5, 1 / 3), note="b = -log 2"),
        Example(x=(0.0,), expected=(0.5,), params={"bias": 0.0}),
    ),
)
