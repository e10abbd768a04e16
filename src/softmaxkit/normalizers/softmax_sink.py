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
from ..forms import SoftmaxOf, StreamRule, SumNormalized, identity, one, shifted_exp
from ..registry import Example, Learnable, builtin
from ._generic import finish
from .softmax import infinite_limit, limit_rows


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
        sink: the sink logit ``s``, a number or a tensor with one value per row (size 1 along
            ``dim``, broadcastable to ``x``; per head: ``(H, 1, 1)``); learnable, initialised at 0.
    """
    check_finite(sink, "sink")
    rows = prepare_rows(x, dim, mask)
    s = rows.per_row(sink, "sink") if isinstance(sink, torch.Tensor) else torch.full_like(rows.x[..., :1], sink)
    finite = rows.visible & ~torch.isinf(rows.x)
    xs = torch.where(finite, rows.x, torch.zeros_like(rows.x))
    top = xs.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True) if xs.shape[-1] else s[..., :1]
    c = torch.maximum(top, s).detach()
    e = torch.where(finite, torch.exp(xs - c), torch.zeros_like(xs))
    p = e / (e.sum(-1, keepdim=True) + torch.exp(s - c))
    p = torch.where(limit_rows(rows.x, rows.visible), infinite_limit(rows.x.detach(), rows.visible), p)
    return finish(rows, p)


class SoftmaxSinkRule(StreamRule):
    """``sum e^{x-c} v / (sum e^{x-c} + e^{s-c})``, ``c`` the running maximum of ``x``: the sink
    is one more logit ``s`` with no value, entering only the output (rescaled there by
    ``e^{-max(c, s)}``, so nothing overflows). Its gradient, ``-out p_sink`` per query, comes from
    that one term; with ``z = x - s`` it was ``-sum_j dz_j``, a sum of terms that cancel down to
    ``p_sink`` (float32, a sink weight near 1e-4: a relative error of 2e-4)."""

    def terms(self, p, z, visible, st):
        e = shifted_exp(z, visible, st["c0"])
        return {"num": e, "den": e}

    def output(self, sums, st):
        c, sink = st["c0"], st["params"]["sink"]
        sink = sink if isinstance(sink, torch.Tensor) else torch.full_like(c, float(sink))
        top = torch.maximum(c, sink).detach()
        scale = torch.exp(c - top)
        den = sums["den"] * scale + torch.exp(sink - top)
        # a row that sees nothing (its stand-in c = 0 above a sink below -745 in float64: e^{s - 0}
        # underflows) has num = 0: its output is 0, not 0 / 0
        return sums["num"] * scale / torch.where(den == 0, torch.ones_like(den), den)


def sink_logit(params: Any) -> Any:
    """The sink logit ``s`` (torch side of the numba pieces' ``sink``)."""
    return params["sink"]


def _unit_factor(params: Any) -> float:
    """``g(x) = x``: softmax(1 x) with the sink, which SDPA runs (:mod:`softmaxkit.attention.sdpa`)."""
    return 1.0


@functools.cache
def _numba_pieces():
    """``g(x) = x`` with the sink logit ``s`` (packed) for the CPU fused attention's row kernels:
    ``p_i = e^{x_i - c} / (e^{s - c} + sum_j e^{x_j - c})``, ``c = max(max x, s)``. The gradient of
    ``s`` comes from that logit, ``-p_sink dd`` per row (:func:`sink_logit`): through ``g = x - s``
    it was ``-sum dS``, terms that cancel down to ``p_sink`` (float32, 3000 keys: 1e-2 to 6e-2 relative)."""
    from numba import njit

    from ..kernels.cpu.pieces import NumbaPieces, identity_piece, one_piece

    @njit(cache=True, inline="always")
    def logit(a, par):
        return par[0]

    return NumbaPieces(fn=identity_piece, dfn=one_piece, sink=logit, sink_logit=sink_logit,
                       values=lambda params: (params["sink"],),
                       form=SoftmaxOf(g=identity, dg=one, linear_factor=_unit_factor))


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
