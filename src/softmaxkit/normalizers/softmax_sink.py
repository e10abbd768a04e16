r"""Softmax with a sink: ``e^{x_i} / (e^{s} + sum_j e^{x_j})``, a softmax that may attend to nothing.

The extra term is a logit ``s`` that takes part in the normalisation but has no value, so
a row can put little total weight on its entries instead of dumping it on a "sink" token.
``s = 0`` is Miller's "softmax_1" ("Attention Is Off By One", 2023); learned per head it is
the attention-sink logit of OpenAI's gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b
Model Card", arXiv 2508.10925), after the sink tokens of Xiao et al. (2023), "Efficient
Streaming Language Models with Attention Sinks", arXiv 2309.17453.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .._checks import check_finite
from .._rows import prepare_rows
from ..forms import SoftmaxOf, StreamRule, SumNormalized, one, shifted_exp
from ..registry import Example, Learnable, builtin
from ._generic import finish
from .softmax import infinite_limit


def exp_over_sink(x: torch.Tensor, sink: Any) -> torch.Tensor:
    """``h(x) = e^{x - s}``; with ``eps = 1`` the form is ``h / (sum h + 1)``."""
    return torch.exp(x - sink)


def softmax_sink(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                 sink: float | torch.Tensor = 0.0) -> torch.Tensor:
    r"""Softmax with a sink logit ``s``: weights that sum to at most one.

    .. math:: p_i = \frac{e^{x_i}}{e^{s} + \sum_j e^{x_j}}
              = \frac{e^{x_i - c}}{e^{s - c} + \sum_j e^{x_j - c}},\quad c = \max(s, \max_j x_j)

    computed in the second form, so nothing overflows. ``s = 0`` is Miller's softmax_1
    ("Attention Is Off By One", 2023); a learnable ``s`` per head is gpt-oss's attention
    sink (OpenAI 2025, arXiv 2508.10925; sink tokens: Xiao et al. 2023, arXiv 2309.17453).
    Not shift invariant; a row with nothing visible gives zeros; a visible ``+inf`` takes
    all the weight (shared between ``+inf`` entries).

    Args:
        sink: the sink logit ``s``, a number or a tensor broadcastable to ``x`` (per head:
            ``(H, 1, 1)``); learnable, initialised at 0.
    """
    check_finite(sink, "sink")
    rows = prepare_rows(x, dim, mask)
    s = rows.align(sink, "sink") if isinstance(sink, torch.Tensor) else torch.full_like(rows.x[..., :1], sink)
    finite = rows.visible & ~torch.isinf(rows.x)
    xs = torch.where(finite, rows.x, torch.zeros_like(rows.x))
    top = xs.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True) if xs.shape[-1] else s[..., :1]
    c = torch.maximum(top, s).detach()
    e = torch.where(finite, torch.exp(xs - c), torch.zeros_like(xs))
    p = e / (e.sum(-1, keepdim=True) + torch.exp(s - c))
    p = torch.where((rows.visible & (rows.x == float("inf"))).any(-1, keepdim=True),
                    infinite_limit(rows.x.detach(), rows.visible), p)
    return finish(rows, p)


class SoftmaxSinkRule(StreamRule):
    """``z = x - s``; ``sum e^{z-c} v / (sum e^{z-c} + e^{-c})`` with ``c = max(m, 0)``."""

    def z(self, p, x, st):
        return x - st["params"]["sink"]

    def shift(self, m):
        return m.clamp_min(0.0)

    def terms(self, p, z, visible, st):
        e = shifted_exp(z, visible, st["c0"])
        return {"num": e, "den": e}

    def output(self, sums, st):
        return sums["num"] / (sums["den"] + torch.exp(-st["c0"]))


def minus_sink(x: torch.Tensor, sink: Any) -> torch.Tensor:
    """``g(x) = x - s``: softmax with a sink is ``softmax_of(g)`` plus one more logit ``0`` in the denominator."""
    return x - sink


@functools.cache
def _numba_pieces():
    """``g(x) = x - s`` (packed: ``s``) with the sink logit ``0`` for the CPU fused attention's row
    kernels: ``p_i = e^{g_i - c} / (e^{-c} + sum_j e^{g_j - c})``, ``c = max(max g, 0)``; the
    gradient of ``s`` is that of ``g``, ``-sum dS``."""
    from numba import njit

    from ..kernels.cpu._intrinsics import cast_like
    from ..kernels.cpu.pieces import NumbaPieces

    @njit(cache=True, inline="always")
    def g(x, a, par):
        return x - par[0]

    @njit(cache=True, inline="always")
    def dg(x, a, par):
        return cast_like(1.0, x)

    @njit(cache=True, inline="always")
    def zero_logit(a, par):
        return cast_like(0.0, a)

    return NumbaPieces(fn=g, dfn=dg, sink=zero_logit, values=lambda params: (params["sink"],),
                       form=SoftmaxOf(g=minus_sink, dg=one))


SPEC = builtin(
    softmax_sink, form=SumNormalized(h=exp_over_sink, dh=exp_over_sink, eps=1.0), numba=_numba_pieces,
    formula="e^x / (e^s + sum e^x)",
    reference="Miller 2023 (softmax_1); gpt-oss sinks, OpenAI 2025, arXiv 2508.10925",
    sums_to_one=False, can_be_sparse=False, shift_invariant=False,
    learnable={"sink": Learnable(0.0)}, stream=lambda params: SoftmaxSinkRule(), stream_passes=1,
    examples=(
        Example(x=(0.0, 0.0), expected=(1 / 3, 1 / 3), note="s = 0: one third goes to the sink"),
        Example(x=(0.6931471805599453,), expected=(0.5,), params={"sink": 0.6931471805599453}),
        Example(x=(-1000.0, -1000.0), expected=(0.0, 0.0), note="far below the sink: nothing is attended"),
    ),
)
