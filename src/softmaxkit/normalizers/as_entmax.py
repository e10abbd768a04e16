r"""Adaptive-Scalable entmax (ASEntmax): alpha-entmax of length-scaled scores.

Vasylenko, Pitorro, Martins & Treviso (2025), "Long-Context Generalization with Sparse
Attention", arXiv 2506.16640 (ASEntmax, Sec. 4); ``delta = 1`` follows the authors' code
(github.com/deep-spin/asentmax).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._checks import check_count, check_finite
from .._rows import Rows, prepare_rows
from ..forms import Threshold
from ..registry import Example, Learnable, builtin
from ._entmax import check_alpha, entmax_from_rows


def length_scale(n: Any, beta: Any, gamma: Any, delta: Any) -> Any:
    r"""The scale ``delta + beta (log n)^gamma``, with the length term 0 at ``n = 1``."""
    # a number n in float64 (a float32 log n cost fused and streaming float64 1.8e-8)
    log_n = torch.log(n) if isinstance(n, torch.Tensor) else torch.log(torch.tensor(float(n), dtype=torch.float64))
    longer = log_n > 0
    safe_log_n = torch.where(longer, log_n, torch.ones_like(log_n))
    # (log n)^gamma as e^(gamma log log n), its exponent held below log(finfo.max): a learnable gamma
    # of 42 at n = 4096 (float32) made the scale inf, and (x - top) * inf = NaN at the row's
    # maximum (and 0 * inf in gamma's gradient); a saturated scale is an argmax, as its limit
    big = torch.finfo(safe_log_n.dtype).max
    exponent = gamma * torch.log(safe_log_n)
    ceiling = math.log(big) - 1.0   # (exp of log(finfo.max) itself can round up to inf)
    exponent = torch.where(exponent < ceiling, exponent, torch.full_like(safe_log_n, ceiling))
    length_term = torch.where(longer, torch.exp(exponent), torch.zeros_like(safe_log_n))
    return (delta + beta * length_term).clamp(-big, big)


def scaled(x: torch.Tensor, beta: Any, gamma: Any, delta: Any, n: Any) -> torch.Tensor:
    """``g(x) = (delta + beta (log n)^gamma) x``, kept within the dtype's finite range (a
    ``finfo.min`` mask fill times a scale above 1 would be ``-inf``: a row of such fills
    then keeps its uniform weights, as the reference's ``(x - max x)`` scaling gives). A
    finite score held at the range's end keeps its gradient, the scale (the reference's,
    whose ``(x - max x)`` does not saturate): a clamp there passed none."""
    big = torch.finfo(x.dtype).max
    scale = length_scale(n, beta, gamma, delta)
    y = x * scale
    inside = y.abs() <= big   # (False at +-inf and NaN)
    finite = torch.isfinite(x)
    held = torch.where(finite, x - x.detach(), torch.zeros_like(x)) * scale.detach()   # 0, gradient the scale
    return torch.where(inside | ~finite, y, y.clamp(-big, big) + held)


def d_scaled(x: torch.Tensor, beta: Any, gamma: Any, delta: Any, n: Any) -> torch.Tensor:
    """``dg/dx = delta + beta (log n)^gamma``."""
    return torch.ones_like(x) * length_scale(n, beta, gamma, delta)


def _row_count(rows: Rows, n: Any) -> torch.Tensor:
    """``n`` per row, shape ``(..., 1)`` in rows layout: the visible count by default."""
    check_count(n)
    if n is None:
        return rows.count.clamp_min(1)
    if isinstance(n, torch.Tensor):
        return rows.per_row(n.to(rows.x.dtype), "n")
    return torch.full_like(rows.x[..., :1], float(n))


def as_entmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
              alpha: float | torch.Tensor = 1.5, beta: float | torch.Tensor = 1.0,
              gamma: float | torch.Tensor = 1.0, delta: float | torch.Tensor = 1.0,
              n: int | torch.Tensor | None = None) -> torch.Tensor:
    r"""Adaptive-Scalable entmax (ASEntmax): alpha-entmax of length-scaled scores.

    .. math:: \mathrm{ASEntmax}(x) = \alpha\text{-entmax}\big((\delta + \beta\,(\log n)^{\gamma})\, x\big)

    ``n`` is the number of visible entries of the row by default (causal attention passes
    ``n = i + 1`` for query ``i``); an int or a per-row tensor overrides it. At ``n = 1``
    the length term ``(log n)^gamma`` is taken as 0 (its limit for gamma > 0), so the
    scale is ``delta``. In the paper ``beta > 0`` and ``gamma`` are learned, per head or
    computed from the query (``beta = softplus(w_b . h)``, ``gamma = a tanh(w_g . h)``);
    here ``beta``, ``gamma`` and ``delta`` are numbers or tensors with one value per row
    (broadcastable to ``x``, size 1 along ``dim``: per query, or ``(H, 1, 1)`` per head),
    differentiable, and ``alpha`` is as in :func:`softmaxkit.entmax`. ``delta = 0, gamma = 1``
    gives alpha-entmax of ``beta log(n) x``, the scalable-softmax law of Nakanishi (2025).
    Shift invariant (the scale is constant along the row). Streams in attention (threshold
    search) when alpha is a number in (1, 2] and the other parameters are per head.

    Vasylenko, Pitorro, Martins & Treviso (2025), "Long-Context Generalization with Sparse
    Attention", arXiv 2506.16640 (ASEntmax, Sec. 4); ``delta = 1`` follows the authors' code
    (github.com/deep-spin/asentmax), which offsets positions so that ``n >= 2``.
    """
    check_alpha(alpha)
    for name, value in (("beta", beta), ("gamma", gamma), ("delta", delta)):
        check_finite(value, name)
    rows = prepare_rows(x, dim, mask)
    beta, gamma, delta = (rows.per_row(v, name) if isinstance(v, torch.Tensor) else v
                          for name, v in (("beta", beta), ("gamma", gamma), ("delta", delta)))
    top_scale = torch.finfo(rows.x.dtype).max   # (a float64 scale past it would round to inf with x)
    scale = length_scale(_row_count(rows, n), beta, gamma, delta).clamp(-top_scale, top_scale)
    # The scale is constant along the row and entmax is shift invariant, so the row maximum
    # is taken out before scaling: large scores keep their differences exactly.
    finite = rows.visible & torch.isfinite(rows.x)
    top = torch.where(finite, rows.x, torch.full_like(rows.x, float("-inf"))).amax(-1, keepdim=True) \
        if rows.x.shape[-1] else rows.x.new_zeros(rows.x.shape[:-1] + (1,))
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    gaps = ((torch.where(finite, rows.x, top) - top) * scale).clamp(-top_scale, top_scale)   # finite, as `scaled`
    z = torch.where(finite, gaps, rows.x)
    return entmax_from_rows(rows, z, alpha)


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def _triton_pieces():
    """``g(x) = (delta + beta (log n)^gamma) x`` for the fused Triton threshold kernel
    (packed: ``beta, gamma, delta``; the length term is 0 at ``n = 1``)."""
    global tl
    import triton
    import triton.language as tl

    from ..kernels.gpu.pieces import TritonPieces

    # (Triton's interpreter resolves a piece's callees among module globals only, so the
    # length term (log n)^gamma, 0 at n = 1, is written out in each piece)
    @triton.jit
    def g(x, n, par):
        log_n = tl.log(n)
        term = tl.where(log_n > 0, tl.exp(tl.load(par + 1) * tl.log(tl.where(log_n > 0, log_n, 1.0))), 0.0)
        return x * (tl.load(par + 2) + tl.load(par) * term)

    @triton.jit
    def dg(x, n, par):
        log_n = tl.log(n)
        term = tl.where(log_n > 0, tl.exp(tl.load(par + 1) * tl.log(tl.where(log_n > 0, log_n, 1.0))), 0.0)
        return tl.zeros(x.shape, tl.float32) + tl.load(par + 2) + tl.load(par) * term

    @triton.jit
    def dpar(x, n, par, K: tl.constexpr):
        log_n = tl.log(n)
        safe_log = tl.log(tl.where(log_n > 0, log_n, 1.0))
        term = tl.where(log_n > 0, tl.exp(tl.load(par + 1) * safe_log), 0.0)
        if K == 0:
            out = x * term
        elif K == 1:
            out = x * tl.load(par) * term * safe_log
        else:
            out = x + tl.zeros(term.shape, tl.float32)
        return out

    return TritonPieces(fn=g, dfn=dg, dpar=dpar, values=lambda params: (params["beta"], params["gamma"],
                                                                       params["delta"]), uses_n=True)


SPEC = builtin(
    as_entmax, form=Threshold(alpha=lambda params: params["alpha"], g=scaled, dg=d_scaled),
    triton=_triton_pieces,
    formula="entmax_alpha((delta + beta (log n)^gamma) x)",
    reference="Adaptive-Scalable Entmax, Vasylenko, Pitorro, Martins & Treviso 2025, arXiv 2506.16640",
    sums_to_one=True, can_be_sparse=True, shift_invariant=True,
    learnable={"alpha": Learnable(1.5, low=1.0, high=2.0), "beta": Learnable(1.0), "gamma": Learnable(1.0)},
    examples=(
        Example(x=(1.0, 0.0), expected=(1.0, 0.0), params={"alpha": 2.0, "beta": 1.0, "gamma": 1.0, "delta": 1.0},
                note="scale 1 + log 2 > 1 puts the gap past sparsemax's support"),
        Example(x=(0.5, 0.0), expected=(0.75, 0.25), params={"alpha": 2.0, "delta": 1.0, "beta": 0.0}),
    ),
)
