r"""Scalable-Softmax (SSMax): ``softmax(s log(n) x)``, which keeps attention focused as n grows.

Nakanishi (2025), "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from .._checks import check_count, check_finite
from ..forms import SoftmaxOf
from ..registry import Example, Learnable, builtin
from ._generic import from_form

#: Initial SSMax scale: Nakanishi (2025) reports s ~ 0.43 as the value used for SSMax.
S_INIT = 0.43


def _log_n(n: Any) -> Any:
    return torch.log(n) if isinstance(n, torch.Tensor) else math.log(float(n))


def length_scaled(x: torch.Tensor, s: Any, n: Any) -> torch.Tensor:
    """``g(x) = s log(n) x``."""
    return x * (_log_n(n) * s)


def d_length_scaled(x: torch.Tensor, s: Any, n: Any) -> torch.Tensor:
    """``dg/dx = s log(n)``."""
    return torch.ones_like(x) * (_log_n(n) * s)


FORM = SoftmaxOf(g=length_scaled, dg=d_length_scaled, linear=True)


def ssmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
          s: float | torch.Tensor = S_INIT, n: int | torch.Tensor | None = None) -> torch.Tensor:
    r"""Scalable-Softmax (Nakanishi 2025).

    .. math:: \mathrm{SSMax}(x)_i = \frac{n^{s x_i}}{\sum_j n^{s x_j}} = \mathrm{softmax}(s \log(n)\, x)_i

    ``n`` is the number of visible entries of the row by default (for causal attention,
    query ``i`` sees ``n = i + 1`` keys); pass ``n`` to override it. With ``n = 1`` the
    single visible entry gets weight 1. ``s`` is learnable (a number or a tensor
    broadcastable to ``x``, e.g. one per head); the paper reports ``s ≈ 0.43``.

    Nakanishi (2025), "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399.
    """
    check_finite(s, "s")
    check_count(n)
    _check_scale(x, dim, s, n)
    return from_form(FORM, x, dim, mask, {"s": s, "n": n})


def _check_scale(x: Any, dim: Any, s: Any, n: Any) -> None:
    """``ValueError`` where a number ``s`` times ``log n`` (``n`` a number, else the row's
    length, which bounds it) overflows: ``x * inf`` would give every positive score of the
    row the same weight, not the limit (the row's argmax)."""
    if isinstance(s, torch.Tensor) or isinstance(n, torch.Tensor) or not isinstance(x, torch.Tensor) \
            or type(dim) is not int or not -x.dim() <= dim < max(x.dim(), 1):
        return   # (tensors: their product is formed per row; bad x / dim: from_form says why)
    length = float(n) if n is not None else (x.shape[dim] if x.dim() else 1)
    if math.isinf(abs(float(s)) * math.log(max(length, 1.0))):
        raise ValueError(f"s * log(n) must be finite, got s={s} with n up to {length:g}")


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``g(x) = s log(n) x`` for the fused Triton attention (parameters packed: ``s``)."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def g(x, n, par):
        return x * (tl.log(n) * tl.load(par))

    @triton.jit
    def dg(x, n, par):
        return tl.zeros(x.shape, tl.float32) + tl.log(n) * tl.load(par)

    @triton.jit
    def dpar(x, n, par, K: tl.constexpr):
        return x * tl.log(n)

    return TritonPieces(fn=g, dfn=dg, dpar=dpar, values=lambda params: (params["s"],), uses_n=True)


@functools.cache
def _numba_pieces():
    """``g(x) = a x`` with ``a = s log(n)`` per row, for the CPU fused attention's row kernels (packed: ``s``)."""
    import numpy as np
    from numba import njit

    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def row(n, par):
        return np.log(n) * par[0]

    @njit(cache=True, inline="always")
    def g(x, a, par):
        return x * a

    @njit(cache=True, inline="always")
    def dg(x, a, par):
        return a

    return NumbaPieces(fn=g, dfn=dg, row=row, values=lambda params: (params["s"],))


SPEC = builtin(
    ssmax, form=FORM, formula="softmax(s log(n) x)", reference="Nakanishi 2025, arXiv 2501.19399",
    triton=_triton_pieces,
    numba=_numba_pieces,
    sums_to_one=True, can_be_sparse=False, shift_invariant=True,
    learnable={"s": Learnable(S_INIT)},
    examples=(
        Example(x=(1.0, 0.0), expected=(2 / 3, 1 / 3), params={"s": 1.0}, note="n = 2: weights 2^x"),
        Example(x=(1.0, 0.0, 0.0, 0.0), expected=(0.5714285714285714, 1 / 7, 1 / 7, 1 / 7), params={"s": 1.0}),
        Example(x=(3.0,), expected=(1.0,), note="n = 1"),
    ),
)
