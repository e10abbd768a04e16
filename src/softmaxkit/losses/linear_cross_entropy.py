r"""Cross-entropy of a linear output layer without materialising the logits.

The logits ``hidden @ weight.T + bias`` of a language model (``N`` tokens by a
vocabulary of ``V``) and their gradient are the largest tensors of training. Here they
only ever exist for one chunk of tokens at a time: tokens are processed in chunks, and
within a chunk the vocabulary in blocks whose log-sum-exp is folded into an
:class:`softmaxkit.algorithms.OnlineSoftmaxState` (Milakov & Gimelshein 2018, arXiv
1805.02867). Memory is ``O(chunk_size * V)`` instead of ``O(N * V)``; this is the idea of
Cut Cross-Entropy (Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language
Models", arXiv 2411.09947).

When the loss is reduced (``"mean"`` or ``"sum"``) and a gradient will be needed, the
gradient of each chunk's logits is formed as soon as its log-sum-exp is known and
contracted straight into the gradients of ``hidden``, ``weight`` and ``bias``, which
backward then only scales: the output projection is multiplied three times, as in the
plain path, never four. With ``reduction="none"`` the per-token upstream gradient is
only known in backward, which recomputes the logits block by block (as does a repeated
backward); then, and in a forward pass without gradients, a single block of
``chunk_size x vocab_block`` logits exists at a time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import (
    backward_in_torch_ops,
    can_branch_on,
    check_floating,
    check_in_range,
    check_int_in_range,
    under_transform,
)
from .._rows import compute_dtype
from ..algorithms import OnlineSoftmaxState
from ._reduce import check_reduction

#: Default bound on the logits (tokens x vocabulary) a token chunk holds: 128 MiB in float32.
CHUNK_LOGITS = 1 << 25
#: Default: at least this many tokens per chunk (the matmuls stay efficient) ...
MIN_CHUNK_TOKENS = 128
#: ... and otherwise at most 1/CHUNKS_AT_LEAST of the tokens per chunk.
CHUNKS_AT_LEAST = 8


@dataclass(frozen=True)
class _Setup:
    vocab: int
    ignore_index: int
    label_smoothing: float
    z_penalty: float
    reduction: str
    chunk_size: int
    vocab_block: int
    fused: bool


def default_chunk_size(tokens: int, vocab: int) -> int:
    """Tokens per chunk: at most ``CHUNK_LOGITS`` logits and ``1/CHUNKS_AT_LEAST`` of the
    tokens, but at least ``MIN_CHUNK_TOKENS`` tokens (all of them when fewer)."""
    bounded = min(CHUNK_LOGITS // vocab, -(-tokens // CHUNKS_AT_LEAST))
    return max(1, min(tokens, max(bounded, MIN_CHUNK_TOKENS)))


def default_vocab_block(chunk_size: int, vocab: int) -> int:
    """Vocabulary entries per block: the whole vocabulary while a chunk's logits stay within
    ``CHUNK_LOGITS``, otherwise blocks that do."""
    return max(1, min(vocab, CHUNK_LOGITS // chunk_size))


def _ranges(length: int, step: int):
    for start in range(0, length, step):
        yield start, min(start + step, length)


def _logit_blocks(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, vocab_block: int):
    """``(start, h @ weight[start:stop].T + bias[start:stop])`` for each vocabulary block."""
    for start, stop in _ranges(weight.shape[0], vocab_block):
        block = weight[start:stop].T
        yield start, (h @ block if bias is None else torch.addmm(bias[start:stop], h, block))


def _in_block(target: torch.Tensor, start: int, width: int):
    """Target positions relative to a block (clamped into it) and whether they fall in it."""
    relative = target - start
    inside = (relative >= 0) & (relative < width)
    return relative.clamp(0, width - 1).unsqueeze(1), inside


def _block_state_(logits: torch.Tensor) -> OnlineSoftmaxState:
    """The online-softmax state ``(m, d)`` of one block, leaving ``exp(logits - m)`` in it.

    Unlike :meth:`OnlineSoftmaxState.from_block` this keeps the exponentials, which the
    gradient reuses (the logits are finite here: nothing is masked).
    """
    m = logits.amax(1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a block masked to -inf by the bias
    d = logits.sub_(m.unsqueeze(1)).exp_().sum(1)
    return OnlineSoftmaxState(m, d)


def _row_statistics(blocks, target: torch.Tensor, setup: _Setup, keep: list | None):
    """One pass over a chunk's logit blocks: log-sum-exp (online), target logit, logit sum.

    The blocks are left holding ``exp(logits - m_block)``; with ``keep`` a list, they are
    appended to it with their maxima (the fused path turns them into gradients).
    """
    state = None
    target_logit = logit_sum = None
    for start, logits in blocks:
        position, inside = _in_block(target, start, logits.shape[1])
        picked = logits.gather(1, position).squeeze(1)
        target_logit = picked if target_logit is None else torch.where(inside, picked, target_logit)
        if setup.label_smoothing:
            total = logits.sum(1)
            logit_sum = total if logit_sum is None else logit_sum + total
        block_state = _block_state_(logits)
        state = block_state if state is None else state.merge(block_state)
        if keep is not None:
            keep.append((start, logits, block_state.m))
        del logits  # free this block before the next one is computed (unless kept)
    assert state is not None, "a chunk has at least one logit block"
    return state.logsumexp(), target_logit, logit_sum


def _grad_from_exp_(exp_block: torch.Tensor, start: int, scale: torch.Tensor, target: torch.Tensor,
                    row_scale: torch.Tensor, setup: _Setup) -> torch.Tensor:
    """Overwrite ``exp_block`` = ``exp(z - m)`` with ``row_scale *`` the gradient of the token
    losses w.r.t. the block of logits ``z``; ``scale = exp(m - lse)`` turns it into ``p``.

    d loss_i / d z_ij = (1 + 2 c lse_i) p_ij - (1 - eps) [j = y_i] - eps / V.
    """
    eps = setup.label_smoothing
    exp_block.mul_(scale.unsqueeze(1))
    position, inside = _in_block(target, start, exp_block.shape[1])
    exp_block.scatter_add_(1, position, (-(1 - eps) * row_scale * inside).unsqueeze(1))
    if eps:
        exp_block.sub_((eps / setup.vocab) * row_scale.unsqueeze(1))
    return exp_block


def _probability_scale(lse: torch.Tensor, m: torch.Tensor, row_scale: torch.Tensor, setup: _Setup):
    """Per row: ``row_scale * (1 + 2 c lse) * exp(m - lse)`` (``m = lse`` when the block holds ``exp(z - lse)``)."""
    coef = row_scale * (1 + 2 * setup.z_penalty * lse) if setup.z_penalty else row_scale
    return coef * torch.exp(m - lse)


def _accumulate(grad_logits: torch.Tensor, start: int, h: torch.Tensor, weight: torch.Tensor,
                grad_h: torch.Tensor | None, grad_w: torch.Tensor | None, grad_b: torch.Tensor | None) -> None:
    """Contract one block's logit gradient into the gradients of the layer's inputs."""
    stop = start + grad_logits.shape[1]
    if grad_h is not None:
        grad_h.addmm_(grad_logits, weight[start:stop])
    if grad_w is not None:
        grad_w[start:stop].addmm_(grad_logits.T, h)
    if grad_b is not None:
        grad_b[start:stop].add_(grad_logits.sum(0))


def _grads_from_blocks(blocks, h: torch.Tensor, w: torch.Tensor, lse: torch.Tensor, row_scale: torch.Tensor,
                       target: torch.Tensor, setup: _Setup, grads: tuple) -> None:
    """Accumulate into ``grads`` (for ``h``, ``w``, bias; None where not wanted) the gradient of a
    chunk's token losses, from its blocks ``(start, exp(z - m), m)``: the fused forward's kept
    blocks, or the backward's recomputed ones (with the forward's ``m``: the same rounding, so
    that a repeated backward gives the first one's gradients bit for bit)."""
    for start, exp_block, m in blocks:
        scale = _probability_scale(lse, m, row_scale, setup)
        _grad_from_exp_(exp_block, start, scale, target, row_scale, setup)
        _accumulate(exp_block, start, h, w, *grads)
        del exp_block  # free this block before the next one is computed


