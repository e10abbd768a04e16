r"""Fused attention: query blocks against whole visible key rows, closed-form backward per family.

For each batch entry, group of heads and block of ``block_q`` queries, the score tile
``S = (q scale) k^T`` over every key the block can see is one ``torch.matmul`` into a
reused buffer, the normalizer's elementwise work runs on that tile in place where it can,
and ``P v`` is a second ``torch.matmul``. The tile holds whole rows, so nothing is
rescaled online, and its size is bounded by :data:`TILE_ELEMENTS` (extra memory
``O(block_q * Lk)``, never ``Lq x Lk``). GEMMs stay in torch (BLAS with its own threads);
only the elementwise work is ours. Measured against the alternatives in
``softmaxkit bench attention`` (the issue-13 note): numba tile kernels calling BLAS oversubscribe
threads, and the streaming engine's online rescaling and autograd backward cost 1.5-4x.

On the CPU, in eager mode, for float32/float64 and a one-pass family (``softmax_of``,
``sum_normalized``, ``elementwise``) whose normalizer declares numba pieces
(``NormalizerSpec.numba``), the elementwise work of forward and backward is one call per tile
to a numba row kernel of the family (:mod:`softmaxkit.kernels.cpu.attention`): each row is
mapped, reduced and rewritten while it stays in L1, instead of one pass over the tile per
torch operation (L=4096, H=4, D=64, causal, 2 threads, loaded machine: ssmax forward 1.85x
-> 1.32x SDPA, forward+backward 1.78x -> 1.27x; stablemax 5.6x -> 1.1x). Tiles are then
:data:`ROW_KERNEL_TILE_ELEMENTS` large (all heads of a query block in one GEMM). Other
normalizers, devices, dtypes and traced calls keep the torch operations below. A ``weight``
piece (``p = w / sum w`` without the row's maximum: StableMax) underflows on a row of
``finfo.min`` mask fills; such rows are redone through ``g`` and the maximum
(:func:`_shifted_rows_forward`).

The backward pass recomputes the tile (FlashAttention, Dao et al. 2022, arXiv
2205.14135) and applies the closed-form gradient of the normalizer's family, read from its
form (:mod:`softmaxkit.forms`): with ``dP = dO v^T`` and ``D = rowsum(dO * O)``,

* ``softmax_of`` ``p = softmax(g(S))``: ``dS = dg(S) * p * (dP - D)``;
* ``sum_normalized`` ``p = h / (sum h + eps)``: ``dS = dh(S) * (dP - D) / (sum h + eps)``;
* ``elementwise`` ``p = h(S)``: ``dS = dh(S) * dP``;
* ``threshold`` ``p = alpha-entmax(g(S))`` with ``s = p^{2 - alpha}`` on the support:
  ``dS = dg(S) * (s * dP - s * sum(s dP) / sum(s))`` (Peters, Niculae & Martins 2019,
  arXiv 1905.05702); the threshold of each row is solved on the block's rows by the
  alpha-entmax row kernels (numba on CPU) and kept for the backward pass, which rebuilds
  ``p`` from it.

``dq = dS k scale``, ``dk = dS^T q scale``, ``dv = p^T dO``. Tensor parameters (one value
per head, broadcastable to ``(B, H, 1, 1)``; a parameter of ``size`` values carries them
on a leading axis) get their gradient from autograd on the piece (``g`` or ``h``) of each
tile, weighted by the gradient of its output.

A normalizer with its own stream rule whose numba pieces still compute it exactly
(:func:`kernel_form`) takes the row kernels of a family with an extra, where they run
(:func:`row_kernels_apply`): SA-Softmax ``x softmax(x)`` (``softmax_of`` with a numerator
factor, ``dS = q (dg (w dP - D) + dw dP)``, ``q = softmax(g)``), softmax with a sink
(``softmax_of`` of ``g = x - s`` with one more logit ``0`` in the denominator; ``dS = p (dP -
D)``, the sink's gradient by autograd on ``g``: ``-sum dS``), softpick (signed
``sum_normalized`` ``relu(a) / (sum |a| + eps e^{m-c})``, ``a = e^{x-c} - e^{-c}``,
``c = max(m, 0)``: ``dS = e^{x-c} ([a > 0] dP - sign(a) D) / den``, and ``- eps e^{m-c} D /
den`` at the row maximum, shared between ties).

A normalizer that is not exactly one of those forms otherwise (its own stream rule: adaptive
softmax, clipped softmax, SA-Softmax's normalized variant, and the three above off the
kernels; or no form: sparse_softmax; or a tensor alpha) runs in ``rows`` mode: its reference
function on the block's rows (whole rows, so exact, top-k included) and, backward, autograd
through that reference on the recomputed tile. Still ``O(block_q * Lk)`` memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import forms
from ..forms import Elementwise, SoftmaxOf, SumNormalized
from ..kernels import memory
from ..kernels.entmax_grad import centered
from ..registry import NormalizerSpec
from .inputs import AttentionInputs
from .streaming import double_backward_error

#: Elements of one score tile (``heads x block_q x keys``): 2^20 float32 = 4 MiB, which
#: stays in a core's L2/L3 share on the machines measured; larger tiles were slower.
TILE_ELEMENTS = 1 << 20
#: The tile budget when the numba row kernels do the elementwise work (:mod:`softmaxkit.kernels.cpu.attention`):
#: they keep each row in L1, so the tile need not fit a cache, and larger GEMMs (all heads of a
#: block at once) were faster (L=4096, H=4: 16 MiB tiles 1.49x SDPA forward, 4 MiB 1.91x).
ROW_KERNEL_TILE_ELEMENTS = 1 << 22
#: The query block is at most this many rows, and at least :data:`MIN_BLOCK_Q` (shorter
#: blocks make the GEMMs inefficient and the Python loop dominate).
MAX_BLOCK_Q = 256
MIN_BLOCK_Q = 32
KINDS = ("softmax_of", "sum_normalized", "elementwise", "threshold", "rows")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numba_pieces(spec: NormalizerSpec, params: dict) -> Any:
    """The normalizer's :class:`~softmaxkit.kernels.cpu.pieces.NumbaPieces` when they compute it
    with ``params`` (defaults filled in), else None."""
    if spec.numba is None:
        return None
    pieces = spec.numba()
    return pieces if pieces.accepts(params) else None


def kernel_form(spec: NormalizerSpec, params: dict) -> Any:
    """The form the numba row kernels compute for ``spec`` with ``params`` when the normalizer
    has its own stream rule or no form but declares numba pieces that compute it exactly
    (SA-Softmax, softmax with a sink, softpick); None otherwise. Extras the torch form lacks
    (a sink logit, a factor, the signed variant) take no learnable tensor parameter there
    except through the form's own piece."""
    if spec.stream is None and spec.form is not None:
        return None
    pieces = numba_pieces(spec, params)
    if pieces is None:
        return None
    form = pieces.form if pieces.form is not None else spec.form
    if not isinstance(form, (SoftmaxOf, SumNormalized, Elementwise)):
        return None
    extras = pieces.factor is not None or (isinstance(form, SumNormalized) and form.signed)
    if extras and any(isinstance(val, torch.Tensor) for val in params.values()):
        return None
    return form


def kind_for(spec: NormalizerSpec, params: dict, kernels: bool = False) -> str:
    """How the fused path computes ``spec`` with ``params`` (defaults filled in): its family's
    closed form, or ``"rows"`` (reference per block, autograd backward). ``kernels``: the numba
    row kernels can run (:func:`row_kernels_apply`); then a normalizer with its own stream rule
    whose numba pieces compute it exactly (:func:`kernel_form`) takes their family."""
    form = spec.form
    if kernels:
        own = kernel_form(spec, params)
        if own is not None:
            if isinstance(own, SumNormalized):
                return "sum_normalized" if _number(own.epsilon(params)) else "rows"
            return own.family
    if spec.stream is not None or form is None:
        return "rows"
    if isinstance(form, SoftmaxOf):
        return "softmax_of" if form.passes == 1 else "rows"
    if isinstance(form, SumNormalized):
        return "rows" if form.signed or not _number(params.get("eps", 0.0)) else "sum_normalized"
    if isinstance(form, Elementwise):
        return "elementwise"
    alpha = form.alpha(params)
    return "threshold" if _number(alpha) and alpha > 1.0 else "rows"


