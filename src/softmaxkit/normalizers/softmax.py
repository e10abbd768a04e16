r"""Softmax with temperature, its logarithm and log-sum-exp, and the softmax core on rows.

.. math:: \mathrm{softmax}(x)_i = \frac{e^{x_i/T - m}}{\sum_j e^{x_j/T - m}}, \quad m = \max_j x_j / T

Bridle (1990); temperature as in Hinton, Vinyals & Dean (2015), arXiv 1503.02531. The
row functions here (:func:`softmax_rows`, :func:`log_softmax_rows`, :func:`logsumexp_rows`)
are the building block of every ``softmax_of`` normalizer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .._checks import can_branch_on, check_bool, check_positive
from .._rows import Rows, nonzero_or_one, prepare_rows
from ..forms import SoftmaxOf, score_at_largest, shared_along_rows, shift_invariant_slope_grad
from ..kernels import dispatch
from ..kernels.temperature import times_inverse_temperature
from ..registry import Example, builtin

# ----------------------------------------------------------------------------------------
# the softmax core, on rows whose normalised axis is last
# ----------------------------------------------------------------------------------------


def _exp_terms(z: torch.Tensor, visible: torch.Tensor):
    """``exp(z - m)`` over visible entries (0 elsewhere), its row sum, ``m`` and the ``+inf`` rows.

    ``m`` is the visible row maximum, detached (softmax is shift invariant, so this is
    exact). A row whose maximum is ``+inf`` is returned with ``inf_rows`` True; its
    limit is uniform over its ``+inf`` entries.
    """
    filled = z.detach().masked_fill(~visible, float("-inf"))
    if z.shape[-1] == 0:
        m = filled.new_full(z.shape[:-1] + (1,), float("-inf"))
    else:
        m = filled.amax(-1, keepdim=True)
    finite_m = torch.isfinite(m)
    inf_rows = m == float("inf")
    m = torch.where(finite_m, m, torch.zeros_like(m))
    # a +inf row takes its limit: its other entries (finite, possibly huge, e.g. x / T for
    # a tiny T) must not reach exp with the shift 0, whose overflow would put inf / inf
    # into the discarded branch and NaN into the gradient
    z_safe = torch.where(visible & ~(z == float("inf")) & ~inf_rows, z, m)
    e = torch.where(visible, torch.exp(z_safe - m), torch.zeros_like(z))
    return e, e.sum(-1, keepdim=True), m, inf_rows


def _nan_gradient_in_nan_rows(out: torch.Tensor, z: torch.Tensor, visible: torch.Tensor,
                              d: torch.Tensor) -> torch.Tensor:
    """``out`` whose gradient is NaN at every visible entry of a row holding a visible NaN (its
    sum ``d`` NaN), as aten's and the kernels' backward give it: the exact 0 of an entry whose
    ``exp`` underflowed there (a ``-1e9`` fill), or the constant standing for a ``+inf``
    entry, would pass 0. The carrier is the row's sum of visible scores (gradient 1 at each),
    times NaN in those rows and 0 elsewhere: one pass over the scores, no NaN in other rows.
    (A full-size carrier took the reference's softmax forward+backward from 3.7 to 4.7 ms at
    64 x 4096.)"""
    if not (torch.is_grad_enabled() and z.requires_grad):
        return out
    nan_rows = torch.isnan(d)
    total = z.masked_fill(~visible, 0).sum(-1, keepdim=True)
    factor = torch.where(nan_rows, torch.full_like(total, float("nan")), torch.zeros_like(total))
    return out + torch.where(nan_rows, (total - total.detach()) * factor, torch.zeros_like(total))


def infinite_limit(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Uniform weights over the visible ``+inf`` entries of each row (the limit of a
    normalised row whose maximum grows to ``+inf``)."""
    top = (visible & (z == float("inf"))).to(z.dtype)
    return top / top.sum(-1, keepdim=True).clamp_min(1)