def _drained(kept: list):
    while kept:
        yield kept.pop(0)


def _recomputed(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, setup: _Setup, shifts):
    """``(start, exp(z - m), m)`` per block, ``m`` from ``shifts`` (one per block)."""
    for (start, logits), m in zip(_logit_blocks(h, w, b, setup.vocab_block), shifts):
        yield start, logits.sub_(m.unsqueeze(1)).exp_(), m


def _zeros_if(needed: bool, like: torch.Tensor | None):
    return torch.zeros_like(like) if needed and like is not None else None


def _plain_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """All the logits ``hidden @ weight.T + bias`` at once, in the compute dtype."""
    cdt = compute_dtype(hidden.dtype)
    logits = hidden.to(cdt) @ weight.to(cdt).T
    return logits if bias is None else logits + bias.to(cdt)


def _plain_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
                setup: _Setup) -> torch.Tensor:
    """The loss in differentiable torch ops on the full logits (``O(N * V)`` memory), for
    ``torch.func`` transforms and forward-mode AD, which the chunked Function does not support."""
    logits = _plain_logits(hidden, weight, bias)
    valid = target != setup.ignore_index
    safe_target = torch.where(valid, target, torch.zeros_like(target))
    lse = torch.logsumexp(logits, -1)
    eps = setup.label_smoothing
    per_token = (1 - eps) * (lse - logits.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1))
    if eps:
        per_token = per_token + eps * (lse - logits.sum(-1) / setup.vocab)
    if setup.z_penalty:
        per_token = per_token + setup.z_penalty * lse * lse
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    if setup.reduction == "none":
        loss = per_token
    else:
        count = valid.sum().clamp(min=1) if setup.reduction == "mean" else 1
        loss = per_token.sum() / count
    return loss.to(hidden.dtype)