def auto_prefers(spec: NormalizerSpec, params: dict, streams: bool, kernels: bool = False) -> bool:
    """Whether ``method="auto"`` should take the fused path on the CPU (above the dense size).

    Yes for the four forms (closed-form backward: 1.5-4x faster than streaming, measured by
    ``softmaxkit bench attention``), and, where the row kernels run (``kernels``,
    :func:`row_kernels_apply`), for the normalizers with their own stream rule whose numba pieces
    compute them (SA-Softmax, softmax with a sink, softpick: 2-3x faster than their stream
    rule); for ``rows`` mode only when the normalizer cannot stream (sparse_softmax, a tensor
    alpha), where it replaces the dense ``Lq x Lk`` matrix: a normalizer's own stream rule
    (adaptive and clipped softmax, and the others without the kernels) was 2-5x faster than
    the reference on row blocks with autograd.
    """
    return kind_for(spec, params, kernels) != "rows" or not streams


def row_kernels_apply(inp: AttentionInputs) -> bool:
    """Whether the numba row kernels can do the tiles' elementwise work: CPU, float32/float64,
    eager (not traced)."""
    return (not torch.compiler.is_compiling() and inp.q.device.type == "cpu"
            and inp.q.dtype in (torch.float32, torch.float64))


# ----------------------------------------------------------------------------------------
# geometry of a block
# ----------------------------------------------------------------------------------------

@dataclass
class _Block:
    """Queries ``r0:r1`` of batch entries ``b0:b1``, heads ``h0:h1``, against keys ``0:c``.

    ``hidden``: bool, True where a score is not visible (None: only the causal triangle, if
    any, which is ``tri`` over columns ``d0:c``). ``count``: visible keys per row (or None
    when not needed); ``empty``: rows that see no key (None when none can).
    """

    b0: int
    b1: int
    h0: int
    h1: int
    r0: int
    r1: int
    c: int
    d0: int
    tri: torch.Tensor | None
    hidden: torch.Tensor | None
    additive: torch.Tensor | None
    count: torch.Tensor | None = None
    empty: torch.Tensor | None = None
    stats: dict = field(default_factory=dict)

    def fill(self, t: torch.Tensor, value: float) -> torch.Tensor:
        """Set the hidden entries of a tile to ``value``, in place."""
        if self.hidden is not None:
            t.masked_fill_(self.hidden, value)
        elif self.tri is not None:
            t[..., self.d0:].masked_fill_(self.tri, value)
        return t


@dataclass
class _Plan:
    kind: str
    spec: NormalizerSpec
    #: the form computed (the spec's, or the one its numba pieces compute: :func:`kernel_form`)
    form: Any
    inp: AttentionInputs
    fixed: dict
    names: list[str]
    sizes: dict
    block_q: int
    heads: int
    needs_count: bool
    #: batch entries per tile (more than one only when a tile holds every head)
    batches: int = 1
    linear: float | None = None
    alpha: float = 2.0
    eps: float = 0.0
    #: the row kernels' pieces (:class:`~softmaxkit.kernels.cpu.pieces.NumbaPieces`), or None
    tiles: Any = None
    #: each head's packed parameters for the row kernels, ``(B, H, P)``
    packed: torch.Tensor | None = None
    #: whether a score may be NaN (:func:`scores_may_be_nan`), found on first use
    _may_be_nan: bool | None = None

    def scores_may_be_nan(self) -> bool:
        if self._may_be_nan is None:
            self._may_be_nan = scores_may_be_nan(self.inp)
        return self._may_be_nan

    def blocks(self):
        inp = self.inp
        b_, h_, lq, lk = inp.shape
        off = lk - lq
        may_be_empty = inp.has_user_mask or (inp.is_causal and off < 0)
        dtype = inp.q.dtype
        # The row kernels see the causal triangle as each row's key limit and count the visible keys
        # from it: without a user mask or a parameter that reads them, the torch masks are not built.
        lean = self.tiles is not None and not self.names and self.fixed.get(forms.COUNT) is None
        triangles: dict = {}
        for r0 in range(0, lq, self.block_q):
            r1 = min(r0 + self.block_q, lq)
            c = min(lk, r1 + off) if inp.is_causal else lk
            if c <= 0:
                continue
            d0, tri = c, None
            if inp.is_causal:
                d0 = max(0, r0 + off + 1)
                if d0 < c and not (lean and not inp.has_user_mask):
                    # row i of the block hides keys d0 + j with j >= i + (d0 - r0 - off - 1) + 1
                    key = (r1 - r0, c - d0, d0 - r0 - off)
                    tri = triangles.get(key)
                    if tri is None:
                        rows = torch.arange(r1 - r0, device=inp.q.device).unsqueeze(-1)
                        tri = triangles[key] = torch.arange(d0 - r0 - off, c - r0 - off, device=inp.q.device) > rows
            for b0 in range(0, b_, self.batches):
                b1 = min(b0 + self.batches, b_)
                for h0 in range(0, h_, self.heads):
                    h1 = min(h0 + self.heads, h_)
                    hidden = additive = None
                    if inp.bool_mask is not None:
                        hidden = ~inp.bool_mask[b0:b1, h0:h1, r0:r1, :c]
                    if inp.additive_mask is not None:
                        additive = inp.additive_mask[b0:b1, h0:h1, r0:r1, :c]
                        inf = additive == float("-inf")
                        hidden = inf if hidden is None else hidden | inf
                    if hidden is not None and tri is not None:
                        hidden = hidden.clone()
                        hidden[..., d0:] |= tri
                    blk = _Block(b0, b1, h0, h1, r0, r1, c, d0, tri, hidden, additive)
                    if (self.needs_count or may_be_empty) and not (lean and hidden is None):
                        if hidden is not None:
                            count = (~hidden).sum(-1, keepdim=True).to(dtype)
                        else:
                            rows = torch.arange(r0, r1, device=inp.q.device, dtype=dtype).view(1, 1, -1, 1)
                            count = (rows + off + 1).clamp(0, c) if inp.is_causal else torch.full_like(rows, c)
                        blk.count = count
                        if may_be_empty:
                            blk.empty = count == 0
                    yield blk


def _slice_param(value: torch.Tensor, size: int, inp: AttentionInputs, blk: _Block) -> torch.Tensor:
    """A per-head tensor parameter (broadcastable to ``(B, H, 1, 1)``, after a leading axis of
    ``size`` values when ``size > 1``) restricted to the block's batch entries and heads."""
    b, h, _, _ = inp.shape
    lead = tuple(value.shape[:1]) if size > 1 else ()
    rest = tuple(value.shape[len(lead):])
    full = value.reshape(lead + (1,) * (4 - len(rest)) + rest).expand(*lead, b, h, 1, 1)
    return full[..., blk.b0:blk.b1, blk.h0:blk.h1, :, :]


def _block_params(plan: _Plan, tensors: dict, blk: _Block) -> dict:
    params = dict(plan.fixed)
    for name, value in tensors.items():
        params[name] = _slice_param(value, plan.sizes.get(name, 1), plan.inp, blk)
    return params


# ----------------------------------------------------------------------------------------
# tiles
# ----------------------------------------------------------------------------------------

