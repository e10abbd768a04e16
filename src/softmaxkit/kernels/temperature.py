"""Scores over a temperature, ``x / T``, computed as ``x * (1 / T)``, also where ``1 / T``
overflows the scores' dtype (a float32 ``T`` below about 2.9e-39): there ``0 * inf`` would
be NaN in the product and in its gradient, where a huge finite ``1 / T`` (float64's view of
a float32 input) gives 0."""

from __future__ import annotations

import torch

from .._checks import can_branch_on


def _times_wide(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``x * scale`` rounded once to ``x``'s dtype (computed in float64: a float32 denormal
    times 1e40 is finite), and 0 where ``x`` is 0 (also where ``scale`` is infinite)."""
    wide = x.double() * (scale.double() if isinstance(scale, torch.Tensor) else scale)
    return torch.where(x == 0, torch.zeros_like(x), wide.to(x.dtype))


class _TimesInfinite(torch.autograd.Function):
    """``x * s`` for a reciprocal temperature ``s`` that is infinite in ``x``'s dtype, as
    float64 computes it and rounds it to ``x``'s dtype: ``0 * s = 0``, and the gradient
    ``g * s`` is 0 where ``g`` is 0 (not ``0 * inf = NaN``: the limit of
    ``(1 / T) p_j (g_j - <p, g>)`` as ``T -> 0`` at a probability ``p_j = e^{-(m - x_j) / T}``
    of 0), elsewhere the float64 product, finite or ``+-inf``. (A float64 ``x`` whose ``1 / T``
    is inf gets the limit: 0 or ``+-inf``.) Forward mode and ``torch.func`` transforms (the
    context set apart from the forward, a generated vmap rule) take the same product."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, scale):
        return _times_wide(x, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return _times_wide(grad, ctx.scale), None

    @staticmethod
    def jvp(ctx, dx, _dscale):
        return _times_wide(dx, ctx.scale)


def times_inverse_temperature(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``x / T`` as ``x * scale`` (``scale = 1 / T``, a number or a tensor broadcastable to
    ``x``); where ``scale`` overflows ``x``'s dtype, as a huge finite ``scale`` gives it
    (see :class:`_TimesInfinite`), and where it is below the dtype's normal range, as the
    float64 product rounded once."""
    finfo = torch.finfo(x.dtype)
    if isinstance(scale, torch.Tensor):
        beyond = can_branch_on(x) and not bool(torch.isfinite(scale.to(x.dtype)).all())
        below = can_branch_on(x) and bool(((scale != 0) & (scale.abs() < finfo.tiny)).any())
    else:
        beyond = abs(scale) > finfo.max
        below = 0 < abs(scale) < finfo.tiny
    if not (beyond or below):
        return x * scale
    # (below: a scale that x's dtype rounds to 0 or to a few digits, 1 / T for T above
    # 1 / finfo.tiny: inf * 0 = NaN, where the float64 product keeps an infinite score infinite)
    return _TimesInfinite.apply(x, scale) if x.requires_grad else _times_wide(x, scale)
