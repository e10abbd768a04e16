r"""ReLU attention weights: ``relu(x) / n``.

Wortsman, Lee, Gilmer & Kornblith (2023), "Replacing softmax with ReLU in Vision
Transformers", arXiv 2309.08586.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..forms import Elementwise
from ..registry import Example, builtin
from ._generic import from_form


def relu_over_count(x: torch.Tensor, n: Any) -> torch.Tensor:
    """``h(x) = relu(x) / n``."""
    return torch.relu(x) / n


def d_relu_over_count(x: torch.Tensor, n: Any) -> torch.Tensor:
    """``dh/dx = [x > 0] / n``."""
    return (x > 0).to(x.dtype) / n


FORM = Elementwise(h=relu_over_count, dh=d_relu_over_count)


def relu(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""ReLU attention weights (Wortsman et al. 2023): ``relu(x) / n``.

    .. math:: p_i = \frac{\mathrm{relu}(x_i)}{n}

    with ``n`` the number of visible entries of the row (query ``i`` of causal attention
    divides by ``i + 1``). Wortsman, Lee, Gilmer & Kornblith (2023), "Replacing softmax
    with ReLU in Vision Transformers", arXiv 2309.08586.
    """
    return from_form(FORM, x, dim, mask, {})


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``h = relu(x) / n`` for the fused Triton attention."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def h(x, n, par):
        return tl.maximum(x, 0.0) * (1.0 / n)

    @triton.jit
    def dh(x, n, par):
        return tl.where(x > 0, 1.0, 0.0) / n

    return TritonPieces(fn=h, dfn=dh, uses_n=True)


@functools.cache
def _numba_pieces():
    """``h = relu(x) a``, ``a = 1 / n`` per row, for the CPU fused attention's row kernels."""
    from numba import njit

    from ..kernels.cpu._intrinsics import cast_like
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def row(n, par):
        return cast_like(1.0, n) / n

    @njit(cache=True, inline="always")
    def h(x, a, par):
        return max(x, cast_like(0.0, x)) * a

    @njit(cache=True, inline="always")
    def dh(x, a, par):
        return a if x > 0 else cast_like(0.0, x)

    return NumbaPieces(fn=h, dfn=dh, row=row)


SPEC = builtin(
    relu, form=FORM, formula="relu(x) / n", reference="Wortsman et al. 2023, arXiv 2309.08586",
    triton=_triton_pieces,
    numba=_numba_pieces,
    sums_to_one=False, can_be_sparse=True, shift_invariant=False,
    examples=(Example(x=(2.0, -1.0), expected=(1.0, 0.0)),),
)
