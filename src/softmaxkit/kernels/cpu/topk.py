r"""Fused softmax + top-k (Milakov & Gimelshein 2018, arXiv 1805.02867, section 4).

One read of each row computes both the online normaliser ``(m, d)`` and the ``k``
largest scores with their indices; the output is ``exp(x_j - m) / d`` (or
``x_j - m - log d``) at those ``k`` entries only, so nothing of the row's size is ever
written. The row is scanned in blocks of :data:`BLOCK` elements that stay in cache: the
maxima of its chunks of :data:`CHUNK` entries and the block sum of ``exp(x - m_b)`` are
vectorised reductions. The k-th largest chunk maximum bounds the k-th largest score
from below, so only the (about ``k``) chunks reaching it are then searched with a
size-``k`` min-heap; the rest of the row is never compared entry by entry.

Order and ties: results are sorted by decreasing score; equal scores are ordered by
increasing index (the earlier entry wins a place in the top k). Since softmax is
monotone, this is the top-k of the probabilities too; probabilities that round to the
same float can come from different scores, and then the larger score ranks first.

Rows with a NaN, a ``+inf`` or only ``-inf`` entries are flagged in ``special`` and
left to the caller (the reference handles them).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._exp import exp
from ._intrinsics import cast_like
from .softmax import _max, _sum_exp, merge_state

BLOCK = 2048
#: Entries per chunk whose maximum decides whether the chunk is searched for the top k.
CHUNK = 64


@njit(cache=True)
def _worse(va, ia, vb, ib):
    """Entry a ranks below entry b: smaller score, or equal score and larger index."""
    return va < vb or (va == vb and ia > ib)


@njit(cache=True)
def _sift_down(hv, hi, k, pos):
    while True:
        left = 2 * pos + 1
        if left >= k:
            return
        child = left
        right = left + 1
        if right < k and _worse(hv[right], hi[right], hv[left], hi[left]):
            child = right
        if _worse(hv[child], hi[child], hv[pos], hi[pos]):
            hv[pos], hv[child] = hv[child], hv[pos]
            hi[pos], hi[child] = hi[child], hi[pos]
            pos = child
        else:
            return


@njit(cache=True)
def _push(hv, hi, k, filled, v, i):
    """Offer entry (v, i) to the heap of the k best so far; returns the new fill count."""
    if filled < k:
        hv[filled] = v
        hi[filled] = i
        filled += 1
        if filled == k:
            for p in range(k // 2 - 1, -1, -1):
                _sift_down(hv, hi, k, p)
    elif v > hv[0]:
        hv[0] = v
        hi[0] = i
        _sift_down(hv, hi, k, 0)
    return filled


@njit(cache=True)
def _row_topk(x, k, hv, hi, chunk_max):
    """Online (m, d) and the top-k scores/indices of one row (heap order); returns (m, d, ok)."""
    n = x.shape[0]
    neg_inf = cast_like(-np.inf, x[0])
    one = cast_like(1.0, x[0])
    m = neg_inf
    d = one - one
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        mb = neg_inf
        for c in range(start, stop, CHUNK):
            cm = _max(x[c:min(c + CHUNK, stop)], neg_inf)
            chunk_max[c // CHUNK] = cm
            mb = max(mb, cm)
        if not mb < -neg_inf:
            return m, d, False
        if mb > neg_inf:
            m, d = merge_state(m, d, mb, _sum_exp(x[start:stop], one, mb))
    if not (m > neg_inf and d > 0 and d < -neg_inf and d == d):
        return m, d, False
    # The k-th largest chunk maximum is a lower bound on the k-th largest entry (k
    # different chunks reach it), so only chunks reaching it can hold the top k.
    chunks = (n + CHUNK - 1) // CHUNK
    bound = neg_inf
    if chunks > k:
        bound = np.partition(chunk_max[:chunks], chunks - k)[chunks - k]
    filled = 0
    for c in range(chunks):
        if chunk_max[c] >= bound:
            for i in range(c * CHUNK, min(c * CHUNK + CHUNK, n)):
                if x[i] >= bound:
                    filled = _push(hv, hi, k, filled, x[i], i)
    return m, d, True


@njit(parallel=True, cache=True)
def softmax_topk_rows(x, k, values, indices, special, log):
    """Top-k softmax (or log-softmax) values and indices of each row, sorted, fused."""
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        hv = np.empty(k, x.dtype)
        hi = np.empty(k, np.int64)
        m, d, ok = _row_topk(xr, k, hv, hi, np.empty((n + CHUNK - 1) // CHUNK, x.dtype))
        special[r] = 0 if ok else 1
        if not ok:
            continue
        order = np.argsort(-hv, kind="mergesort")
        # equal scores: increasing index
        sv = hv[order]
        si = hi[order]
        j = 0
        while j < k:
            e = j + 1
            while e < k and sv[e] == sv[j]:
                e += 1
            if e - j > 1:
                si[j:e] = np.sort(si[j:e])
            j = e
        inv = cast_like(1.0, d) / d
        log_d = np.log(d)
        for j in range(k):
            if log:
                values[r, j] = (sv[j] - m) - log_d
            else:
                values[r, j] = exp(sv[j] - m) * inv
            indices[r, j] = si[j]


def softmax_topk(x, k: int, log: bool = False):
    """Fused top-k of ``softmax(x)`` (or log-softmax) along the last axis of a CPU tensor.

    Rows flagged special (NaN / ``+inf`` / all ``-inf``) are recomputed by the reference.
    """
    import torch

    from . import sync_threads

    sync_threads()
    n = x.shape[-1]
    x2 = x.detach().reshape(-1, n)
    rows = x2.shape[0]
    values = torch.empty((rows, k), dtype=x.dtype)
    indices = torch.empty((rows, k), dtype=torch.int64)
    special = torch.zeros(rows, dtype=torch.uint8)
    softmax_topk_rows(x2.numpy(), k, values.numpy(), indices.numpy(), special.numpy(), log)
    bad = special.nonzero().flatten()
    if bad.numel():
        from ...normalizers.softmax import log_softmax, softmax
        from ..dispatch import use_backend
        with use_backend("reference"):
            p = (log_softmax if log else softmax)(x2[bad], dim=-1)
        values[bad], indices[bad] = torch.topk(p, k, dim=-1)
    return values.reshape(x.shape[:-1] + (k,)), indices.reshape(x.shape[:-1] + (k,))
