r"""Ulysses attention: all-to-all from sequence shards to head shards, local attention, back.

DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for
Enabling Training of Extreme Long Sequence Transformer Models", arXiv 2309.14509): every
rank holds a shard of the sequence for all heads; one all-to-all gives every rank the
whole sequence for a share of the heads, attention runs locally on it with any
normalizer (the whole row of scores is there: sparse_softmax's top-k, the entmax
threshold, as_entmax), and a second all-to-all brings the output back to sequence
shards. Both all-to-alls are differentiable (their backward is the opposite all-to-all).
"""

from __future__ import annotations

import torch

from .._checks import check_bool
from .._rows import compute_dtype
from ..attention import attention
from ._comm import Comm, call_signature, check_layout, gather_lengths, resolve, ring_positions, ring_segments
from .ring import check_mask, check_params, check_qkv, check_scale

__all__ = ["head_split", "ulysses_attention"]


def _bounds(sizes):
    out, start = [], 0
    for n in sizes:
        out.append((start, start + n))
        start += n
    return out


def _seq_to_heads(comm: Comm, x: torch.Tensor, heads: list, seq: list) -> torch.Tensor:
    """``(B, H, L_local, ...)`` to ``(B, heads[rank], sum(seq), ...)`` (rank order along L)."""
    send = [x[:, a:b].contiguous() for a, b in _bounds(heads)]
    mine = heads[comm.rank]
    recv = [x.new_empty(x.shape[0], mine, n, *x.shape[3:]) for n in seq]
    comm.all_to_all(send, recv)
    return torch.cat(recv, dim=2)