def limit_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """The rows that take :func:`infinite_limit`: a visible ``+inf`` and no visible NaN (a NaN
    makes its row NaN, as it does every other row)."""
    return ((visible & (z == float("inf"))).any(-1, keepdim=True)
            & ~(visible & torch.isnan(z)).any(-1, keepdim=True))


def softmax_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax along the last axis over visible entries (building block, no checks). An entry
    of probability 0 (hidden, ``-inf``, its ``exp`` underflowed, or its quotient: a subnormal
    ``exp`` over a sum above 1) passes no incoming gradient, even an infinite one
    (``torch.special.entr``'s at ``p = 0``: the quotient's backward took ``inf * 0 = NaN`` into
    the row), as the kernels' backward has it."""
    e, _, _, inf_rows = _exp_terms(z, visible)
    # an entry of probability 0 is a constant of its row: its gradient is exactly 0, even
    # where a NaN or an infinite incoming gradient makes the row's <p, g> non-finite. That
    # is also an entry whose exp is a subnormal but whose quotient rounds to 0: through the
    # row's sum it took e_j * inf (or NaN) where the kernels and aten's lane give 0
    with torch.no_grad():
        constant = (e == 0) | (e / nonzero_or_one(e.sum(-1, keepdim=True)) == 0)
    e = torch.where(constant, e.detach(), e)
    d = e.sum(-1, keepdim=True)
    q = e / nonzero_or_one(d)
    zero = (q == 0) & ~torch.isnan(d)   # (a visible NaN makes its whole row NaN)
    p = _nan_gradient_in_nan_rows(torch.where(zero, torch.zeros_like(e), q), z, visible, d)
    return torch.where(inf_rows, infinite_limit(z.detach(), visible), p)