def _plain_grads(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
                 row_scale: torch.Tensor, setup: _Setup, needs) -> tuple:
    """The gradients of ``sum_i row_scale_i loss_i`` for ``hidden``, ``weight``, ``bias`` (None
    where not in ``needs``) in differentiable torch ops on the full logits: the backward when a
    graph of the gradient is built (``create_graph=True``) or the incoming gradient is batched.

    d loss_i / d z_ij = (1 + 2 c lse_i) p_ij - (1 - eps) [j = y_i] - eps / V.
    """
    logits = _plain_logits(hidden, weight, bias)
    cdt = logits.dtype
    lse = torch.logsumexp(logits, -1, keepdim=True)
    eps = setup.label_smoothing
    coef = 1 + 2 * setup.z_penalty * lse if setup.z_penalty else 1
    hit = torch.arange(setup.vocab, device=logits.device) == target.unsqueeze(-1)
    grad_z = coef * torch.exp(logits - lse) - (1 - eps) * hit.to(cdt) - eps / setup.vocab
    counted = (row_scale != 0).unsqueeze(-1)   # an ignored row adds 0, even where its logits give NaN
    grad_z = torch.where(counted, grad_z * row_scale.unsqueeze(-1), torch.zeros_like(grad_z))
    grads = (grad_z @ weight.to(cdt) if needs[0] else None, grad_z.T @ hidden.to(cdt) if needs[1] else None,
             grad_z.sum(0) if needs[2] else None)
    return tuple(None if g is None or t is None else g.to(t.dtype) for g, t in zip(grads, (hidden, weight, bias)))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, setup: _Setup):
        cdt = compute_dtype(hidden.dtype)
        h, w = hidden.to(cdt), weight.to(cdt)
        b = bias.to(cdt) if bias is not None else None
        valid = target != setup.ignore_index
        safe_target = torch.where(valid, target, torch.zeros_like(target))
        row_scale = valid.to(cdt)
        count = int(valid.sum())
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        fused = setup.fused and (need_h or need_w or need_b)
        grad_h, grad_w, grad_b = (_zeros_if(fused and need_h, h), _zeros_if(fused and need_w, w),
                                  _zeros_if(fused and need_b, b))
        n = h.shape[0]
        lse, target_logit = h.new_empty(n), h.new_empty(n)
        logit_sum = h.new_zeros(n)
        shifts: list = []   # per chunk, the maximum of each block (kept for a repeated backward)
        for s, e in _ranges(n, setup.chunk_size):
            kept: list | None = [] if fused else None
            lse[s:e], target_logit[s:e], chunk_sum = _row_statistics(
                _logit_blocks(h[s:e], w, b, setup.vocab_block), safe_target[s:e], setup, kept)
            if chunk_sum is not None:
                logit_sum[s:e] = chunk_sum
            if kept is not None:
                shifts.append([m for _, _, m in kept])
                _grads_from_blocks(_drained(kept), h[s:e], w, lse[s:e], row_scale[s:e], safe_target[s:e], setup,
                                   (grad_h[s:e] if grad_h is not None else None, grad_w, grad_b))
        eps = setup.label_smoothing
        per_token = (1 - eps) * (lse - target_logit)
        if eps:
            per_token = per_token + eps * (lse - logit_sum / setup.vocab)
        if setup.z_penalty:
            per_token = per_token + setup.z_penalty * lse * lse
        # ignored rows are 0 whatever their stand-in target's logit (a -inf bias on class 0: inf * 0)
        per_token = torch.where(row_scale > 0, per_token * row_scale, torch.zeros_like(per_token))
        if setup.reduction == "none":
            loss = per_token
        else:
            loss = per_token.sum() / (max(count, 1) if setup.reduction == "mean" else 1)

        ctx.setup, ctx.count = setup, count
        ctx.grads = (grad_h, grad_w, grad_b) if fused else None
        ctx.shifts = shifts if fused else None
        ctx.save_for_backward(hidden, weight, bias)
        ctx.saved = (safe_target, row_scale, lse)
        return loss.to(hidden.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        setup = ctx.setup
        if setup.reduction == "mean":
            grad_loss = grad_loss / max(ctx.count, 1)
        hidden, weight, bias = ctx.saved_tensors
        if backward_in_torch_ops(grad_loss):   # create_graph=True or batched gradients: differentiable torch ops
            target, row_scale, _ = ctx.saved
            row_scale = row_scale * grad_loss.to(row_scale.dtype)
            return _plain_grads(hidden, weight, bias, target, row_scale, setup, ctx.needs_input_grad[:3]) + (None, None)
        dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        if ctx.grads is not None:
            # the gradients formed in forward, handed out once and scaled in place; a second
            # backward (retain_graph=True) recomputes them below as the forward formed them
            grads, ctx.grads = ctx.grads, None
            return tuple(None if g is None else g.mul_(grad_loss.to(g.dtype)).to(dtype)
                         for g, dtype in zip(grads, dtypes)) + (None, None)
        target, row_scale, lse = ctx.saved
        cdt = compute_dtype(hidden.dtype)
        h, w = hidden.to(cdt), weight.to(cdt)
        b = bias.to(cdt) if bias is not None else None
        if ctx.shifts is None:   # per-token weights (reduction "none"): folded into each row
            row_scale = row_scale * grad_loss.to(cdt)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h, grad_w, grad_b = _zeros_if(need_h, h), _zeros_if(need_w, w), _zeros_if(need_b, b)
        for i, (s, e) in enumerate(_ranges(h.shape[0], setup.chunk_size)):
            shifts = ctx.shifts[i] if ctx.shifts is not None else itertools.repeat(lse[s:e])
            _grads_from_blocks(_recomputed(h[s:e], w, b, setup, shifts), h[s:e], w, lse[s:e], row_scale[s:e],
                               target[s:e], setup, (grad_h[s:e] if grad_h is not None else None, grad_w, grad_b))
        out = (grad_h, grad_w, grad_b)
        if ctx.shifts is not None:
            out = tuple(None if g is None else g.mul_(grad_loss.to(g.dtype)) for g in out)
        return tuple(None if g is None else g.to(dtype) for g, dtype in zip(out, dtypes)) + (None, None)


def check_projection(hidden, weight, weight_name: str = "weight", allow_empty: bool = False) -> None:
    """``hidden`` ``(..., D)`` and an output projection ``weight`` ``(V, D)``, ``V >= 1`` (``V >= 0``
    with ``allow_empty``: a shard of the vocabulary), same dtype."""
    check_floating(hidden, "hidden")
    check_floating(weight, weight_name)
    if weight.dim() != 2 or (weight.shape[0] == 0 and not allow_empty):
        raise ValueError(f"{weight_name} must have shape (V, D) with V >= {0 if allow_empty else 1}, "
                         f"got {tuple(weight.shape)}")
    if hidden.dim() == 0 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden must have shape (..., D) with D = {weight_name}.shape[1] = {weight.shape[1]}, "
                         f"got {tuple(hidden.shape)}")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden and {weight_name} must have the same dtype, got {hidden.dtype} and {weight.dtype}")