def _heads_to_seq(comm: Comm, x: torch.Tensor, heads: list, seq: list) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`."""
    send = [x[:, :, a:b].contiguous() for a, b in _bounds(seq)]
    mine = seq[comm.rank]
    recv = [x.new_empty(x.shape[0], h, mine, *x.shape[3:]) for h in heads]
    comm.all_to_all(send, recv)
    return torch.cat(recv, dim=1)


# The backward of each exchange is the opposite exchange *as a Function*, so that a backward
# with create_graph=True (a gradient penalty, a Hessian-vector product) records it: the raw
# exchange made a gradient without a graph, and the second derivative silently lost every
# term that went through it.
class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, x, heads, seq):
        ctx.args = (comm, heads, seq)
        return _seq_to_heads(comm, x, heads, seq)

    @staticmethod
    def backward(ctx, g):
        comm, heads, seq = ctx.args
        return None, _HeadsToSeq.apply(comm, g.contiguous(), heads, seq), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, x, heads, seq):
        ctx.args = (comm, heads, seq)
        return _heads_to_seq(comm, x, heads, seq)

    @staticmethod
    def backward(ctx, g):
        comm, heads, seq = ctx.args
        return None, _SeqToHeads.apply(comm, g.contiguous(), heads, seq), None, None


class _AllReduceSum(torch.autograd.Function):
    """The sum over the ranks, on every rank; its own adjoint."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return comm.all_reduce_sum_(x.contiguous().clone())

    @staticmethod
    def backward(ctx, g):
        return None, _AllReduceSum.apply(ctx.comm, g)


class _SumGrad(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the ranks (a replicated parameter)."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return None, _AllReduceSum.apply(ctx.comm, g)


def head_split(heads: int, kv_heads: int, size: int) -> tuple[list[int], list[int], int]:
    """Query heads and key/value heads per rank, and how often key/value heads are repeated.

    Key/value heads are split as evenly as possible (query heads follow their group); with
    fewer key/value heads than ranks they are repeated up to the query heads first."""
    if heads < size:
        raise ValueError(f"ulysses_attention shards heads across ranks: it needs at least as many query heads as "
                         f"ranks, got H = {heads} heads for P = {size} ranks (context_parallel_attention hands it "
                         "normalizers that do not stream, such as the sparse ones, and float masks with +inf or "
                         "that require grad: use fewer ranks, or a streamable normalizer)")
    repeat = 1 if kv_heads >= size else heads // kv_heads
    kv = kv_heads * repeat
    groups = heads // kv
    base, extra = divmod(kv, size)
    kv_split = [base + (r < extra) for r in range(size)]
    return [n * groups for n in kv_split], kv_split, repeat


def _mask_to_heads(comm, mask, b, h, heads, q_lengths):
    """This rank's mask rows (``(B, H|1, Lq_local, Lk)``) to every row for its heads."""
    if mask.shape[1] == 1 or mask.stride(1) == 0:  # one mask for every head
        x = mask[:, :1].expand(b, comm.size, -1, -1)
        split = [1] * comm.size
    else:
        x, split = mask.expand(b, h, -1, -1), heads
    if x.dtype == torch.bool:
        return _seq_to_heads(comm, x.to(torch.uint8).contiguous(), split, q_lengths).bool()
    # a float mask through the differentiable exchange: a learned bias gets its gradient
    return _SeqToHeads.apply(comm, x.contiguous(), split, q_lengths)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, /, normalizer: str = "softmax", *, group=None,
                      is_causal: bool = False, attn_mask: torch.Tensor | None = None, layout: str = "contiguous",
                      scale: float | None = None, **params) -> torch.Tensor:
    r"""Sequence-parallel attention by head sharding (DeepSpeed-Ulysses), for any normalizer.

    .. math:: \mathrm{out}_i = \sum_j p_{ij} v_j,\quad
              p_{i\cdot} = \mathrm{normalize}(q_i K^\top \cdot \mathrm{scale} + a_{i\cdot})

    over every rank's keys, equal to :func:`softmaxkit.attention` on the whole sequence.
    ``q`` ``(B, H, Lq_local, D)``, ``k``, ``v`` ``(B, Hkv, Lk_local, D|Dv)`` are this rank's
    sequence shard (lengths may differ between ranks with ``layout="contiguous"``). An
    all-to-all (``torch.distributed.all_to_all_single``) gives each rank the whole sequence
    for its heads, :func:`softmaxkit.attention` runs there (streaming, dense or SDPA, so
    every normalizer works, including ``sparse_softmax``, the entmax threshold and
    ``as_entmax``), and a second all-to-all returns this rank's rows. Jacobs et al. 2023,
    arXiv 2309.14509.

    Heads: key/value heads are split across ranks as evenly as possible, uneven splits
    included (query heads follow their group); with fewer key/value heads than ranks they
    are repeated up to the query heads first. Fewer query heads than ranks raises
    ``ValueError``. Memory per rank is ``O(L_total * D * H / P)``.

    Args:
        normalizer: a registered name; ``**params`` its parameters (numbers, or per-head
            tensors broadcastable to ``(B, H, 1, 1)``, whose gradient is summed over ranks).
        group: a ``torch.distributed`` process group (default: the default group).
        is_causal: causal over global positions (aligned to the end of the keys).
        attn_mask: this rank's query rows against every key in global order, broadcastable
            to ``(B, H, Lq_local, Lk_total)`` (bool, True = visible, or float, added; a float
            mask that requires grad, a learned bias, gets its gradient).
        layout: ``"contiguous"`` or ``"zigzag"`` (see :func:`context_parallel_attention`).
        scale: multiplies ``q k^T``; default ``1 / sqrt(D)``.

    Returns:
        ``(B, H, Lq_local, Dv)`` in the dtype of ``q``.
    """
    check_qkv(q, k, v)
    check_layout(layout)
    is_causal = check_bool(is_causal, "is_causal")
    b, h, lq, d = q.shape
    hk = k.shape[1]
    scale = check_scale(scale, d)
    merged, tensor_names = check_params(normalizer, params, b, h, compute_dtype(q.dtype), q.device,
                                        validate=False)  # softmaxkit.attention checks the values
    comm = resolve(group)
    lengths = gather_lengths(comm, [lq, k.shape[2]],
                             call_signature(q, k, v, is_causal, layout, normalizer, merged, scale))
    q_lengths, k_lengths = [x[0] for x in lengths], [x[1] for x in lengths]
    q_segs = ring_segments(layout, q_lengths, "q")
    k_segs = ring_segments(layout, k_lengths, "k and v")
    lk_total = sum(k_lengths)
    bool_mask, additive = check_mask(attn_mask, (b, h, lq, lk_total), q=q)
    q_heads, kv_heads, repeat = head_split(h, hk, comm.size)
    if repeat > 1:
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    qh = _SeqToHeads.apply(comm, q.contiguous(), q_heads, q_lengths)
    kh = _SeqToHeads.apply(comm, k.contiguous(), kv_heads, k_lengths)
    vh = _SeqToHeads.apply(comm, v.contiguous(), kv_heads, k_lengths)
    q_order = k_order = None
    if layout != "contiguous":  # rank-concatenated order -> global order
        q_order = torch.argsort(torch.cat([ring_positions(s) for s in q_segs])).to(q.device)
        k_order = torch.argsort(torch.cat([ring_positions(s) for s in k_segs])).to(q.device)
        qh, kh, vh = qh[:, :, q_order], kh[:, :, k_order], vh[:, :, k_order]
    mask = bool_mask if bool_mask is not None else additive
    if mask is not None:
        mask = _mask_to_heads(comm, mask, b, h, q_heads, q_lengths)
        if q_order is not None:
            mask = mask[:, :, q_order]
    lo, hi = sum(q_heads[:comm.rank]), sum(q_heads[:comm.rank + 1])
    local = dict(params)
    for name in tensor_names:
        t = _SumGrad.apply(comm, params[name])
        if t.dim() >= 3 and t.shape[-3] == h:
            t = t[..., lo:hi, :, :]
        local[name] = t
    if hi > lo:
        out = attention(qh, kh, vh, normalizer, is_causal=is_causal, attn_mask=mask, scale=scale, **local)
    else:  # pragma: no cover - head_split gives every rank a head
        out = qh.new_zeros(*qh.shape[:3], v.shape[-1])
    if q_order is not None:
        out = out[:, :, torch.argsort(q_order)]
    return _HeadsToSeq.apply(comm, out.contiguous(), q_heads, q_lengths)
