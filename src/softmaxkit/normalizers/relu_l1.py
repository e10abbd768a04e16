r"""l1-normalised ReLU: ``relu(x) / (sum relu(x) + eps)``.

ReLU in place of softmax: Wortsman, Lee, Gilmer & Kornblith (2023), arXiv 2309.08586.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .._checks import check_positive
from ..forms import SumNormalized
from ..registry import Example, builtin
from ._generic import from_form


def rectified(x: torch.Tensor) -> torch.Tensor:
    """``h(x) = relu(x)``."""
    return torch.relu(x)


def d_rectified(x: torch.Tensor) -> torch.Tensor:
    """``dh/dx = [x > 0]``."""
    return (x > 0).to(x.dtype)


FORM = SumNormalized(h=rectified, dh=d_rectified)


def relu_l1(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    r"""l1-normalised ReLU.

    .. math:: p_i = \frac{\mathrm{relu}(x_i)}{\sum_j \mathrm{relu}(x_j) + \varepsilon}

    Exact zeros wherever ``x <= 0``; a row with no positive entry is all zeros. A
    ``+inf`` score gives the limit: equal weights on the ``+inf`` entries. See Wortsman
    et al. (2023), arXiv 2309.08586, for ReLU in place of softmax.
    """
    check_positive(eps, "eps", allow_tensor=False, finite=True)
    return from_form(FORM, x, dim, mask, {"eps": eps})


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``h = relu(x)`` for the fused Triton attention."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def h(x, n, par):
        return tl.maximum(x, 0.0)

    @triton.jit
    def dh(x, n, par):
        return tl.where(x > 0, 1.0, 0.0)

    return TritonPieces(fn=h, dfn=dh)


@functools.cache
def _numba_pieces():
    """``h = relu(x)`` for the CPU fused attention's row kernels."""
    from numba import njit

    from ..kernels.cpu._intrinsics import cast_like
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def h(x, n, par):
        return max(x, cast_like(0.0, x))

    @njit(cache=True, inline="always")
    def dh(x, n, par):
        return cast_like(1.0, x) if x > 0 else cast_like(0.0, x)

    return NumbaPieces(fn=h, dfn=dh)


SPEC = builtin(
    relu_l1, form=FORM, formula="relu(x) / (sum relu(x) + eps)",
    triton=_triton_pieces,
    numba=_numba_pieces,
    reference="l1-normalised ReLU (Wortsman et al. 2023, arXiv 2309.08586)",
    sums_to_one=False, can_be_sparse=True, shift_invariant=False,
    examples=(
        Example(x=(3.0, 1.0, -2.0), expected=(0.75, 0.25, 0.0), params={"eps": 1e-300}),
        Example(x=(-3.0, -1.0), expected=(0.0, 0.0), note="no positive score: zeros"),
    ),
)
