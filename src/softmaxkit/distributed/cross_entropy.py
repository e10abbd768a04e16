r"""Vocabulary-parallel linear cross-entropy: the output layer sharded over the vocabulary.

Each rank holds rows ``[o_r, o_r + V_r)`` of the output projection (shards may differ in
size) and the same ``hidden`` and ``target``. Each rank streams its shard in blocks, as
:func:`softmaxkit.losses.linear_cross_entropy` does (token chunks, vocabulary blocks
folded into an online log-sum-exp), so the ``N x V`` logits never exist, neither whole
nor per shard. Two all-reduces per call combine the shards: the maximum of the local
log-sum-exps, then the sums of ``e^{lse_r - M}``, of the target logit (held by one shard)
and, for label smoothing, of the logits. This is Megatron-LM's vocabulary-parallel
cross-entropy (Shoeybi et al. 2019, arXiv 1909.08053) with Cut Cross-Entropy's blockwise
evaluation (Wijmans et al. 2024, arXiv 2411.09947). The backward pass recomputes the
shard's logits block by block; the gradient of ``hidden`` is summed over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import check_in_range, check_int_in_range
from .._rows import compute_dtype
from ..algorithms import OnlineSoftmaxState
from ..losses._reduce import check_reduction
from ..losses.linear_cross_entropy import (
    check_class_target,
    check_ignore_index,
    check_projection,
    default_chunk_size,
    default_vocab_block,
)
from ._comm import Comm, gather_lengths, resolve

__all__ = ["vocab_parallel_linear_cross_entropy"]


@dataclass(frozen=True)
class _Setup:
    comm: Comm
    offset: int
    vocab: int  # total over the shards
    ignore_index: int
    label_smoothing: float
    z_penalty: float
    reduction: str
    chunk_size: int
    vocab_block: int


def _ranges(n: int, step: int):
    for s in range(0, n, step):
        yield s, min(s + step, n)


def _in_shard(local_target: torch.Tensor, start: int, width: int):
    rel = local_target - start
    inside = (rel >= 0) & (rel < width)
    return rel.clamp(0, width - 1).unsqueeze(1), inside


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, setup: _Setup):
        cdt = compute_dtype(hidden.dtype)
        h, w = hidden.to(cdt), weight.to(cdt)
        valid = target != setup.ignore_index
        local_target = torch.where(valid, target, torch.full_like(target, -1)) - setup.offset
        n = h.shape[0]
        lse_local = h.new_empty(n)
        picked = h.new_zeros(n)
        logit_sum = h.new_zeros(n)
        for s, e in _ranges(n, setup.chunk_size):
            state = None
            for start, stop in _ranges(w.shape[0], setup.vocab_block):
                logits = h[s:e] @ w[start:stop].T
                pos, inside = _in_shard(local_target[s:e], start, stop - start)
                picked[s:e] += torch.where(inside, logits.gather(1, pos).squeeze(1), torch.zeros_like(picked[s:e]))
                if setup.label_smoothing:
                    logit_sum[s:e] += logits.sum(1)
                block = OnlineSoftmaxState.from_block(logits, dim=1)
                state = block if state is None else state.merge(block)
                del logits
            # (a shard of no rows: no logit, e^{lse} = 0)
            lse_local[s:e] = float("-inf") if state is None else state.logsumexp()
        comm = setup.comm
        top = comm.all_reduce_max_(lse_local.clone())
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        packed = torch.stack([torch.exp(lse_local - top), picked, logit_sum], 1)
        comm.all_reduce_sum_(packed)
        lse = top + torch.log(packed[:, 0])
        target_logit, total = packed[:, 1], packed[:, 2]
        eps = setup.label_smoothing
        per_token = (1 - eps) * (lse - target_logit)
        if eps:
            per_token = per_token + eps * (lse - total / setup.vocab)
        if setup.z_penalty:
            per_token = per_token + setup.z_penalty * lse * lse
        row_scale = valid.to(cdt)
        per_token = per_token * row_scale
        count = int(valid.sum())
        if setup.reduction == "none":
            loss = per_token
        else:
            loss = per_token.sum() / (max(count, 1) if setup.reduction == "mean" else 1)
        ctx.setup, ctx.count = setup, count
        ctx.save_for_backward(hidden, weight, local_target, row_scale, lse)
        return loss.to(hidden.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        if torch.is_grad_enabled():   # create_graph=True: the chunked gradient below has no graph
            raise RuntimeError("vocab_parallel_linear_cross_entropy has first derivatives only: a backward with "
                               "create_graph=True (a gradient penalty, a Hessian-vector product) is not supported; "
                               "use softmaxkit.losses.linear_cross_entropy on gathered weights")
        with torch.no_grad():
            return _vocab_parallel_grads(ctx, grad_loss)


def _vocab_parallel_grads(ctx, grad_loss):
    """:class:`_VocabParallelCE`'s backward: the chunked gradients of ``hidden`` (summed over
    ranks) and of this rank's weight shard."""
    setup = ctx.setup
    hidden, weight, local_target, row_scale, lse = ctx.saved_tensors
    cdt = compute_dtype(hidden.dtype)
    if setup.reduction == "mean":
        grad_loss = grad_loss / max(ctx.count, 1)
    h, w = hidden.to(cdt), weight.to(cdt)
    rows = row_scale * grad_loss.to(cdt)
    need_h, need_w = ctx.needs_input_grad[:2]
    grad_h = torch.zeros_like(h) if need_h else None
    grad_w = torch.zeros_like(w) if need_w else None
    eps = setup.label_smoothing
    coef = rows * (1 + 2 * setup.z_penalty * lse) if setup.z_penalty else rows
    for s, e in _ranges(h.shape[0], setup.chunk_size):
        for start, stop in _ranges(w.shape[0], setup.vocab_block):
            # d loss_i / d z_ij = (1 + 2 c lse_i) p_ij - (1 - eps) [j = y_i] - eps / V, times the row scale
            g = (h[s:e] @ w[start:stop].T).sub_(lse[s:e].unsqueeze(1)).exp_().mul_(coef[s:e].unsqueeze(1))
            pos, inside = _in_shard(local_target[s:e], start, stop - start)
            g.scatter_add_(1, pos, (-(1 - eps) * rows[s:e] * inside).unsqueeze(1))
            if eps:
                g.sub_((eps / setup.vocab) * rows[s:e].unsqueeze(1))
            if grad_h is not None:
                grad_h[s:e].addmm_(g, w[start:stop])
            if grad_w is not None:
                grad_w[start:stop].addmm_(g.T, h[s:e])
            del g
    if grad_h is not None:
        setup.comm.all_reduce_sum_(grad_h)
    return (None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype), None, None)