def _check_inputs(hidden, weight, target, bias) -> None:
    check_projection(hidden, weight)
    if bias is not None:
        check_floating(bias, "bias")
        if bias.shape != weight.shape[:1]:
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != weight.dtype:   # as F.linear: nothing is silently cast
            raise TypeError(f"bias and weight must have the same dtype, got {bias.dtype} and {weight.dtype}")
    check_class_target(target, hidden)
    devices = {t.device for t in (hidden, weight, target, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"hidden, weight, target and bias must be on one device, got {sorted(map(str, devices))}")


def check_class_target(target, hidden: torch.Tensor) -> None:
    """``target`` must be an integer tensor of class indices of shape ``hidden.shape[:-1]``."""
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        raise TypeError(f"target must be an integer tensor of class indices, got "
                        f"{target.dtype if isinstance(target, torch.Tensor) else type(target).__name__}")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"target must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, "
                         f"got {tuple(target.shape)}")


def check_ignore_index(ignore_index) -> int:
    """``ignore_index`` must be an int (a NumPy integer counts) that fits in int64 (the targets' widest type)."""
    if isinstance(ignore_index, np.integer):
        ignore_index = int(ignore_index)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not -(1 << 63) <= ignore_index < (1 << 63):
        raise ValueError(f"ignore_index must fit in int64, got {ignore_index}")
    return ignore_index


