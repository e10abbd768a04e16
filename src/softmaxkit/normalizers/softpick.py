r"""Softpick: a rectified, not-sum-to-one softmax, ``relu(e^x - 1) / (sum |e^x - 1| + eps)``.

Zuhri, Fuadi & Aji (2025), "Softpick: No Attention Sink, No Massive Activations with
Rectified Softmax", arXiv 2504.20966.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .._checks import check_positive
from .._rows import prepare_rows
from ..forms import StreamRule, SumNormalized, keep_visible
from ..registry import Example, builtin
from ._generic import finish
from .softmax import infinite_limit, limit_rows

#: Below this ``|x|``, ``e^{x-c} - e^{-c}`` is taken as ``e^{-c} expm1(x)``: the difference of two
#: close exponentials loses ``log2(1 / |x|)`` bits (7e-2 of relative error at scores of 1e-6 in
#: float32); above it the difference loses at most a factor ``e^x / (e^x - 1) <= 2.6``.
EXPM1_BELOW = 0.5
#: Taylor terms of ``expm1`` on ``|x| < 0.5`` in the fused kernels: the remainder
#: ``0.5^(k+1) / (k+1)!`` is below half an ulp of ``expm1(0.5)`` (float32: 8; float64: 16).
EXPM1_TERMS = {"float32": 8, "float64": 16}


def shifted_gain(x: torch.Tensor, c: torch.Tensor | float = 0.0) -> torch.Tensor:
    """``e^{x - c} - e^{-c} = e^{-c} (e^x - 1)``: the signed term scaled by ``e^{-c}`` (``c`` a row
    shift), through ``expm1`` for small ``|x|`` (:data:`EXPM1_BELOW`)."""
    c = torch.as_tensor(c, dtype=x.dtype, device=x.device)
    small = x.abs() < EXPM1_BELOW
    near = torch.exp(-c) * torch.expm1(torch.where(small, x, torch.zeros_like(x)))
    return torch.where(small, near, torch.exp(x - c) - torch.exp(-c))


def d_shifted_gain(x: torch.Tensor, c: torch.Tensor | float = 0.0) -> torch.Tensor:
    """``d/dx (e^{x-c} - e^{-c}) = e^{x-c}``."""
    return torch.exp(x - torch.as_tensor(c, dtype=x.dtype, device=x.device))


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
    check_positive(eps, "eps", allow_tensor=False, finite=True)
    rows = prepare_rows(x, dim, mask)
    finite = rows.visible & ~torch.isinf(rows.x)
    xs = torch.where(finite, rows.x, torch.zeros_like(rows.x))
    m = xs.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True) if xs.shape[-1] else xs[..., :1]
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    c = m.detach().clamp_min(0.0)
    gain = torch.where(finite, shifted_gain(xs, c), torch.zeros_like(xs))
    p = torch.relu(gain) / (gain.abs().sum(-1, keepdim=True) + eps * torch.exp(m - c))
    p = torch.where(limit_rows(rows.x, rows.visible), infinite_limit(rows.x.detach(), rows.visible), p)
    return finish(rows, p)


class SoftpickRule(StreamRule):
    """``sum relu(e^{x-c} - e^{-c}) v / (sum |e^{x-c} - e^{-c}| + eps e^{m-c})``, ``c = max(m, 0)``."""

    max_grad = True

    def shift(self, m):
        return m.clamp_min(0.0)

    def terms(self, p, z, visible, st):
        a = keep_visible(shifted_gain(z, st["c0"]), visible)
        return {"num": torch.relu(a), "den": a.abs()}

    def output(self, sums, st):
        return sums["num"] / (sums["den"] + st["params"]["eps"] * torch.exp(st["m0"] - st["c0"]))


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``a = e^{x-c} - e^{-c}``, ``da/dx = e^{x-c}`` (row shift ``c``) for the fused Triton attention."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def h(x, c, n, par):
        small = tl.abs(x) < 0.5
        xs = tl.where(small, x, 0.0)
        p = 1.0 / 40320.0   # expm1 by Taylor on |x| < 0.5 (EXPM1_TERMS["float32"]): no cancellation
        p = p * xs + 1.0 / 5040.0
        p = p * xs + 1.0 / 720.0
        p = p * xs + 1.0 / 120.0
        p = p * xs + 1.0 / 24.0
        p = p * xs + 1.0 / 6.0
        p = p * xs + 0.5
        p = p * xs + 1.0
        return tl.where(small, tl.exp(-c) * (p * xs), tl.exp(x - c) - tl.exp(-c))

    @triton.jit
    def dh(x, c, n, par):
        return tl.exp(x - c)

    return TritonPieces(fn=h, dfn=dh)


@functools.cache
def _numba_pieces():
    """``a = e^{x-c} - e^{-c}``, ``da/dx = e^{x-c}`` (row shift ``c = max(m, 0)``) for the CPU fused
    attention's row kernels (the signed ``sum_normalized`` kernels, ``den = sum |a| + eps e^{m-c}``)."""
    from numba import literal_unroll, njit, types
    from numba.extending import overload

    from ..kernels.cpu._exp import exp_nonpositive_fast
    from ..kernels.cpu._intrinsics import cast_like, held_constant
    from ..kernels.cpu.pieces import NumbaPieces

    def expm1_small(x):
        raise NotImplementedError("numba only")

    @overload(expm1_small, inline="always")
    def _expm1_small(x):
        terms = EXPM1_TERMS["float32" if x == types.float32 else "float64"]
        factorial = [1.0]
        for k in range(1, terms + 1):
            factorial.append(factorial[-1] * k)
        coefficients = tuple(1.0 / factorial[k] for k in range(terms, 0, -1))

        def impl(x):
            p = cast_like(0.0, x)
            for coefficient in literal_unroll(coefficients):   # straight-line Horner: no loop, no loads
                p = p * x + held_constant(cast_like(coefficient, x))
            return p * x
        return impl

    @njit(cache=True, inline="always")
    def h(x, c, a, par):
        # both forms, then a select (a branch here kept the row loop from vectorising: 4x slower)
        scale = exp_nonpositive_fast(-c)
        small = abs(x) < EXPM1_BELOW
        near = scale * expm1_small(x if small else cast_like(0.0, x))
        far = exp_nonpositive_fast(x - c) - scale
        return near if small else far

    @njit(cache=True, inline="always")
    def dh(x, c, a, par):
        return exp_nonpositive_fast(x - c)

    return NumbaPieces(fn=h, dfn=dh)


SPEC = builtin(
    softpick, form=SumNormalized(h=shifted_gain, dh=d_shifted_gain, signed=True),
    triton=_triton_pieces, numba=_numba_pieces,
    formula="relu(e^x - 1) / (sum |e^x - 1| + eps)", reference="Zuhri et al. 2025, arXiv 2504.20966",
    sums_to_one=False, can_be_sparse=True, shift_invariant=False,
    stream=lambda params: SoftpickRule(), stream_passes=1,
    examples=(
        Example(x=(0.6931471805599453, -0.6931471805599453), expected=(1 / 1.5, 0.0), params={"eps": 1e-300},
                note="e^x - 1 = 1 and -1/2: the negative entry is 0 but counts in the sum"),
        Example(x=(-1.0, -2.0), expected=(0.0, 0.0), note="no positive score: an all-zero row"),
    ),
)
