"""MaxSim (ColBERT late interaction) and Signed MaxSim, in document chunks.

The dense formula ``einsum("qid,bjd->qbij").amax(-1).sum(-1)`` holds a
(Bq, Bd, Lq, Ld) tensor: 7.4 GB in float32 for 32 queries x 32 tokens against 10,000
documents x 180 tokens. Here documents are scored ``chunk_size`` at a time, each chunk
with one matrix product, so the largest temporary is
``Bq * Lq * chunk_size * Ld`` floats however many documents there are.
"""

from __future__ import annotations

import torch

from .._checks import FLOATING_DTYPES, can_branch_on, check_int_in_range, is_functorch_wrapped, under_transform
from .._rows import compute_dtype

#: Default bound on the similarity block of one chunk, in bytes.
DEFAULT_BLOCK_BYTES = 32 * 2**20


def maxsim(Q: torch.Tensor, D: torch.Tensor, q_mask: torch.Tensor | None = None,
           d_mask: torch.Tensor | None = None, chunk_size: int | None = None) -> torch.Tensor:
    r"""ColBERT MaxSim scores of every query against every document.

    .. math:: S(Q, D) = \sum_i \max_j \langle q_i, d_j \rangle

    over visible query tokens ``i`` and visible document tokens ``j``. Khattab & Zaharia
    (2020), "ColBERT: Efficient and Effective Passage Search via Contextualized Late
    Interaction over BERT", arXiv 2004.12832.

    Documents are processed ``chunk_size`` at a time (default: as many as keep the
    similarity block of one chunk under 32 MiB), so the memory is bounded whatever the
    number of documents. Differentiable in ``Q`` and ``D`` (the gradient of each max goes
    to one maximising token). float16/bfloat16 are computed in float32.

    Args:
        Q: (Bq, Lq, d) query token vectors.
        D: (Bd, Ld, d) document token vectors.
        q_mask: optional bool (Bq, Lq), True = visible token; a hidden token adds 0.
        d_mask: optional bool (Bd, Ld), True = visible token. A document with no
            visible token scores 0.
        chunk_size: documents per chunk (int >= 1) or None for the default.

    Returns:
        (Bq, Bd) scores in the dtype of ``Q``.
    """
    Q, D, q_mask, d_mask = _check(Q, D, q_mask, d_mask)
    weights = torch.ones(Q.shape[:2], dtype=compute_dtype(Q.dtype), device=Q.device)
    if q_mask is not None:
        weights = weights * q_mask
    return _weighted_maxsim(Q, D, weights, d_mask, chunk_size)


def signed_maxsim(Q: torch.Tensor, D: torch.Tensor, q_sign: torch.Tensor,
                  q_mask: torch.Tensor | None = None, d_mask: torch.Tensor | None = None,
                  chunk_size: int | None = None) -> torch.Tensor:
    r"""Signed MaxSim: negated query tokens subtract their best match.

    .. math:: S(Q, D) = \sum_i s_i \max_j \langle q_i, d_j \rangle, \quad s_i \in \{+1, -1\}

    Our reading of Signed MaxSim (2025; see DESIGN.md): a query such as "A but not C"
    carries sign -1 on the tokens of C, so a document that matches C is pushed down
    instead of up. With every sign +1 this is :func:`maxsim`. Chunked, masked and
    differentiable exactly as :func:`maxsim`.

    Args:
        q_sign: (Bq, Lq) tensor of +1 / -1 (any real or integer dtype).
        Q, D, q_mask, d_mask, chunk_size: as in :func:`maxsim`.
    """
    Q, D, q_mask, d_mask = _check(Q, D, q_mask, d_mask)
    if not isinstance(q_sign, torch.Tensor):
        raise TypeError(f"q_sign must be a torch.Tensor of +1/-1, got {type(q_sign).__name__}")
    if q_sign.shape != Q.shape[:2]:
        raise ValueError(f"q_sign must have shape (Bq, Lq) = {tuple(Q.shape[:2])}, got {tuple(q_sign.shape)}")
    if q_sign.dtype == torch.bool or q_sign.is_complex():
        raise TypeError(f"q_sign must be a real tensor of +1/-1, got dtype {q_sign.dtype}")
    if can_branch_on(q_sign) and not bool(((q_sign == 1) | (q_sign == -1)).all()):
        raise ValueError("q_sign must contain only +1 and -1")
    weights = q_sign.to(device=Q.device, dtype=compute_dtype(Q.dtype))
    if q_mask is not None:
        weights = weights * q_mask
    return _weighted_maxsim(Q, D, weights, d_mask, chunk_size)


