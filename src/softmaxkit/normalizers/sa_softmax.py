r"""Self-Adjust Softmax (SA-Softmax): ``x ⊙ softmax(x)``, or its range-normalised form.

Zheng et al. (2025), "Self-Adjust Softmax", arXiv 2502.18277.

Not one of the four forms (the softmax weights are multiplied by a function of the score
and, when normalized, of the row's range): it streams through its own rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .._checks import can_branch_on, check_bool, check_positive
from .._rows import prepare_rows
from ..forms import SoftmaxOf, StreamRule, identity, safe_div, shifted_exp
from ..forms import one as forms_one
from ..registry import Example, builtin
from ._generic import finish
from .softmax import softmax_rows


def sa_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
               normalized: bool = False, eps: float = 1e-6) -> torch.Tensor:
    r"""Self-Adjust Softmax (SA-Softmax).

    .. math::
        \text{plain: } x \odot \mathrm{softmax}(x) \qquad
        \text{normalized: } \frac{x - \min(x_{\min}, 0)}{\max(0, x_{\max}) - \min(x_{\min}, 0) + \varepsilon}
        \odot \mathrm{softmax}(x)

    with ``x_min``, ``x_max`` over the visible entries of the row. The output does not
    sum to one (plain SA-Softmax can be negative). Zheng et al. (2025), "Self-Adjust
    Softmax", arXiv 2502.18277.
    """
    check_bool(normalized, "normalized")
    check_positive(eps, "eps", allow_tensor=False, finite=True)
    rows = prepare_rows(x, dim, mask)
    scale = _gradient_scale(rows) if not normalized else None
    if scale is not None:
        rows = dataclasses.replace(rows, x=_ScaleGradient.apply(rows.x, scale))
    xs = rows.safe_x
    p = softmax_rows(torch.where(rows.visible, rows.x, xs), rows.visible)
    if not normalized:
        # where p = 0 (e.g. a finfo.min fill next to ordinary scores) the output is 0 whatever
        # x is: multiplying by x there would put x * dL/dy (overflowing) times p = 0, NaN, into
        # the softmax backward of the whole row
        y = torch.where(p > 0, xs, torch.zeros_like(xs)) * p
        return finish(rows, y if scale is None else _ScaleGradient.apply(y, 1 / scale))
    low = rows.masked_min().clamp_max(0.0)
    high = rows.masked_max().clamp_min(0.0)
    # a row holding +inf: the ratio's limit is 1 at the +inf scores, 0 elsewhere, a constant
    # (inf / inf gave NaN, in the output and the gradient)
    infinite = xs == float("inf")
    limit = infinite.any(-1, keepdim=True)
    zero = torch.zeros((), dtype=xs.dtype, device=xs.device)
    xs, high = torch.where(limit, zero, xs), torch.where(limit, zero, high)
    # halves (exact): high - low and x - low overflow past finfo.max / 2 (3e38 and -3e38 gave inf / inf)
    ratio = (xs * 0.5 - low * 0.5) / (high * 0.5 - low * 0.5 + eps * 0.5)
    ratio = torch.where(limit, infinite.to(ratio.dtype), ratio)
    return finish(rows, ratio * p)


class _ScaleGradient(torch.autograd.Function):
    """The identity, whose backward multiplies the gradient by ``scale`` (a power of two per row)."""

    @staticmethod
    def forward(ctx, t, scale):
        ctx.save_for_backward(scale)
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale, None


def _gradient_scale(rows) -> torch.Tensor | None:
    """Per row, a power of two ``s`` that the backward of plain SA-Softmax divides the incoming
    gradient by (and multiplies the result by), or None where no row needs one or no gradient is
    recorded. The backward of ``x p`` sends ``g x`` into the softmax's backward, which overflows
    when ``|x|`` is near finfo.max (a row of finfo.min mask fills: ``inf - inf = NaN``) although
    the gradient itself, ``p (g + g x - <p, g x>)``, is finite. ``s`` is ``2^-B`` times the row's
    largest visible ``|x|``, with ``B`` a quarter of the dtype's exponent range, so that ``g / s``
    neither overflows nor leaves the normal range for any ``|g|`` within ``2^+-B``."""
    if not (torch.is_grad_enabled() and rows.x.requires_grad):
        return None
    maxexp = math.frexp(torch.finfo(rows.x.dtype).max)[1]   # 128, 1024
    quarter = maxexp // 4
    top = rows.x.detach().abs().masked_fill(~rows.visible | torch.isinf(rows.x.detach()), 0.0)
    top = top.amax(-1, keepdim=True) if top.shape[-1] else top.new_zeros(top.shape[:-1] + (1,))
    if not can_branch_on(top) or not bool((top > 2.0 ** quarter).any()):
        return None
    _, exponent = torch.frexp(top)
    return torch.ldexp(torch.ones_like(top), (exponent - quarter).clamp(0, maxexp - 1).to(top.dtype))


class SASoftmaxRule(StreamRule):
    """``sum x e^{x-c} v / sum e^{x-c}``, and normalized, that times an affine map of ``x``. Both
    split into two value sums, ``S_1 = sum (x - c) e^{x-c} v`` and ``S_0 = sum e^{x-c} v``, the first
    taken relative to the running shift ``c`` (the row maximum so far) so that it never overflows:
    where ``e^{x-c} > 0``, ``x - c`` lies within the exponent's range of 0. Plain: ``S_1 / S + c S_0 / S``
    (summing ``x e^{x-c} v`` itself overflowed on a row of finfo.min fills, whose output ``c S_0 / S``
    is finite). Normalized: ``S_1 / (S r) + (c - low) / r * S_0 / S`` with ``r = high - low + eps``,
    where ``0 <= c - low <= r``: no cancellation between huge terms (a row of finfo.min fills gave
    ``inf - inf = NaN``), and no overflow before the division by ``r``."""

    value_terms = (frozenset({"num", "num0"}),)

    def __init__(self, normalized: bool = False):
        self.normalized = normalized
        self.max_grad = self.min_grad = normalized

    def terms(self, p, z, visible, st):
        e = shifted_exp(z, visible, st["c0"])
        # z only where e > 0, as in the reference: a finfo.min fill (e = 0) times an incoming
        # gradient overflows, and inf * 0 = NaN in exp's backward
        return {"num": torch.where(e > 0, z - st["c0"], torch.zeros_like(z)) * e, "num0": e, "den": e}

    def rescaled(self, sums, alpha, c_old, c_new):
        # sum (x - c_new) e = sum (x - c_old) e + (c_old - c_new) sum e, times alpha
        sums = {**sums, "num": sums["num"] + (c_old - c_new) * sums["num0"]}
        return super().rescaled(sums, alpha, c_old, c_new)

    def output(self, sums, st):
        shifted = safe_div(sums["num"], sums["den"])
        mean = safe_div(sums["num0"], sums["den"])
        c = torch.where(sums["den"] > 0, st["c0"], torch.zeros_like(st["c0"]))
        if not self.normalized:
            return shifted + c * mean
        low = st["mn0"].clamp_max(0.0) * 0.5   # halves, as in sa_softmax
        high = st["m0"].clamp_min(0.0) * 0.5
        spread = high - low + st["params"]["eps"] * 0.5
        return (shifted * 0.5) / spread + (c * 0.5 - low) / spread * mean


@functools.cache
def _numba_pieces():
    """Plain SA-Softmax for the CPU fused attention's row kernels: ``softmax_of`` with ``g(x) = x``
    and the numerator factor ``w(x) = x`` (the normalized variant keeps its stream rule)."""
    from ..kernels.cpu.pieces import NumbaPieces, identity_piece, one_piece

    return NumbaPieces(fn=identity_piece, dfn=one_piece, factor=identity_piece, dfactor=one_piece,
                       form=SoftmaxOf(g=identity, dg=forms_one),
                       accepts=lambda params: not params["normalized"])


SPEC = builtin(
    sa_softmax, form=None, numba=_numba_pieces,
    formula="x * softmax(x)  (normalized: rescaled x * softmax(x))",
    reference="Self-Adjust Softmax, Zheng et al. 2025, arXiv 2502.18277",
    # (exact zeros: at x = 0, and normalized at a row's negative minimum)
    sums_to_one=False, can_be_sparse=True, shift_invariant=False, can_be_negative=True,
    stream=lambda params: SASoftmaxRule(bool(params["normalized"])), stream_passes=1,
    examples=(
        Example(x=(0.0, 1.0986122886681098), expected=(0.0, 0.8239592165010823)),
        Example(x=(-1.0, 1.0), expected=(0.0, 0.8807970779778823 / (2 + 1e-6) * 2), params={"normalized": True}),
    ),
)