def log_softmax_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Log-softmax along the last axis; ``-inf`` at invisible entries."""
    e, d, m, inf_rows = _exp_terms(z, visible)
    z_safe = torch.where(visible & ~torch.isinf(z), z, m)
    out = z_safe - m - torch.log(nonzero_or_one(d))
    out = torch.where(inf_rows, torch.log(infinite_limit(z.detach(), visible)), out)
    # z = -inf at a visible entry (x / T overflowing) of a row without NaN: probability 0, log -inf
    dead = (z == float("-inf")) & ~torch.isnan(d)
    out = _nan_gradient_in_nan_rows(out, z, visible, d)
    return torch.where(visible & ~dead, out, torch.full_like(out, float("-inf")))


def logsumexp_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """log-sum-exp along the last axis (keepdim); ``-inf`` for an empty row. As in
    :func:`softmax_rows`, an entry of probability 0 (its ``exp`` exactly 0, or ``exp / sum``)
    passes no incoming gradient, even an infinite or NaN one (the sum's backward took
    ``inf * 0 = NaN`` there); a row holding a visible NaN keeps a NaN gradient throughout."""
    e, d, m, inf_rows = _exp_terms(z, visible)
    e = torch.where((e / nonzero_or_one(d) == 0) & ~torch.isnan(d), e.detach(), e)
    d = e.sum(-1, keepdim=True)
    any_visible = visible.any(-1, keepdim=True)
    out = _nan_gradient_in_nan_rows(m + torch.log(nonzero_or_one(d)), z, visible, d)
    out = torch.where(any_visible, out, torch.full_like(out, float("-inf")))
    return torch.where(inf_rows, torch.full_like(out, float("inf")), out)


def _over_temperature(rows: Rows, temperature: float | torch.Tensor) -> torch.Tensor:
    scale: float | torch.Tensor
    if isinstance(temperature, torch.Tensor):   # 1 / T in the wider dtype (a float32 T of float64 x)
        scale = temperature.to(torch.promote_types(temperature.dtype, rows.x.dtype)).reciprocal()
    else:   # (a NumPy float16 / float32 T: inverted in float64, not in its own precision)
        scale = 1.0 / float(temperature)
    aligned = rows.align(scale, "temperature")
    if not (isinstance(aligned, torch.Tensor) and aligned.requires_grad):
        return _scaled(rows, aligned)
    # T's gradient: see shift_invariant_slope_grad (an infinite score, whose z does not move
    # with T, adds nothing to it)
    z = _scaled(rows, aligned.detach())
    finite = rows.visible & torch.isfinite(rows.safe_x)
    ref = score_at_largest(rows.safe_x, z, finite)
    return shift_invariant_slope_grad(z, rows.safe_x.masked_fill(~finite, 0.0), ref, aligned)


def _scaled(rows: Rows, aligned: float | torch.Tensor) -> torch.Tensor:
    """``x / T`` as ``x * aligned`` (``aligned = 1 / T`` in the rows' layout)."""
    z = times_inverse_temperature(rows.safe_x, aligned)
    if not isinstance(aligned, torch.Tensor) and aligned <= 1:
        return z
    # A visible finite score whose x / T overflows is not a limit of the definition: a row of
    # finfo.min (or -1e38) over T < 1 became all -inf (read as nothing visible); 3 and 4 over
    # T = 1e-38 in float32 two +inf entries sharing the mass (float64: all on the 4); 0 over
    # a T whose reciprocal overflows NaN. Softmax is shift invariant, so such rows are
    # computed as (x - m) / T with m the (detached) row maximum, as float64 sees them: the
    # maxima give 0 (also where 1 / T is inf), the rest their difference over T (in a row
    # whose maximum is +inf or NaN, the overflowed entries only have to stay finite: they
    # are 0, with the gradient of x / T, so that a NaN row's gradient is NaN everywhere).
    # Other rows keep z = x * (1 / T) as it is (the kernels round the same product).
    over = rows.visible & torch.isfinite(rows.x) & ~torch.isfinite(z)
    lost = over.any(-1, keepdim=True)
    if can_branch_on(z) and not bool(lost.any()):
        return z
    m = rows.masked_max().detach()
    finite_m = torch.isfinite(m)
    shifted = times_inverse_temperature(rows.safe_x - torch.where(finite_m, m, torch.zeros_like(m)), aligned)
    shifted = torch.where(torch.isnan(shifted), torch.zeros_like(shifted), shifted)   # 0 * inf at the maxima
    held = times_inverse_temperature(rows.safe_x - rows.safe_x.detach(), aligned)   # 0, gradient g / T
    fixed = torch.where(finite_m, shifted, torch.where(over, held, z))
    if isinstance(aligned, torch.Tensor) and aligned.dim() and aligned.shape[-1] != 1:
        # (x - m) / T is x / T up to the row's constant only where T is the row's own
        shared = shared_along_rows(aligned)
        if not can_branch_on(z) or not bool(shared.all()):
            fixed = torch.where(shared, fixed, _scaled_per_entry(rows, aligned, z))
    return torch.where(lost, fixed, z)


def _scaled_per_entry(rows: Rows, aligned: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``x / T`` up to a per-row constant, for rows whose ``T`` varies along the row and where
    a finite ``x / T`` overflowed: ``(x 2^-e / T - c) 2^e``, with ``2^e`` (per row) bringing the
    largest ``|x / T|`` within float64's range and ``c`` the largest scaled visible score, in
    float64. An entry still beyond the range after the shift is far below the row's largest
    (``-inf``: probability 0); the gradient is that of ``x / T`` (``c`` detached). Entries
    that are not finite keep ``z``."""
    finite = rows.visible & torch.isfinite(rows.x)
    x = rows.safe_x.double()
    a = aligned.double().clamp(max=torch.finfo(torch.float64).max)   # (a T below 1 / finfo.max)
    exponent = (torch.frexp(x.detach())[1] + torch.frexp(a.detach())[1]).masked_fill(~finite, 0)
    e = (exponent.amax(-1, keepdim=True) - 1000).clamp_min(0).double()   # 2^1000 x 2 still fits
    scaled = _times_power_of_two(x, -e) * a
    top = scaled.detach().masked_fill(~finite, float("-inf")).amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return torch.where(finite, _times_power_of_two(scaled - top, e).to(z.dtype), z)


def _times_power_of_two(t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``t 2^e`` (``e`` whole numbers, float64, up to about +-2000) in two exact steps: one
    factor ``2^e`` would leave float64's range. (``torch.ldexp``'s gradient is 0 for a
    negative integer exponent: it takes ``2^e`` in integers.)"""
    half = torch.floor(e / 2)
    return t * torch.exp2(half) * torch.exp2(e - half)




# ----------------------------------------------------------------------------------------
# public functions
# ----------------------------------------------------------------------------------------


def softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
            temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Softmax with temperature.

    .. math:: \mathrm{softmax}(x)_i = \frac{e^{x_i/T - m}}{\sum_j e^{x_j/T - m}},
              \quad m = \max_j x_j / T

    A row whose maximum is ``+inf`` gives its limit: equal weights on its ``+inf``
    entries. Shift invariant. Bridle (1990); temperature as in Hinton, Vinyals & Dean
    (2015), "Distilling the knowledge in a neural network", arXiv 1503.02531.

    Args:
        x: scores, any shape.
        dim: the axis normalised.
        mask: bool, broadcastable to ``x``, True = visible.
        temperature: ``T > 0``, finite, a number or a tensor broadcastable to ``x``.
    """
    if mask is None and type(temperature) is float and temperature == 1.0:
        out = dispatch.softmax_lane(x, dim)
        if out is not None:
            return out
    check_positive(temperature, "temperature", finite=True)
    return dispatch.run("softmax", softmax_reference, x, dim, mask, temperature=temperature)


def softmax_reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                      temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """:func:`softmax` in plain PyTorch: what the kernels and the aten path are checked against."""
    rows = prepare_rows(x, dim, mask)
    p = softmax_rows(_over_temperature(rows, temperature), rows.visible)
    return rows.restore(rows.zero_invisible(p))


def log_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Logarithm of :func:`softmax`, computed stably.

    .. math:: \log \mathrm{softmax}(x)_i = x_i/T - m - \log \sum_j e^{x_j/T - m}

    Masked entries (and every entry of a row with nothing visible) are ``-inf``, the
    logarithm of their probability 0, with zero gradient.
    """
    if mask is None and type(temperature) is float and temperature == 1.0:
        out = dispatch.softmax_lane(x, dim, log=True)
        if out is not None:
            return out
    check_positive(temperature, "temperature", finite=True)
    return dispatch.run("log_softmax", log_softmax_reference, x, dim, mask, temperature=temperature)


def log_softmax_reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                          temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """:func:`log_softmax` in plain PyTorch."""
    rows = prepare_rows(x, dim, mask)
    z = _over_temperature(rows, temperature)
    if isinstance(temperature, torch.Tensor) or temperature < 1:
        return rows.restore(_log_softmax_keeping_overflowed(rows, z))
    return rows.restore(log_softmax_rows(z, rows.visible))


class _FloorPassingGradient(torch.autograd.Function):
    """``z`` with ``finfo.min`` at ``where``, whose gradient passes to ``z`` unchanged."""

    @staticmethod
    def forward(ctx, z, where):
        return z.masked_fill(where, torch.finfo(z.dtype).min)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _log_softmax_keeping_overflowed(rows: Rows, z: torch.Tensor) -> torch.Tensor:
    """:func:`log_softmax_rows` of ``z = x / T``, where a finite score whose ``z`` overflowed
    to ``-inf`` (``(x - max) / T`` beyond ``finfo.max``: a ``finfo.min`` fill over ``T < 1``)
    is not a ``-inf`` score: its log-probability is ``-inf`` (as the exact value rounds), but
    its gradient is ``g_j / T`` and its ``g_j`` counts in the row's sum, as in float64, where
    ``z`` is finite. (Computed on ``z`` floored at ``finfo.min``, then moved to ``-inf`` by a
    constant.)"""
    overflowed = rows.visible & torch.isfinite(rows.safe_x) & (z == float("-inf"))
    if not (can_branch_on(z) and z.requires_grad and bool(overflowed.any())):
        return log_softmax_rows(z, rows.visible)
    out = log_softmax_rows(_FloorPassingGradient.apply(z, overflowed), rows.visible)
    return out + torch.zeros_like(out).masked_fill(overflowed, float("-inf"))


def logsumexp(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
              keepdim: bool = False) -> torch.Tensor:
    r"""Log-sum-exp over the visible entries of ``dim``.

    .. math:: \mathrm{LSE}(x) = m + \log \sum_j e^{x_j - m}, \quad m = \max_j x_j

    A row with nothing visible gives ``-inf`` (the log of an empty sum), with zero gradient.
    """
    if type(keepdim) is not bool:
        keepdim = check_bool(keepdim, "keepdim")
    if mask is None:
        out = dispatch.logsumexp_lane(x, dim, keepdim)
        if out is not None:
            return out
    return dispatch.run("logsumexp", logsumexp_reference, x, dim, mask, keepdim=keepdim)


def logsumexp_reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                        keepdim: bool = False) -> torch.Tensor:
    """:func:`logsumexp` in plain PyTorch."""
    check_bool(keepdim, "keepdim")
    rows = prepare_rows(x, dim, mask)
    z = torch.where(rows.visible, rows.x, rows.safe_x)
    return rows.restore(logsumexp_rows(z, rows.visible), reduced=True, keepdim=keepdim)


def scale_by_temperature(x: torch.Tensor, temperature: Any) -> torch.Tensor:
    """``g(x) = x / T``."""
    return x / temperature


def d_scale_by_temperature(x: torch.Tensor, temperature: Any) -> torch.Tensor:
    """``dg/dx = 1 / T``."""
    return torch.ones_like(x) / temperature


def _is_plain_softmax(params: Any) -> Any:
    t = params.get("temperature", 1.0)
    return 1.0 if not isinstance(t, torch.Tensor) and t == 1.0 else None


def _inverse_temperature(params: Any) -> float | None:
    t = params.get("temperature", 1.0)
    return None if isinstance(t, torch.Tensor) else 1.0 / float(t)


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``g(x) = x / T`` for the fused Triton attention (parameters packed: ``T``)."""
    import triton
    global tl
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    @triton.jit
    def g(x, n, par):
        return x * (1.0 / tl.load(par))

    @triton.jit
    def dg(x, n, par):
        return tl.full(x.shape, 1.0, tl.float32) / tl.load(par)

    @triton.jit
    def dpar(x, n, par, K: tl.constexpr):
        t = tl.load(par)
        return -x / (t * t)

    return TritonPieces(fn=g, dfn=dg, dpar=dpar, values=lambda params: (params["temperature"],))


@functools.cache
def _numba_pieces():
    """``g(x) = x / T``, ``dg = 1 / T`` for the CPU fused attention's row kernels (packed: ``T``)."""
    from numba import njit

    from ..kernels.cpu._intrinsics import cast_like
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def g(x, n, par):
        return x / par[0]

    @njit(cache=True, inline="always")
    def dg(x, n, par):
        return cast_like(1.0, x) / par[0]

    return NumbaPieces(fn=g, dfn=dg, values=lambda params: (params["temperature"],))


SPEC = builtin(
    softmax, form=SoftmaxOf(g=scale_by_temperature, dg=d_scale_by_temperature, linear_factor=_inverse_temperature,
                   linear=True),
    triton=_triton_pieces,
    numba=_numba_pieces,
    formula="exp(x/T - m) / sum exp(x/T - m)",
    reference="Bridle 1990; temperature: Hinton et al. 2015, arXiv 1503.02531",
    sums_to_one=True, can_be_sparse=False, shift_invariant=True, tsallis_alpha=_is_plain_softmax,
    examples=(
        Example(x=(0.0, 1.0986122886681098), expected=(0.25, 0.75)),
        Example(x=(2.0, 0.0), expected=(0.7310585786300049, 0.2689414213699951), params={"temperature": 2.0}),
        Example(x=(float("inf"), 1.0, float("inf")), expected=(0.5, 0.0, 0.5), note="+inf entries share the mass"),
        Example(x=(float("-inf"), float("-inf")), expected=(0.0, 0.0), note="nothing visible: zeros"),
    ),
)