class _Buffers:
    """Reused tile storage (no allocation per block; not used while compiling)."""

    def __init__(self, plan: _Plan, count: int):
        self.use = not torch.compiler.is_compiling()
        if self.use:
            b, h, _, lk = plan.inp.shape
            n = min(plan.batches, b) * min(plan.heads, h) * plan.block_q * lk
            q = plan.inp.q
            if q.is_cpu:   # one allocation, written whole each block: huge pages, not a fault per 4 KiB
                whole = memory.empty((count * n,), q.dtype, min_bytes=memory.HUGE_PAGE)
                self.flat = [whole[i * n:(i + 1) * n] for i in range(count)]
            else:
                self.flat = [q.new_empty(n) for _ in range(count)]

    def matmul(self, i: int, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """``alpha (a @ b)`` for a block's ``(batches, heads, ., .)`` slices, into buffer ``i``; the
        GEMM applies ``alpha`` (no scaled copy of ``a``)."""
        if not self.use:
            return torch.matmul(a, b) * alpha if alpha != 1.0 else torch.matmul(a, b)
        shape = a.shape[:-1] + b.shape[-1:]
        out = self.flat[i][:shape.numel()].view(shape)
        if alpha == 1.0:
            return torch.matmul(a, b, out=out)
        flat = out.flatten(0, 1)
        torch.baddbmm(flat, a.flatten(0, 1), b.flatten(0, 1), beta=0.0, alpha=alpha, out=flat)
        return out


def _scores(plan: _Plan, bufs: _Buffers, blk: _Block, slot: int = 0) -> torch.Tensor:
    """``(q scale) k^T (+ additive mask)`` on the block; hidden entries finite (0 where the
    additive mask is ``-inf``), to be filled by the caller. With a linear factor ``a`` folded
    into the scale (``softmax(a x)``), the mask is scaled by ``a`` too: ``a (q k^T scale + mask)``."""
    k = plan.inp.k[blk.b0:blk.b1, blk.h0:blk.h1, :blk.c]
    q = plan.inp.q[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1]
    s = bufs.matmul(slot, q, k.transpose(-1, -2), plan.inp.scale * (plan.linear or 1.0))
    if blk.additive is not None:
        s.add_(blk.additive, alpha=1.0 if plan.linear is None else plan.linear)
        if plan.linear is not None and plan.linear > 1.0:  # a finfo.min fill times a > 1 stays visible
            s.clamp_(min=torch.finfo(s.dtype).min)
        assert blk.hidden is not None  # an additive mask always comes with its hidden entries
        s.masked_fill_(blk.hidden, 0.0)
    return s


def _visible(blk: _Block, like: torch.Tensor) -> torch.Tensor:
    """The full visibility mask of a tile (True = visible)."""
    if blk.hidden is not None:
        return ~blk.hidden.expand(like.shape)
    vis = torch.ones(like.shape, dtype=torch.bool, device=like.device)
    if blk.tri is not None:
        vis[..., blk.d0:] &= ~blk.tri
    return vis


def _weights(plan: _Plan, s: torch.Tensor, blk: _Block, params: dict, v: torch.Tensor | None = None):
    """The attention weights of the tile (``p`` or the unnormalised ``h``), and the row
    divisor the output needs (None: none). Overwrites ``s`` when it can. Given the block's
    values ``v``, the threshold family may return the block's output ``p v`` instead, from each
    row's support (then ``blk.stats["attended"]`` is True)."""
    form, kind = plan.form, plan.kind
    if _applies_piece(plan):
        blk.fill(s, 0.0)
    if kind == "softmax_of":
        assert isinstance(form, SoftmaxOf)  # the kind is the form's family
        z = s if plan.linear is not None else forms.call(form.g, s, params, blk.count)
        blk.fill(z, float("-inf"))
        p = torch.softmax(z, -1)
        if blk.empty is not None:
            p.masked_fill_(blk.empty, 0.0)
        return p, None
    if kind in ("sum_normalized", "elementwise"):
        assert isinstance(form, (SumNormalized, Elementwise))
        f = blk.fill(forms.call(form.h, s, params, blk.count), 0.0)
        if kind == "elementwise":
            return f, None
        den = f.sum(-1, keepdim=True) + plan.eps
        return f, torch.where(den == 0, torch.ones_like(den), den)
    if kind == "threshold":
        assert isinstance(form, forms.Threshold)
        z = s if form.g is forms.identity else forms.call(form.g, s, params, blk.count)
        p, tau = _entmax(z, plan.alpha, blk, v)
        blk.stats["tau"] = tau
        return p, None
    vis = _visible(blk, s)
    return plan.spec.fn(s, dim=-1, mask=vis, **_rows_params(plan, params, s.shape[-1])), None


def _rows_params(plan: _Plan, params: dict, width: int) -> dict:
    """``rows`` mode's parameters for tiles of ``width`` keys. A causal tile stops at the block's
    last visible key, so it can be narrower than the rows the caller's parameters were checked
    against (``Lk``); every visible key is in the tile, so the parameters the normalizer takes
    for rows of that width (:attr:`Param.for_length <softmaxkit.registry.Param.for_length>`:
    sparse_softmax keeps at most the row length) give the same weights."""
    if width >= plan.inp.shape[3]:
        return params
    return {**params, **{n: v for n, v in plan.spec.params_for_length(params, width).items()
                         if params.get(n) is not None}}


def _applies_piece(plan: _Plan) -> bool:
    """Whether the torch operations evaluate the form's piece (``g`` or ``h``) on the score tile.
    They do so on the whole tile and zero the hidden entries afterwards; those are first set to
    0 (:meth:`_Block.fill`), since a hidden raw score can overflow the piece or its derivative
    (``e^{x - 3}`` at a large score past the causal diagonal) and ``inf * 0`` would be NaN."""
    if plan.kind == "softmax_of":
        return plan.linear is None
    if plan.kind == "threshold":
        return plan.form.g is not forms.identity
    return plan.kind in ("sum_normalized", "elementwise")


def _entmax(z: torch.Tensor, alpha: float, blk: _Block,
            v: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """alpha-entmax of the tile's rows and their thresholds ``tau`` (``p = [u z - tau]_+^{1/u}``,
    ``u = alpha - 1``; 0 for a row with nothing visible). On the CPU (float32/float64) the numba
    row kernel: block maxima bound the threshold, only the blocks above the bound are read
    entry by entry, and a causal row is read only up to its last visible key; given ``v`` it
    returns ``p v`` computed from the support (a few entries per row) instead of ``p``, else it
    overwrites ``z`` with ``p``. Elsewhere (or under the reference backend) the reference
    solver on the filled tile, and ``tau`` from each row's largest weight."""
    from ..kernels import dispatch

    compiling = torch.compiler.is_compiling()
    if not compiling and dispatch.plan("entmax", z, -1, None, alpha=alpha) == "numba" and z.is_contiguous():
        return _entmax_kernel(z, alpha, blk, v)
    from ..normalizers.entmax import entmax

    blk.fill(z, float("-inf"))
    # the threshold relative to the row's maximum, as the kernel returns it
    shift = z.amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    blk.stats["shift"] = shift
    if compiling:
        p = entmax_by_bisection(z, alpha)
    elif alpha not in (1.5, 2.0):
        # in float64: the backward forms the support's weights from the threshold, and a
        # float32 threshold loses those near it (dv was 100x the dense path's error at alpha = 5)
        wide = z.double() - shift.double()
        p64 = entmax(wide, alpha=alpha)
        return p64.to(z.dtype), _tau_of(wide, p64, alpha, blk.empty)
    else:
        p = entmax(z, alpha=alpha)
    return p, _tau_of(z - shift, p, alpha, blk.empty)


def _tau_of(z: torch.Tensor, p: torch.Tensor, alpha: float, empty: torch.Tensor | None) -> torch.Tensor:
    """``tau = u max(z) - max(p)^u`` per row (``-inf`` at hidden entries of ``z``; 0 where
    ``empty``)."""
    u = alpha - 1.0
    top_p = p.amax(-1, keepdim=True)
    tau = u * z.amax(-1, keepdim=True) - (top_p if u == 1.0 else top_p ** u)
    if empty is not None:
        tau = torch.where(empty, torch.zeros_like(tau), tau)
    return tau


def _entmax_kernel(z: torch.Tensor, alpha: float, blk: _Block,
                   v: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    from ..kernels.cpu.sparse_functions import entmax_attend, entmax_in_place
    from ..normalizers.entmax import entmax_reference

    c = z.shape[-1]
    stop = _stop(blk, z.shape[:-1])   # causal only: each row's visible prefix
    if stop is None:
        blk.fill(z, float("-inf"))
    attend = v is not None and v.dtype == z.dtype and z.dim() == 4 and z.shape[0] == 1
    if attend:   # (the kernel wrappers give torch back its thread count: kernels.cpu.keep_torch_threads)
        assert v is not None
        out, tau, shift, todo = entmax_attend(z[0], v[0], alpha, None if stop is None else stop[0])
        out, tau, shift, todo = out.unsqueeze(0), tau.unsqueeze(0), shift.unsqueeze(0), todo.unsqueeze(0)
    else:
        tau, shift, todo = entmax_in_place(z, alpha, stop)
    # thresholds relative to each row's maximum (``shift``): exact at huge scores, such as a
    # row of finfo.min mask fills, where u z - tau in the scores' precision lost the support;
    # kept in float64 for the backward kernel, which forms the support's weights as the forward
    tau = tau.to(torch.float64).unsqueeze(-1)
    shift = shift.to(torch.float64).unsqueeze(-1)
    if bool(todo.any()):   # a NaN or a +inf: those rows (the kernel left z as it was) by the reference
        rows = z[todo]
        visible = rows != float("-inf")   # a NaN is visible (and makes its row NaN)
        if stop is not None:
            visible &= torch.arange(c) < stop[todo].unsqueeze(-1)
        rows = rows.masked_fill(~visible, float("-inf"))
        p = entmax_reference(rows, mask=visible, alpha=alpha)
        tau[todo] = _tau_of(rows, p, alpha, ~visible.any(-1, keepdim=True))
        shift[todo] = 0
        if not attend:
            z[todo] = p
        else:
            assert v is not None
            full = torch.zeros_like(z)
            full[todo] = p
            out[todo] = torch.matmul(full, v)[todo]
    blk.stats["attended"] = attend
    blk.stats["shift"] = shift
    return (out if attend else z), tau


def _stop(blk: _Block, shape) -> torch.Tensor | None:
    """Each row's visible prefix when only the causal triangle hides keys (else None)."""
    if blk.hidden is None and blk.tri is not None:
        if blk.d0 > 0:   # d0 = r0 + (Lk - Lq) + 1: row i sees keys below d0 + i
            stop = torch.arange(blk.d0, blk.d0 + blk.tri.shape[0]).clamp_(max=blk.c)
        else:
            stop = blk.d0 + (~blk.tri).sum(-1)
        return stop.expand(shape)
    return None


def _threshold_grad(z: torch.Tensor, dp: torch.Tensor, blk: _Block, alpha: float):
    """``p = [u (z - shift) - tau]_+^{1/u}`` of the tile (thresholds and row maxima from the
    forward) and the gradient
    of the scores ``s * (dp - sum(s dp) / sum(s))``, ``s = p^{2 - alpha}`` on the support;
    overwrites ``z`` and ``dp``. One numba kernel (two passes over each row's visible prefix)
    where the forward used one, else the same in PyTorch ops."""
    from ..kernels import dispatch

    tau, shift = blk.stats["tau"], blk.stats["shift"]
    if (not torch.compiler.is_compiling() and z.is_contiguous() and dp.is_contiguous() and dp.dtype == z.dtype
            and dispatch.plan("entmax", z, -1, None, alpha=alpha) == "numba"):
        from ..kernels.cpu.sparse_functions import entmax_tile_grad

        stop = _stop(blk, z.shape[:-1])
        if stop is None:
            blk.fill(z, float("-inf"))
        entmax_tile_grad(z, dp, alpha, tau, shift, stop)
        return z, dp
    blk.fill(z, float("-inf"))
    u = alpha - 1.0
    if u == 1.0 or u == 0.5:
        base = z.sub_(shift.to(z.dtype)).mul_(u).sub_(tau.to(z.dtype)).clamp_min_(0.0)
        p, sw = (base, (base > 0).to(base.dtype)) if u == 1.0 else (base * base, base)
        total = sw.sum(-1, keepdim=True)
        ds = dp.mul_(sw)
        mean = ds.sum(-1, keepdim=True) / torch.where(total > 0, total, torch.ones_like(total))
        return p, ds.sub_(sw.mul_(mean))
    # any other alpha: the support's weights in float64, as the forward forms them
    base = (z.double() - shift.double()).mul_(u).sub_(tau.double()).clamp_min_(0.0)
    p = (base ** (1.0 / u)).to(z.dtype)
    sw = torch.where(base > 0, base, torch.ones_like(base)) ** (1.0 / u - 1.0)
    sw.masked_fill_(base <= 0, 0.0)
    total = sw.sum(-1, keepdim=True)
    ds = centered(sw, dp.double(), torch.where(total > 0, total, torch.ones_like(total)), dominant=u > 1.0)
    return p, ds.to(dp.dtype)


#: bisection steps of :func:`entmax_by_bisection`: the bracket (width below 1) shrinks to
#: 2^-54, under float64 resolution of the threshold
BISECTION_STEPS = 54


def entmax_by_bisection(z: torch.Tensor, alpha: float) -> torch.Tensor:
    r"""alpha-entmax of rows (``-inf`` = hidden) by a fixed number of bisection steps on the
    threshold, with no data-dependent control flow, so that ``torch.compile`` traces it.

    ``p_j = [u z_j - tau]_+^{1/u}``, ``u = alpha - 1``; ``tau`` lies in
    ``[u m - 1, u m - n^{-u}]`` (``m`` the row maximum, ``n`` the visible count), where
    ``sum_j p_j`` crosses 1 (Peters, Niculae & Martins 2019, arXiv 1905.05702). The weights
    are divided by their sum at the end; a row with nothing visible gives zeros.
    """
    u = alpha - 1.0
    visible = z > float("-inf")
    n = visible.sum(-1, keepdim=True).clamp_min(1).to(z.dtype)
    top = z.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    low_fill = top - 1.0 / u - 1.0  # u (low_fill) - tau < 0 for every tau in the bracket
    w = torch.where(visible, z, low_fill) * u
    lo, hi = u * top - 1.0, u * top - n ** (-u)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        mass = ((w - mid).clamp_min(0.0) ** (1.0 / u)).sum(-1, keepdim=True)
        above = mass >= 1.0
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    p = (w - (lo + hi) / 2).clamp_min(0.0) ** (1.0 / u)
    total = p.sum(-1, keepdim=True)
    return p / torch.where(total > 0, total, torch.ones_like(total))


# ----------------------------------------------------------------------------------------
# the autograd function
# ----------------------------------------------------------------------------------------

def _dv_rows(p: torch.Tensor, den: torch.Tensor | None, dout: torch.Tensor) -> torch.Tensor:
    return torch.matmul(p.transpose(-1, -2), dout if den is None else dout / den)


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: _Plan, q, k, v, *tensors):
        b, h, lq, lk = plan.inp.shape
        shape = (b, h, lq, v.shape[-1])   # written whole: huge pages on the CPU, not a fault per 4 KiB
        out = memory.empty(shape, q.dtype, min_bytes=memory.HUGE_PAGE) if q.is_cpu else q.new_empty(shape)
        # each block writes its rows; the rows in no block are those that see no key
        out[:, :, :lq if lk == 0 else (max(0, lq - lk) if plan.inp.is_causal else 0)] = 0
        params_full = dict(zip(plan.names, tensors))
        bufs = _Buffers(plan, 1)
        blocks = list(plan.blocks())
        block_params = [_block_params(plan, params_full, blk) for blk in blocks]
        with torch.no_grad():
            if plan.tiles is not None:
                for blk, params in zip(blocks, block_params):
                    _tile_meta(plan, blk, params)
            for blk, params in zip(blocks, block_params):
                s = _scores(plan, bufs, blk)
                vb = v[blk.b0:blk.b1, blk.h0:blk.h1, :blk.c]
                if plan.tiles is not None:
                    p, den = _tile_forward(plan, s, blk, params)
                else:
                    p, den = _weights(plan, s, blk, params, vb)
                o = p if blk.stats.get("attended") else torch.matmul(p, vb)
                if den is not None and bufs.use:  # eager: divide straight into the output (no copy)
                    torch.div(o, den, out=out[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1])
                else:
                    out[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1] = o if den is None else o / den
        ctx.plan = plan
        ctx.blocks = blocks
        ctx.save_for_backward(q, k, v, out, *tensors)
        return out

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():  # create_graph=True: the closed forms below build no graph of the gradient
            raise RuntimeError(double_backward_error("fused"))
        plan: _Plan = ctx.plan
        q, k, v, out, *tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad
        dout = dout.contiguous()
        form, kind = plan.form, plan.kind
        leaves = {name: t.detach().requires_grad_(needs[4 + i]) for i, (name, t) in enumerate(zip(plan.names, tensors))}
        wanted = [name for name in plan.names if leaves[name].requires_grad]
        dparams = dict.fromkeys(wanted)
        dq, dk, dv = (memory.empty(t.shape, t.dtype, min_bytes=memory.HUGE_PAGE).zero_() if t.is_cpu
                      else torch.zeros_like(t) for t in (q, k, v))
        factor = plan.inp.scale * (plan.linear or 1.0)
        bufs = _Buffers(plan, 2)
        for blk in ctx.blocks:
            sl = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1))
            d_o = dout[sl[0], sl[1], blk.r0:blk.r1]
            vb = v[sl[0], sl[1], :blk.c]
            kb = k[sl[0], sl[1], :blk.c]
            qb = q[sl[0], sl[1], blk.r0:blk.r1]
            with torch.no_grad():
                params = _block_params(plan, leaves, blk)
            s = _scores(plan, bufs, blk, 0)
            dp = bufs.matmul(1, d_o, vb.transpose(-1, -2))
            if kind == "rows":
                ds, dpar, p = _rows_backward(plan, s, blk, leaves, wanted, dp)
                dv[sl[0], sl[1], :blk.c] += torch.matmul(p.transpose(-1, -2), d_o)
            elif plan.tiles is not None:
                ds, dpar = _tile_backward(plan, s, dp, blk, params, leaves, wanted, d_o,
                                          out[sl[0], sl[1], blk.r0:blk.r1])
                dv[sl[0], sl[1], :blk.c] += torch.matmul(s.transpose(-1, -2), d_o)
            else:
                piece = form.h if kind in ("sum_normalized", "elementwise") else form.g
                dpiece = form.dh if kind in ("sum_normalized", "elementwise") else form.dg
                linear = (kind == "softmax_of" and plan.linear is not None) or \
                         (kind == "threshold" and form.g is forms.identity)
                with torch.no_grad():
                    if _applies_piece(plan):  # as in the forward (_weights): finite pieces at hidden entries
                        blk.fill(s, 0.0)
                    raw = s.clone() if (linear and wanted) else s
                    if kind == "threshold":
                        z = s if linear else forms.call(form.g, s, params, blk.count)
                        p, ds = _threshold_grad(z, dp, blk, plan.alpha)
                        dv[sl[0], sl[1], :blk.c] += torch.matmul(p.transpose(-1, -2), d_o)
                    else:
                        p, den = _weights(plan, s, blk, params)
                        dv[sl[0], sl[1], :blk.c] += _dv_rows(p, den, d_o)
                        o = out[sl[0], sl[1], blk.r0:blk.r1]
                        if kind == "elementwise":
                            ds = dp
                        else:
                            dd = (d_o * o).sum(-1, keepdim=True)
                            ds = dp.sub_(dd)
                            ds = ds.mul_(p) if kind == "softmax_of" else ds.div_(den)
                        if kind != "softmax_of":
                            blk.fill(ds, 0.0)
                    dpar = None
                if wanted:
                    with torch.enable_grad():
                        pblk = _block_params(plan, leaves, blk)
                        scores, ds_held, _ = _param_chain(plan, piece, raw, kind, p, params, blk.count, ds)
                        val = forms.call(piece, scores, pblk, blk.count)
                        dpar = torch.autograd.grad(val, [leaves[n] for n in wanted], ds_held, allow_unused=True)
                if not linear:
                    with torch.no_grad():
                        ds.mul_(forms.call(dpiece, raw, params, blk.count))
            with torch.no_grad():
                # the scale on the small operand, before the product: dS k alone can overflow
                # where dS k scale does not (SA-Softmax's gradients near finfo.max)
                dq[sl[0], sl[1], blk.r0:blk.r1] += torch.matmul(ds, kb * factor)
                dk[sl[0], sl[1], :blk.c] += torch.matmul(ds.transpose(-1, -2), qb * factor)
            if dpar is not None:
                for name, g in zip(wanted, dpar):
                    if g is not None:
                        dparams[name] = g if dparams[name] is None else dparams[name] + g
        return (None, dq if needs[1] else None, dk if needs[2] else None, dv if needs[3] else None,
                *_param_grads(dparams, plan.names, tensors, needs[4:]))


