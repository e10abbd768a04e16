r"""MultiMax: softmax of a learnable piecewise-quadratic modulator.

Zhou, Fritz & Keuper (2024), "MultiMax: Sparse and Multi-Modal Attention Learning", ICML
2024, arXiv 2406.01189 (official code: the "SeLU" modulator).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from .._checks import check_finite
from ..forms import SoftmaxOf
from ..registry import Example, Learnable, builtin
from ._generic import from_form

#: The functional defaults (all zeros) make MultiMax equal softmax; :class:`softmaxkit.nn.Normalizer`
#: initialises r and t as the official code does (truncated normal, std 0.02).
R_INIT = (0.0, 0.0, 0.0, 0.0)
T_INIT = (0.0, 0.0, 0.0, 0.0)


def _term(t: Any, base: torch.Tensor, square: bool) -> torch.Tensor:
    """``t relu(base)``, or ``(t u) u`` with ``u = relu(base)`` when ``square``: never ``t u^2``,
    whose ``u^2`` would overflow (``|x|`` above ~1.8e19 in float32) and make ``t = 0`` give
    ``0 * inf = NaN``. So ``t = 0`` gives exactly 0, value and gradient, for every finite ``x``.
    Past ``u = sqrt(finfo.max)`` (where ``t u^2`` overflows for any ``t`` of size 1) the term
    is a constant: its gradient there would be the incoming gradient times ``u`` (inf at a
    ``finfo.min`` mask fill) times ``t``, NaN at ``t = 0``."""
    u = torch.relu(base)
    if not square:
        return t * u
    limit = torch.finfo(u.dtype).max ** 0.5
    capped = u.clamp_max(limit)
    return torch.where(u > limit, ((t * u) * u).detach(), (t * capped) * capped)


def modulator(x: torch.Tensor, r: Sequence[Any], t: Sequence[Any]) -> torch.Tensor:
    r"""The MultiMax modulator σ (the official code's "SeLU"), elementwise.

    .. math:: \sigma(x) = x + t_1 [r_1 - x]_+ + t_2 [x - r_2]_+ + t_3 [r_3 - x]_+^2 + t_4 [x - r_4]_+^2
    """
    return (x + _term(t[0], r[0] - x, False) + _term(t[1], x - r[1], False)
            + _term(t[2], r[2] - x, True) + _term(t[3], x - r[3], True))


#: Where :func:`_term` holds a square constant in float64, the dtype that the reference computes
#: a row in once ``g`` overflows float32 (past it, no slope).
_SQUARE_LIMIT = torch.finfo(torch.float64).max ** 0.5


def _slope(t: Any, base: torch.Tensor) -> torch.Tensor:
    """``d (t u^2) / du = 2 t u`` with ``u = relu(base)``, 0 past :data:`_SQUARE_LIMIT`."""
    u = torch.relu(base)
    return 2 * _term(t, torch.where(u > _SQUARE_LIMIT, torch.zeros_like(u), u), False)


def d_modulator(x: torch.Tensor, r: Sequence[Any], t: Sequence[Any]) -> torch.Tensor:
    r"""``dσ/dx = 1 - t_1 [x < r_1] + t_2 [x > r_2] - 2 t_3 [r_3 - x]_+ + 2 t_4 [x - r_4]_+``
    (a square's part 0 where :func:`_term` holds it constant)."""
    one = torch.ones_like(x)
    return (one - _term(t[0], (r[0] - x > 0).to(x.dtype), False) + _term(t[1], (x - r[1] > 0).to(x.dtype), False)
            - _slope(t[2], r[2] - x) + _slope(t[3], x - r[3]))


def _unmodulated(params: Any) -> float | None:
    """``1`` when every ``t`` is the number 0 and no parameter is a tensor: then ``sigma(x) = x``
    exactly (:func:`_term` gives 0 at every finite ``x``) and MultiMax is plain softmax, which
    scaled dot-product attention runs; else None."""
    values = [params.get("r", R_INIT), params.get("t", T_INIT)]
    if any(isinstance(v, torch.Tensor) for v in values):
        return None
    if any(isinstance(v, torch.Tensor) for seq in values for v in seq):
        return None
    return 1.0 if all(float(v) == 0.0 for v in values[1]) else None


FORM = SoftmaxOf(g=modulator, dg=d_modulator, linear_factor=_unmodulated)


def multimax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
             r: Sequence[float] | torch.Tensor = R_INIT, t: Sequence[float] | torch.Tensor = T_INIT) -> torch.Tensor:
    r"""MultiMax (Zhou, Fritz & Keuper, ICML 2024): softmax of a learnable piecewise modulator.

    .. math::
        \mathrm{MultiMax}(x) = \mathrm{softmax}(\sigma(x)),\quad
        \sigma(x) = x + t_1 [r_1 - x]_+ + t_2 [x - r_2]_+ + t_3 [r_3 - x]_+^2 + t_4 [x - r_4]_+^2

    ``r`` and ``t`` each hold 4 values: numbers, or a tensor whose first axis has 4 entries
    and whose remaining axes broadcast to ``x`` (per-head parameters). The defaults (all
    zeros) give plain softmax, exactly, whatever the size of ``x``;
    :class:`softmaxkit.nn.Normalizer` initialises them as the official code does
    (truncated normal, std 0.02). Zhou, Fritz & Keuper (2024), "MultiMax: Sparse and
    Multi-Modal Attention Learning", arXiv 2406.01189.
    """
    for name, value in (("r", r), ("t", t)):
        if isinstance(value, torch.Tensor):
            check_finite(value, name)
    return from_form(FORM, x, dim, mask, {"r": r, "t": t}, sizes={"r": 4, "t": 4})


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """The modulator and its derivatives for the fused Triton attention (packed: ``r1..r4, t1..t4``)."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def g(x, n, par):
        a = tl.maximum(tl.load(par) - x, 0.0)
        b = tl.maximum(x - tl.load(par + 1), 0.0)
        c = tl.maximum(tl.load(par + 2) - x, 0.0)
        d = tl.maximum(x - tl.load(par + 3), 0.0)
        t1, t2, t3, t4 = tl.load(par + 4), tl.load(par + 5), tl.load(par + 6), tl.load(par + 7)
        # a zero t gives no term (0 inf = NaN at an infinite score), as in the numba pieces
        return (x + tl.where(t1 != 0.0, t1 * a, 0.0) + tl.where(t2 != 0.0, t2 * b, 0.0)
                + tl.where(t3 != 0.0, (t3 * c) * c, 0.0) + tl.where(t4 != 0.0, (t4 * d) * d, 0.0))

    @triton.jit
    def dg(x, n, par):
        one = tl.full(x.shape, 1.0, tl.float32)
        return (one - tl.load(par + 4) * tl.where(tl.load(par) - x > 0, 1.0, 0.0)
                + tl.load(par + 5) * tl.where(x - tl.load(par + 1) > 0, 1.0, 0.0)
                - 2.0 * tl.load(par + 6) * tl.maximum(tl.load(par + 2) - x, 0.0)
                + 2.0 * tl.load(par + 7) * tl.maximum(x - tl.load(par + 3), 0.0))

    @triton.jit
    def dpar(x, n, par, K: tl.constexpr):
        if K == 0:
            out = tl.load(par + 4) * tl.where(tl.load(par) - x > 0, 1.0, 0.0)
        elif K == 1:
            out = -tl.load(par + 5) * tl.where(x - tl.load(par + 1) > 0, 1.0, 0.0)
        elif K == 2:
            out = 2.0 * tl.load(par + 6) * tl.maximum(tl.load(par + 2) - x, 0.0)
        elif K == 3:
            out = -2.0 * tl.load(par + 7) * tl.maximum(x - tl.load(par + 3), 0.0)
        elif K == 4:
            out = tl.maximum(tl.load(par) - x, 0.0)
        elif K == 5:
            out = tl.maximum(x - tl.load(par + 1), 0.0)
        elif K == 6:
            c = tl.maximum(tl.load(par + 2) - x, 0.0)
            out = c * c
        else:
            d = tl.maximum(x - tl.load(par + 3), 0.0)
            out = d * d
        return out

    def values(params):
        r, t = params["r"], params["t"]
        return tuple(r[i] for i in range(4)) + tuple(t[i] for i in range(4))

    return TritonPieces(fn=g, dfn=dg, dpar=dpar, values=values)


@functools.cache
def _numba_pieces():
    """The modulator and its derivative for the CPU fused attention's row kernels
    (packed: ``r1..r4, t1..t4``)."""
    from numba import njit

    from ..kernels.cpu._intrinsics import cast_like
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def g(x, n, par):
        zero = cast_like(0.0, x)
        r1, r2, r3, r4 = par[0], par[1], par[2], par[3]   # loaded before the selects (see dg)
        t1, t2, t3, t4 = par[4], par[5], par[6], par[7]
        a = max(r1 - x, zero)
        b = max(x - r2, zero)
        c = max(r3 - x, zero)
        d = max(x - r4, zero)
        # a zero t gives no term: selected, since the kernels' fastmath may reassociate (t c) c into
        # t (c c), which overflows to inf (and 0 inf = NaN) once |x| > 1.8e19 in float32, and an
        # infinite score makes t a = 0 inf = NaN too (the reference's row then is its limit)
        low = (t3 * c) * c if t3 != zero else zero
        high = (t4 * d) * d if t4 != zero else zero
        below = t1 * a if t1 != zero else zero
        above = t2 * b if t2 != zero else zero
        return x + below + above + low + high

    @njit(cache=True, inline="always")
    def dg(x, n, par):
        zero, one, two = cast_like(0.0, x), cast_like(1.0, x), cast_like(2.0, x)
        limit = cast_like(_SQUARE_LIMIT, x)   # inf in float32
        # every parameter loaded before the selects: a load inside one (``par[4] if ... else 0``) is
        # not speculated, so LLVM kept a branch per score and the backward row loop scalar (4x slower)
        r1, r2, r3, r4 = par[0], par[1], par[2], par[3]
        t1, t2, t3, t4 = par[4], par[5], par[6], par[7]
        below = t1 if r1 - x > zero else zero
        above = t2 if x - r2 > zero else zero
        c = max(r3 - x, zero)
        d = max(x - r4, zero)
        c = c if c <= limit else zero   # (float64 only: where _term holds the square constant)
        d = d if d <= limit else zero
        return one - below + above - two * (t3 * c) + two * (t4 * d)

    def values(params):
        r, t = params["r"], params["t"]
        return tuple(r[i] for i in range(4)) + tuple(t[i] for i in range(4))

    return NumbaPieces(fn=g, dfn=dg, values=values)


SPEC = builtin(
    multimax, form=FORM, formula="softmax(sigma(x)), piecewise-quadratic modulator sigma",
    triton=_triton_pieces,
    numba=_numba_pieces,
    reference="Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189",
    sums_to_one=True, can_be_sparse=False, shift_invariant=False,
    sizes={"r": 4, "t": 4},
    learnable={"r": Learnable(R_INIT, init_std=0.02), "t": Learnable(T_INIT, init_std=0.02)},
    examples=(
        Example(x=(0.0, 1.0986122886681098), expected=(0.25, 0.75), note="r = t = 0: softmax"),
        Example(x=(0.0, 1.0), expected=(0.25, 0.75), params={"r": (0.0, 0.0, 0.0, 0.0),
                                                             "t": (0.0, 0.0986122886681098, 0.0, 0.0)},
                note="t2 stretches the scores above r2"),
    ),
)