def _check_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        value = int(target[bad][0])
        raise ValueError(f"target must hold class indices in [0, {vocab}) or ignore_index={ignore_index}, "
                         f"found {value}")


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         label_smoothing: float = 0.0, z_penalty: float = 0.0, reduction: str = "mean",
                         chunk_size: int | None = None, vocab_block: int | None = None) -> torch.Tensor:
    r"""Cross-entropy of ``hidden @ weight.T + bias`` without materialising the logits.

    Equal to ``F.cross_entropy(hidden @ weight.T + bias, target, ignore_index=...,
    label_smoothing=..., reduction=...)`` plus the PaLM z-penalty, per token

    .. math::
        \ell_i = (1 - \varepsilon)(\mathrm{lse}_i - z_{i y_i})
                 + \varepsilon\,\big(\mathrm{lse}_i - \tfrac{1}{V}\textstyle\sum_j z_{ij}\big)
                 + c\,\mathrm{lse}_i^2,\qquad
        z_i = W h_i + b,\ \mathrm{lse}_i = \log \textstyle\sum_j e^{z_{ij}}

    (``eps`` = ``label_smoothing``, ``c`` = ``z_penalty``: Chowdhery et al. 2022, PaLM,
    arXiv 2204.02311), with gradients for ``hidden``, ``weight`` and ``bias``. The
    logits are never held for more than ``chunk_size`` tokens at a time (see the module
    docstring); float16 / bfloat16 are computed and accumulated in float32.

    Ignored tokens (``target == ignore_index``) contribute 0 and are not counted by
    ``"mean"``. A batch with every token ignored gives a loss of 0 and zero gradients
    (``F.cross_entropy`` returns NaN, 0/0, there).

    Args:
        hidden: ``(..., D)`` activations.
        weight: ``(V, D)`` output projection (same dtype as ``hidden``).
        target: ``(...)`` integer class indices in ``[0, V)`` or ``ignore_index``, of any
            integer dtype (``int8`` to ``int64``, ``uint8``...); bool, floating and complex
            targets raise ``TypeError``.
        bias: ``(V,)`` or None.
        ignore_index: the target value that marks a token to skip.
        label_smoothing: ``eps`` in ``[0, 1]``.
        z_penalty: ``c >= 0``, weight of ``lse^2`` per token (PaLM uses ``1e-4``).
        reduction: ``"mean"`` (over counted tokens), ``"sum"`` or ``"none"`` (shape of ``target``).
        chunk_size: tokens per chunk; default :func:`default_chunk_size`: at most 2**25
            logits (128 MiB in float32) and 1/8 of the tokens, at least 128 tokens.
        vocab_block: vocabulary entries per block of the online log-sum-exp; default
            :func:`default_vocab_block` (the whole vocabulary unless a chunk would then
            hold more than 2**25 logits). Blocks bound the memory of a forward pass
            without gradients and of the ``"none"`` backward to ``chunk_size * vocab_block``;
            the fused path keeps a whole chunk's blocks, ``chunk_size * V`` logits.

    Note:
        With a reduced loss and a gradient needed, the gradients are computed during
        the forward pass (and only scaled, in place, by backward); call it under
        ``torch.no_grad()`` when only the value is wanted. A second backward through the
        same loss (``retain_graph=True``) recomputes the logits. Second derivatives (a
        backward with ``create_graph=True``), batched gradients, ``torch.func`` transforms
        (``grad``, ``vmap``, ``jvp``...), forward-mode AD and ``torch.compile`` compute the
        same loss and gradients in plain torch ops on the full logits: ``O(N * V)`` memory.
    """
    _check_inputs(hidden, weight, target, bias)
    target = target.long()      # every integer dtype (int8, uint8, ...) as int64 indices
    vocab = weight.shape[0]
    ignore_index = check_ignore_index(ignore_index)
    if can_branch_on(target):   # (not a target seen through vmap, or while torch.compile traces)
        _check_targets(target, vocab, ignore_index)
    label_smoothing = check_in_range(label_smoothing, "label_smoothing", 0.0, 1.0)
    z_penalty = check_in_range(z_penalty, "z_penalty", 0.0)
    reduction = check_reduction(reduction)
    chunk_size = (default_chunk_size(target.numel(), vocab) if chunk_size is None
                  else check_int_in_range(chunk_size, "chunk_size", 1))
    vocab_block = (default_vocab_block(chunk_size, vocab) if vocab_block is None
                   else check_int_in_range(vocab_block, "vocab_block", 1))
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    setup = _Setup(vocab=vocab, ignore_index=ignore_index, label_smoothing=label_smoothing,
                   z_penalty=z_penalty, reduction=reduction, chunk_size=chunk_size,
                   vocab_block=vocab_block, fused=wants_grad and reduction != "none")
    batch_shape = target.shape
    run = _plain_loss if torch.compiler.is_compiling() or under_transform() else _LinearCrossEntropy.apply
    # (tokens, D) with the count from target: reshape(-1, 0) cannot infer it when D = 0
    loss = run(hidden.reshape(target.numel(), hidden.shape[-1]), weight, bias, target.reshape(-1), setup)
    return loss.reshape(batch_shape) if reduction == "none" else loss