def _finite_scores(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """``softmax_of``: the tile's scores with each infinite entry 0, for the parameters' chain rule.
    The gradient at ``g`` of an infinite score is 0 (a ``+inf`` makes its row the limit, a visible
    ``-inf`` has weight 0), but ``g``'s derivative in a parameter there is infinite
    (``d(s x log n)/ds``), and ``0 * inf`` would make the parameter's gradient NaN. (The other
    families' gradient at ``h`` is not 0 there, and their pieces' derivatives stay finite.)"""
    if kind != "softmax_of":
        return raw
    return torch.where(torch.isinf(raw), torch.zeros_like(raw), raw)


def _param_scores(plan: _Plan, raw: torch.Tensor, kind: str, weights: torch.Tensor) -> torch.Tensor:
    """The scores the parameters' chain rule reads (:func:`_finite_scores`); for a ``softmax(a x)``
    form, relative to each row's score of largest weight (see
    :func:`softmaxkit.forms.shift_invariant_slope_grad`: the same gradient, without the rounding
    of a row of ``finfo.min`` additive-mask fills), and 0 at weight 0, whose gradient is 0
    (``g`` of a fill, ``finfo.min / T``, overflows, and ``x / T``'s derivative in ``T`` would
    be ``0 * inf``)."""
    x = _finite_scores(raw, kind)
    if kind != "softmax_of" or not getattr(plan.form, "linear", False):
        return x
    shifted = forms.relative_to(x, forms.score_at_largest(x, weights, None))
    return torch.where(weights != 0, shifted, torch.zeros_like(shifted))


def _param_chain(plan: _Plan, piece, raw: torch.Tensor, kind: str, weights: torch.Tensor, params: dict, count,
                 grad: torch.Tensor):
    """``(scores, incoming gradient, held)`` of the parameters' chain rule (:func:`_param_scores`).
    For a ``softmax_of`` form that is not linear, an entry whose ``g`` overflowed (MultiMax's
    quadratic term at a ``finfo.min`` fill: held at the range, constant in the parameters, as
    on the dense path) passes the parameters nothing, and its score is 0 there (the
    parameters' derivative at the fill overflows: ``t``'s gradient was about 1e291); ``held``
    marks those entries (None: there are none)."""
    x = _param_scores(plan, raw, kind, weights)
    if kind != "softmax_of" or getattr(plan.form, "linear", False):
        return x, grad, None
    with torch.no_grad():
        held = ~torch.isfinite(forms.call(piece, x, params, count))
    if not bool(held.any()):
        return x, grad, None
    return x.masked_fill(held, 0.0), grad.masked_fill(held, 0.0), held


def _param_grads(dparams: dict, names: list, tensors, needs) -> list:
    """The gradient of each tensor parameter: zeros where it is wanted but no visible score used
    it (empty inputs, every row hidden), so that ``autograd.grad`` sees it used, as in dense."""
    return [(torch.zeros_like(t) if dparams.get(n) is None else dparams[n]) if need else None
            for n, t, need in zip(names, tensors, needs)]


# ----------------------------------------------------------------------------------------
# the numba row kernels (kernels.cpu.attention): one pass over each row of a tile
# ----------------------------------------------------------------------------------------

#: the ``hidden`` argument of the row kernels when only the causal triangle is hidden
_NOTHING_HIDDEN = np.zeros((0, 0), dtype=np.bool_)


def _tile_pieces(spec: NormalizerSpec, kind: str, inp: AttentionInputs, linear: float | None, params: dict):
    """The row kernels' pieces for this call, or None (torch operations on the tile): CPU,
    float32/float64, eager, a one-pass family whose normalizer declares numba pieces that
    compute it with ``params``."""
    if kind not in ("softmax_of", "sum_normalized", "elementwise") or not row_kernels_apply(inp):
        return None
    from ..kernels.cpu.pieces import IDENTITY

    if kind == "softmax_of" and linear is not None:
        return IDENTITY
    return numba_pieces(spec, params)


def _pack(values, inp: AttentionInputs) -> torch.Tensor:
    """Parameters (numbers or tensors broadcastable to ``(B, H, 1, 1)``) as ``(B, H, P)``."""
    b, h, _, _ = inp.shape
    if values and not any(isinstance(v, torch.Tensor) for v in values):   # numbers: one small tensor
        return torch.tensor([float(v) for v in values], dtype=inp.q.dtype, device=inp.q.device).expand(b, h, -1)
    cols = [v.detach().to(dtype=inp.q.dtype, device=inp.q.device) if isinstance(v, torch.Tensor)
            else torch.tensor(float(v), dtype=inp.q.dtype, device=inp.q.device) for v in values]
    cols = [c.reshape((1,) * (4 - c.dim()) + tuple(c.shape)).expand(b, h, 1, 1).reshape(b, h) for c in cols]
    if not cols:
        return inp.q.new_zeros(b, h, 1)
    return torch.stack(cols, -1).contiguous()


def scores_may_be_nan(inp: AttentionInputs) -> bool:
    """Whether a score ``(q k^T) scale + mask`` may be NaN: a NaN or infinite entry of q or k,
    products that may overflow (``max|q| max|k| D scale`` beyond a quarter of the dtype's
    range), or a NaN in an additive mask. One reduction over q and k per call, against a
    pass over every score per tile in the row kernels (``check_nan``)."""
    q, k = inp.q, inp.k
    with torch.no_grad():
        q_max, k_max = largest_magnitude(q), largest_magnitude(k)
        bound = q_max * k_max * q.shape[-1] * abs(inp.scale)
        if not bound < torch.finfo(q.dtype).max / 4:   # (NaN and inf included)
            return True
        return inp.additive_mask is not None and bool(inp.additive_mask.isnan().any())


def largest_magnitude(t: torch.Tensor) -> float:
    """``max |t|`` (NaN if ``t`` holds one; 0 when empty) from one ``aminmax`` pass, without the
    temporary of ``t.abs()`` (whose fresh pages cost more than the reduction)."""
    if t.numel() == 0:
        return 0.0
    extremes = torch.aminmax(t.detach())
    low, high = float(extremes.min), float(extremes.max)
    return high if low != low or high != high else max(-low, high)


def _tile_args(plan: _Plan, s: torch.Tensor, blk: _Block, params: dict):
    """``(s, lim, hidden, cnt, par, rows_per_head, check_nan)`` of the row kernels for the tile ``s``
    (as ``(rows, keys)``); all but ``s`` from :func:`_tile_meta`."""
    nb, nh, rows, c = s.shape
    meta = _tile_meta(plan, blk, params)
    count = _finite_count(plan, s, blk, params, meta[0])
    if count is not None:
        meta = meta[:2] + (count.reshape(-1).numpy(),) + meta[3:]
    return (s.view(nb * nh * rows, c).numpy(),) + meta


def _finite_count(plan: _Plan, s: torch.Tensor, blk: _Block, params: dict, lim: np.ndarray) -> torch.Tensor | None:
    """The visible keys of each row of the tile ``s`` whose score is not ``-inf`` (``(nb, nh, rows, 1)``,
    at least 1, also kept as ``blk.stats["count"]`` for the pieces' torch side), when a score may be
    non-finite (:func:`scores_may_be_nan`: an infinite q or k entry, overflowing products) and the
    pieces read the visible count ``n`` (not given): the reference counts a ``-inf`` score as
    hidden (SSMax's ``s log n``, sigmoid's ``-log n``). Else None."""
    if not plan.needs_count or params.get(forms.COUNT) is not None or not plan.scores_may_be_nan():
        return None
    nb, nh, rows, c = s.shape
    visible = (s != float("-inf")) & (torch.arange(c) < torch.from_numpy(lim).view(nb, nh, rows, 1))
    if blk.hidden is not None:
        visible &= ~blk.hidden
    count = visible.sum(-1, keepdim=True).clamp_min_(1).to(s.dtype)
    blk.stats["count"] = count
    return count


def _count(blk: _Block) -> torch.Tensor | None:
    """The visible count the pieces see on the torch side (:func:`_finite_count` where it applies)."""
    return blk.stats.get("count", blk.count)


def _tile_meta(plan: _Plan, blk: _Block, params: dict) -> tuple:
    """``(lim, hidden, cnt, par, rows_per_head, check_nan)`` of the row kernels for the block's tile,
    kept on the block for the backward pass (numpy: cheaper than torch for these few hundred
    numbers). The forward computes them for every block before the first GEMM: right after a
    tile's GEMM (megabytes written) each of these small Python and numpy steps ran 10-20x
    slower than with warm caches (0.4-0.6 ms a block, measured at L=4096)."""
    kept = blk.stats.get("tile")
    if kept is not None:
        return kept
    nb, nh = blk.b1 - blk.b0, blk.h1 - blk.h0
    rows, c = blk.r1 - blk.r0, blk.c
    heads = nb * nh   # the tile's rows: (batch entry, head, query), one head after another
    dtype = np.float32 if plan.inp.q.dtype == torch.float32 else np.float64
    if plan.inp.is_causal:
        off = plan.inp.shape[3] - plan.inp.shape[2]
        lim = np.clip(np.arange(blk.r0 + off + 1, blk.r1 + off + 1, dtype=np.int64), 0, c)
    else:
        lim = np.full(rows, c, dtype=np.int64)
    if blk.hidden is None and params.get(forms.COUNT) is None:  # the count is the causal prefix
        cnt = np.tile(np.maximum(lim, 1).astype(dtype), heads)
    elif blk.count is not None:
        count = forms.effective_count(params, blk.count)
        cnt = torch.as_tensor(count, dtype=plan.inp.q.dtype).expand(nb, nh, rows, 1).reshape(-1).contiguous().numpy()
    else:  # the pieces do not read n
        cnt = np.ones(heads * rows, dtype=dtype)
    if blk.hidden is not None:
        hidden = blk.hidden.expand(nb, nh, rows, c).reshape(heads * rows, c).contiguous().numpy()
    else:
        hidden = _NOTHING_HIDDEN
    assert plan.packed is not None
    par = plan.packed[blk.b0:blk.b1, blk.h0:blk.h1].reshape(heads, -1).contiguous().numpy()
    kept = (np.tile(lim, heads), hidden, cnt, par, rows, plan.scores_may_be_nan())
    blk.stats["tile"] = kept
    return kept


def _run_kernel(kernel, *args) -> None:
    """Run a row kernel with torch's thread count (numba's OpenMP pool would otherwise reset
    the count torch reads, seen: 1 -> 2, and oversubscribe every later torch operation)."""
    from ..kernels.cpu import keep_torch_threads, sync_threads

    sync_threads()
    keep_torch_threads(kernel, *args)


def _tile_forward(plan: _Plan, s: torch.Tensor, blk: _Block, params: dict):
    """The attention weights of the tile, written over ``s`` by a row kernel, and the row
    divisor of the output (None: none)."""
    from ..kernels.cpu import attention as rows
    from ..kernels.cpu.pieces import no_sink

    pieces, args = plan.tiles, _tile_args(plan, s, blk, params)
    if plan.kind == "elementwise":
        _run_kernel(rows.elementwise_forward, *args, pieces.row, pieces.fn)
        return s, None
    den = s.new_empty(s.shape[:-1] + (1,))
    args = (args[0], den.view(-1).numpy()) + args[1:]
    if plan.kind == "sum_normalized":
        kernel = rows.signed_forward if plan.form.signed else rows.sum_normalized_forward
        _run_kernel(kernel, *args, pieces.row, pieces.fn, _scalar(plan.eps, s))
    elif pieces.factor is not None:
        _run_kernel(rows.factor_forward, *args, pieces.row, pieces.fn, pieces.sink, pieces.factor)
    elif pieces.weight is not None and pieces.sink is no_sink:
        # softmax through w = e^g is w / sum w: the sum-normalized kernel with eps = 0
        _run_kernel(rows.sum_normalized_forward, *args, pieces.row, pieces.weight, _scalar(0.0, s))
        _shifted_rows_forward(plan, s, den, blk, args[2:])
    else:
        _run_kernel(rows.softmax_of_forward, *args, pieces.row, pieces.fn, pieces.sink)
    return s, den


def weight_floor(dtype: torch.dtype) -> float:
    """The smallest row sum ``sum w`` the weight kernels (``p = w / sum w`` without the row's
    maximum) are trusted with: ``sqrt(finfo.tiny)``. Below it the weights are subnormal or 0
    (StableMax's ``1 / (1 - x)`` at a ``finfo.min`` mask fill is ``1 / finfo.max``), ``1 / sum w``
    overflows, and products with the values and gradients lose their digits."""
    return float(torch.finfo(dtype).tiny) ** 0.5


def _meta_rows(meta: tuple, idx: np.ndarray) -> tuple:
    """The row kernels' ``(lim, hidden, cnt, par, rows_per_head, check_nan)`` of rows ``idx`` of a
    tile, as a tile of their own (one row per head)."""
    lim, hidden, cnt, par, rows_per_head, check_nan = meta
    sub_hidden = hidden[idx] if hidden.shape[0] > 0 else hidden
    return lim[idx], sub_hidden, cnt[idx], np.ascontiguousarray(par[idx // rows_per_head]), 1, check_nan


def _score_rows(plan: _Plan, blk: _Block, shape, idx: np.ndarray) -> torch.Tensor:
    """The raw scores of rows ``idx`` of the block's tile (``(rows, keys)``, as :func:`_scores`
    writes them: hidden entries 0), recomputed from q and k."""
    nb, nh, rows, c = shape
    at = torch.from_numpy(idx)
    b, h, i = at // (nh * rows), at // rows % nh, at % rows
    inp = plan.inp
    q = inp.q[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1][b, h, i]
    k = inp.k[blk.b0:blk.b1, blk.h0:blk.h1, :c][b, h]
    s = torch.matmul(k, (q * (inp.scale * (plan.linear or 1.0))).unsqueeze(-1)).squeeze(-1)
    if blk.additive is not None:
        s.add_(blk.additive.expand(shape)[b, h, i], alpha=1.0 if plan.linear is None else plan.linear)
        if plan.linear is not None and plan.linear > 1.0:
            s.clamp_(min=torch.finfo(s.dtype).min)
        assert blk.hidden is not None
        s.masked_fill_(blk.hidden.expand(shape)[b, h, i], 0.0)
    return s.contiguous()


def _shifted_rows_forward(plan: _Plan, s: torch.Tensor, den: torch.Tensor, blk: _Block, meta: tuple) -> None:
    """Redo, through ``g`` and the row's maximum (the ``softmax_of`` kernel, as the reference
    computes it), the rows of a tile that the weight kernel left with ``sum w`` below
    :func:`weight_floor` (every visible score a ``finfo.min`` mask fill: left padding), and keep
    them in ``blk.stats["shifted"]`` for the backward pass, which does the same. Without the
    maximum, ``w / sum w`` of such a row is subnormal over subnormal: imprecise outputs, and
    ``1 / sum w = inf`` made its q and k gradients NaN where the dense path has 0."""
    from ..kernels.cpu import attention as rows

    low = den.view(-1) < weight_floor(s.dtype)
    if not bool(low.any()):
        return
    idx = low.nonzero().view(-1).numpy()
    sub = _score_rows(plan, blk, s.shape, idx)
    sub_den = sub.new_empty(sub.shape[0])
    pieces = plan.tiles
    _run_kernel(rows.softmax_of_forward, sub.numpy(), sub_den.numpy(), *_meta_rows(meta, idx), pieces.row,
                pieces.fn, pieces.sink)
    at = torch.from_numpy(idx)
    s.view(-1, s.shape[-1])[at] = sub
    den.view(-1)[at] = sub_den
    blk.stats["shifted"] = idx


def _scalar(value: float, like: torch.Tensor):
    return np.float32(value) if like.dtype == torch.float32 else np.float64(value)


def _tile_backward(plan: _Plan, s: torch.Tensor, dp: torch.Tensor, blk: _Block, params: dict, leaves: dict,
                   wanted: list, d_o: torch.Tensor, o: torch.Tensor):
    """``dS`` of the tile (written over ``dp``; ``p`` over ``s``) by a row kernel, and the
    parameter gradients (autograd on the torch piece, weighted by the gradient at it)."""
    from ..kernels.cpu import attention as rows
    from ..kernels.cpu.pieces import no_sink

    form, pieces = plan.form, plan.tiles
    raw = s.clone() if wanted else None
    args = _tile_args(plan, s, blk, params)
    arr, rest = args[0], args[1:]
    apply_d = not wanted
    if plan.kind == "elementwise":
        _run_kernel(rows.elementwise_backward, arr, dp.view(arr.shape).numpy(), *rest, pieces.row, pieces.fn,
                    pieces.dfn, apply_d)
    else:
        dd = (d_o * o).sum(-1).reshape(-1).contiguous().numpy()
        dpa = dp.view(arr.shape).numpy()
        if plan.kind == "sum_normalized" and plan.form.signed:
            assert apply_d  # kernel_form: no learnable parameter
            _run_kernel(rows.signed_backward, arr, dpa, dd, *rest, pieces.row, pieces.fn, pieces.dfn,
                        _scalar(plan.eps, s))
        elif plan.kind == "sum_normalized":
            _run_kernel(rows.sum_normalized_backward, arr, dpa, dd, *rest, pieces.row, pieces.fn, pieces.dfn,
                        _scalar(plan.eps, s), apply_d)
        elif pieces.factor is not None:
            assert apply_d  # kernel_form: no learnable parameter
            _run_kernel(rows.factor_backward, arr, dpa, dd, *rest, pieces.row, pieces.fn, pieces.dfn, pieces.sink,
                        pieces.factor, pieces.dfactor)
        elif pieces.weight is not None and pieces.sink is no_sink:
            shifted = blk.stats.get("shifted")   # rows whose weights underflowed (_shifted_rows_forward)
            if shifted is not None:
                sub, dsub = arr[shifted], dpa[shifted]   # (copies)
            _run_kernel(rows.weighted_backward, arr, dpa, dd, *rest, pieces.row, pieces.weight, pieces.dfn, apply_d)
            if shifted is not None:
                _run_kernel(rows.softmax_of_backward, sub, dsub, dd[shifted], *_meta_rows(rest, shifted),
                            pieces.row, pieces.fn, pieces.dfn, pieces.sink, apply_d)
                arr[shifted], dpa[shifted] = sub, dsub
        else:
            _run_kernel(rows.softmax_of_backward, arr, dpa, dd, *rest, pieces.row, pieces.fn, pieces.dfn,
                        pieces.sink, apply_d)
    dpar: Any = None
    if wanted:
        assert raw is not None and form is not None
        piece, dpiece = (form.g, form.dg) if plan.kind == "softmax_of" else (form.h, form.dh)  # type: ignore[union-attr]
        targets = [leaves[n] for n in wanted]
        with torch.enable_grad():
            pblk = _block_params(plan, leaves, blk)
            scores, dp_held, held = _param_chain(plan, piece, raw, plan.kind, s, params, _count(blk), dp)
            val = forms.call(piece, scores, pblk, _count(blk))
            if val.requires_grad:
                dpar = torch.autograd.grad(val, targets, dp_held, allow_unused=True)
            if pieces.sink_logit is not None:
                dsink = _sink_logit_grads(pieces.sink_logit(pblk), raw, blk, dd, targets)
                dpar = dsink if dpar is None else [_sum_grads(a, b) for a, b in zip(dpar, dsink)]
        dp.mul_(forms.call(dpiece, raw, params, _count(blk)))
        if held is not None:   # g' overflowed where g did (0 * inf): the dense path's 0 there
            dp.masked_fill_(held & ~torch.isfinite(dp), 0.0)
    return dp, dpar


def _sum_grads(a, b):
    return b if a is None else a if b is None else a + b


def _sink_logit_grads(logit: Any, z: torch.Tensor, blk: _Block, dd, targets: list):
    """Parameter gradients through the sink logit ``s`` of a ``softmax_of`` tile with ``g = x``
    (``z``: the tile's scores, hidden entries still to fill): ``d out / d s = -p_sink out``, so each
    row contributes ``-p_sink dd`` with ``p_sink = e^{s - c} / (e^{s - c} + sum_j e^{z_j - c})``."""
    if not isinstance(logit, torch.Tensor) or not logit.requires_grad:
        return [None] * len(targets)
    rows = z.shape[-2]
    s = logit.detach().expand(z.shape[:-2] + (1, 1)).expand(*z.shape[:-1], 1)
    with torch.no_grad():
        zf = blk.fill(z.detach().clone(), float("-inf"))
        c = torch.maximum(zf.amax(-1, keepdim=True), s)
        limit = c == float("inf")   # a +inf score takes the row's whole mass: p_sink = 0
        c = torch.where(limit, torch.zeros_like(c), c)
        p_sink = torch.exp(s - c) / (torch.exp(zf - c).sum(-1, keepdim=True) + torch.exp(s - c))
        p_sink = torch.where(limit, torch.zeros_like(p_sink), p_sink)
        weight = -p_sink * torch.as_tensor(dd, dtype=z.dtype).view(*z.shape[:-1], 1)
    val = logit.expand(z.shape[:-2] + (1, 1)).expand(*z.shape[:-2], rows, 1)
    return list(torch.autograd.grad(val, targets, weight, allow_unused=True))


def _rows_backward(plan: _Plan, s: torch.Tensor, blk: _Block, leaves: dict, wanted: list, dp: torch.Tensor):
    """``rows`` mode: autograd through the reference on the recomputed tile."""
    with torch.enable_grad():
        x = s.detach().clone().requires_grad_(True)
        params = _block_params(plan, leaves, blk)
        p = plan.spec.fn(x, dim=-1, mask=_visible(blk, x), **_rows_params(plan, params, x.shape[-1]))
        grads = torch.autograd.grad(p, [x] + [leaves[n] for n in wanted], dp, allow_unused=True)
    ds = grads[0] if grads[0] is not None else torch.zeros_like(x)
    return ds, (grads[1:] if wanted else None), p.detach()


def _linear_factor(spec: NormalizerSpec, form: Any, kind: str, params: dict, names: list) -> Any:
    """``a`` when the form is ``softmax(a x)`` for a number ``a`` (folded into the query scale)
    and the numba pieces add nothing to it (a sink logit or a factor, which they compute on ``g``)."""
    if isinstance(form, SoftmaxOf) and kind == "softmax_of" and form.linear_factor is not None and not names:
        pieces = numba_pieces(spec, params)
        if pieces is None or (pieces.sink_logit is None and pieces.factor is None):
            return form.linear_factor(params)
    return None


def _computation(spec: NormalizerSpec, params: dict, inp: AttentionInputs, names: list):
    """``(kind, form, tiles)``: the family and form the fused path computes, and the row kernels'
    pieces (None: torch operations on the tiles)."""
    kind, form, tiles = kind_for(spec, params), spec.form, None
    if row_kernels_apply(inp):
        fast = kind_for(spec, params, kernels=True)
        fast_form = kernel_form(spec, params) or spec.form
        tiles = _tile_pieces(spec, fast, inp, _linear_factor(spec, fast_form, fast, params, names), params)
        if tiles is not None:
            kind, form = fast, fast_form
    return kind, form, tiles


def _geometry(inp: AttentionInputs, kernels: bool, block_q: int | None = None) -> tuple[int, int, int]:
    """Rows per query block, heads per tile and batch entries per tile (``kernels``: the row
    kernels' larger tiles, which also take several batch entries when every head fits: fewer,
    fuller tiles for short rows, where each tile's fixed cost dominates)."""
    b, h, lq, lk = inp.shape
    per_head_rows = max((ROW_KERNEL_TILE_ELEMENTS if kernels else TILE_ELEMENTS) // max(lk, 1), 1)
    if block_q is None:
        block_q = max(MIN_BLOCK_Q, min(MAX_BLOCK_Q, per_head_rows, max(lq, 1)))
    heads = max(1, min(h, per_head_rows // block_q))
    batches = max(1, min(b, per_head_rows // (block_q * h))) if kernels and heads == h else 1
    return block_q, heads, batches


#: Scores per tile from which the row kernels beat the dense reference on a small score matrix:
#: a tile costs about 0.15 ms of Python and launches, the reference 10-25 ns a score in torch
#: operations (measured on the CPU at B x H x Lq x Lk = 8x4x128x128: ssmax dense 14.7x SDPA,
#: fused 3.2x; decoding 4x8x4x4096: 5.7x against 2.3x; 32x8x16x16, 2k scores a tile: 7.0x against 20x).
MIN_SCORES_PER_TILE = 1 << 14


def pays_off_when_small(spec: NormalizerSpec, params: dict, inp: AttentionInputs) -> bool:
    """Whether the fused path's row kernels beat the dense reference on a score matrix that
    ``method="auto"`` would otherwise call small (decoding against a long cache, many short
    heads): they run here (:func:`row_kernels_apply`, a one-pass family with numba pieces) and
    each tile holds at least :data:`MIN_SCORES_PER_TILE` scores."""
    if not row_kernels_apply(inp):
        return False
    names = [n for n, val in params.items() if isinstance(val, torch.Tensor)]
    if _computation(spec, params, inp, names)[2] is None:
        return False
    b, h, lq, lk = inp.shape
    block_q, heads, batches = _geometry(inp, True)
    tiles = -(-b // batches) * -(-h // heads) * -(-lq // block_q)
    return b * h * lq * lk >= MIN_SCORES_PER_TILE * tiles


def fused_attention(spec: NormalizerSpec, inp: AttentionInputs, params: dict,
                    block_q: int | None = None) -> torch.Tensor:
    """Attention with ``spec`` by query blocks over whole visible rows; differentiable in q, k,
    v and tensor (per-head) parameters. ``params``: the normalizer's parameters, defaults
    filled in. ``block_q``: rows per block (default: as many as fit :data:`TILE_ELEMENTS`,
    between :data:`MIN_BLOCK_Q` and :data:`MAX_BLOCK_Q`)."""
    names = [n for n, val in params.items() if isinstance(val, torch.Tensor)]
    fixed = {n: val for n, val in params.items() if n not in names}
    tensors = [params[n].to(dtype=inp.q.dtype, device=inp.q.device) for n in names]
    kind, form, tiles = _computation(spec, params, inp, names)
    block_q, heads, batches = _geometry(inp, tiles is not None, block_q)
    linear = _linear_factor(spec, form, kind, params, names)
    plan = _Plan(kind, spec, form, inp, fixed, names, {p.name: p.size for p in spec.param_specs}, block_q, heads,
                 needs_count=kind != "rows" and form is not None and forms.form_uses_count(form), batches=batches)
    plan.linear = None if linear is None else float(linear)
    if kind == "threshold":
        assert isinstance(form, forms.Threshold)
        plan.alpha = float(form.alpha(params))
    if kind == "sum_normalized":
        assert isinstance(form, SumNormalized)
        plan.eps = float(form.epsilon(params))
    plan.tiles = tiles
    if plan.tiles is not None:
        plan.packed = _pack(plan.tiles.values(params), inp)
    out = _FusedAttention.apply(plan, inp.q, inp.k, inp.v, *tensors)
    return out.to(inp.out_dtype)