def default_chunk_size(Q: torch.Tensor, D: torch.Tensor, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    """Documents per chunk so that one chunk's similarity block stays under ``block_bytes``."""
    per_document = Q.shape[0] * Q.shape[1] * max(D.shape[1], 1) * torch.finfo(compute_dtype(Q.dtype)).bits // 8
    return max(1, block_bytes // max(per_document, 1))


def _weighted_maxsim(Q, D, weights, d_mask, chunk_size):
    """``sum_i w_i max_j <q_i, d_j>`` over visible ``j`` (0 for a document with none)."""
    bq, lq, dim = Q.shape
    bd, ld, _ = D.shape
    out_dtype = Q.dtype
    cdt = compute_dtype(Q.dtype)
    chunk = default_chunk_size(Q, D) if chunk_size is None else check_int_in_range(chunk_size, "chunk_size", 1)
    if bq * lq == 0 or bd == 0 or ld == 0 or dim == 0:  # all zeros, still attached to Q and D for autograd
        return torch.zeros(bq, bd, dtype=out_dtype, device=Q.device) + 0 * Q.sum() + 0 * D.sum()
    queries = Q.to(cdt).reshape(bq * lq, dim)
    # Without autograd every chunk's similarity block is written into one buffer; otherwise (and under
    # forward AD or a torch.func transform: no out= or in-place there) by differentiable ops.
    track_grad = not _plain(Q, D, weights, d_mask)
    buffer = None if track_grad else torch.empty(bq * lq * min(chunk, bd) * ld, dtype=cdt, device=Q.device)
    scores = []
    for start in range(0, bd, chunk):
        docs = D[start:start + chunk].to(cdt)
        c = docs.shape[0]
        if d_mask is not None:
            visible = d_mask[start:start + c]
            if track_grad:   # dQ = dsim @ docs: a hidden token's NaN or inf times its zero weight is NaN
                docs = docs.masked_fill(~visible.unsqueeze(-1), 0)
        docs = docs.reshape(-1, dim)
        if track_grad:
            sim = queries @ docs.T
        else:
            sim = torch.matmul(queries, docs.T, out=buffer[: bq * lq * c * ld].view(bq * lq, c * ld))
        sim = sim.view(bq * lq, c, ld)
        if d_mask is not None:
            sim = sim.masked_fill(~visible, float("-inf")) if track_grad else sim.masked_fill_(~visible, float("-inf"))
        best = sim.max(-1).values if track_grad else sim.amax(-1)
        if d_mask is not None:
            best = torch.where(visible.any(-1), best, torch.zeros((), dtype=cdt, device=best.device))
        scores.append(torch.einsum("qi,qic->qc", weights, best.view(bq, lq, c)))
    return torch.cat(scores, dim=1).to(out_dtype)


def _plain(Q, D, weights, d_mask) -> bool:
    """Whether no autograd graph, forward-mode AD level or ``torch.func`` transform (``vmap``,
    ``grad``, ``jvp``) sees the inputs: only then may the similarity blocks be written with ``out=``
    and in-place ops (they have no forward derivative and no batching rule)."""
    if torch.is_grad_enabled() and (Q.requires_grad or D.requires_grad):
        return False
    if under_transform():
        return False
    return not any(t is not None and is_functorch_wrapped(t) for t in (Q, D, weights, d_mask))


def _check(Q, D, q_mask, d_mask):
    for name, x in (("Q", Q), ("D", D)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOATING_DTYPES:   # (float8: NotImplementedError from max)
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (batch, tokens, dim), got {tuple(x.shape)}")
    if Q.shape[2] != D.shape[2]:
        raise ValueError(f"Q and D must have the same vector size; got Q {tuple(Q.shape)} and D {tuple(D.shape)}")
    if Q.device != D.device:
        raise ValueError(f"Q and D must be on the same device, got {Q.device} and {D.device}")
    if D.dtype != Q.dtype:
        raise TypeError(f"Q and D must have the same dtype, got {Q.dtype} and {D.dtype}")
    q_mask = _check_mask(q_mask, Q, "q_mask")
    if q_mask is not None:   # a hidden token's vector is never read (a NaN there made every score NaN)
        Q = Q.masked_fill(~q_mask.unsqueeze(-1), 0)
    return Q, D, q_mask, _check_mask(d_mask, D, "d_mask")


def _check_mask(mask, x, name):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = visible) or None")
    if mask.shape != x.shape[:2]:
        raise ValueError(f"{name} must have shape {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
    return mask.to(x.device)