def vocab_parallel_linear_cross_entropy(hidden: torch.Tensor, weight_shard: torch.Tensor, target: torch.Tensor, *,
                                        group=None, ignore_index: int = -100, label_smoothing: float = 0.0,
                                        z_penalty: float = 0.0, reduction: str = "mean",
                                        chunk_size: int | None = None, vocab_block: int | None = None
                                        ) -> torch.Tensor:
    r"""Cross-entropy of ``hidden @ W.T`` with ``W`` sharded over the vocabulary across ranks.

    Per token, with ``z = W h`` over the whole vocabulary ``V = sum_r V_r``,

    .. math::
        \ell_i = (1 - \varepsilon)(\mathrm{lse}_i - z_{i y_i})
                 + \varepsilon\,\big(\mathrm{lse}_i - \tfrac{1}{V}\textstyle\sum_j z_{ij}\big)
                 + c\,\mathrm{lse}_i^2,\qquad
        \mathrm{lse}_i = M_i + \log \textstyle\sum_r e^{\mathrm{lse}_{ri} - M_i},\ M_i = \max_r \mathrm{lse}_{ri}

    where ``lse_r`` is the log-sum-exp over rank ``r``'s shard: the same value as
    :func:`softmaxkit.losses.linear_cross_entropy` on the whole ``W`` (label smoothing
    ``eps``, PaLM's z-penalty ``c``: Chowdhery et al. 2022, arXiv 2204.02311). The
    all-reduces carry (max, sum of exponentials, target logit, and the logit sum when
    ``eps > 0``); Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053), with Cut
    Cross-Entropy's blockwise logits (Wijmans et al. 2024, arXiv 2411.09947): no rank ever
    holds more than ``chunk_size x vocab_block`` logits.

    Args:
        hidden: ``(..., D)``, the same on every rank.
        weight_shard: ``(V_r, D)``, this rank's consecutive rows of the output projection
            (rank 0 the first ones); shards may differ in size, and be empty on some ranks.
        target: ``(...)`` global class indices in ``[0, V)`` or ``ignore_index``, the same on
            every rank.
        group: a ``torch.distributed`` process group (default: the default group).
        ignore_index, label_smoothing, z_penalty, reduction: as in ``linear_cross_entropy``
            (``"mean"`` over the tokens not ignored, ``"sum"``, ``"none"``).
        chunk_size, vocab_block: tokens per chunk and shard rows per block.

    Returns:
        The loss (the same value on every rank). Gradients: ``weight_shard`` gets its own
        rows' gradient; ``hidden`` gets the full gradient (summed over the ranks).
    """
    check_projection(hidden, weight_shard, "weight_shard", allow_empty=True)   # (a rank may hold no row)
    check_class_target(target, hidden)
    check_ignore_index(ignore_index)
    label_smoothing = check_in_range(label_smoothing, "label_smoothing", 0.0, 1.0)
    z_penalty = check_in_range(z_penalty, "z_penalty", 0.0)
    reduction = check_reduction(reduction)
    comm = resolve(group)
    # the shard sizes, once the ranks agree on what the all-reduces' sizes and the loss depend on:
    # another token count or dtype aborted gloo (SIGABRT), another reduction gave each rank its own loss
    agreed = {"number of tokens": target.numel(), "hidden dim": hidden.shape[-1], "dtype": str(hidden.dtype),
              "reduction": reduction, "ignore_index": ignore_index, "label_smoothing": repr(label_smoothing),
              "z_penalty": repr(z_penalty),
              # (the backward sums hidden's gradient over the ranks: a rank without one would skip it)
              "whether hidden requires grad": int(torch.is_grad_enabled() and hidden.requires_grad)}
    shards = [x[0] for x in gather_lengths(comm, [weight_shard.shape[0]], agreed)]
    vocab = sum(shards)
    if vocab == 0:
        raise ValueError(f"the weight shards hold no row on any of the {comm.size} ranks (the vocabulary is empty)")
    offset = sum(shards[:comm.rank])
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        raise ValueError(f"target must hold class indices in [0, {vocab}) (the whole vocabulary over {comm.size} "
                         f"shards {shards}) or ignore_index={ignore_index}, found {int(target[bad][0])}")
    n = target.numel()
    chunk_size = (default_chunk_size(max(n, 1), vocab) if chunk_size is None
                  else check_int_in_range(chunk_size, "chunk_size", 1))
    vocab_block = (default_vocab_block(chunk_size, weight_shard.shape[0]) if vocab_block is None
                   else check_int_in_range(vocab_block, "vocab_block", 1))
    setup = _Setup(comm, offset, vocab, ignore_index, label_smoothing, z_penalty, reduction, chunk_size, vocab_block)
    loss = _VocabParallelCE.apply(hidden.reshape(-1, hidden.shape[-1]), weight_shard, target.reshape(-1), setup)
    return loss.reshape(target.shape) if reduction == "none" else loss
