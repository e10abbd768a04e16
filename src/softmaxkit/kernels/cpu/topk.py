r"""Fused softmax + top-k (Milakov & Gimelshein 2018, arXiv 1805.02867, section 4).

One read of each row computes both the online normaliser ``(m, d)`` and the ``k``
largest scores with their indices; the output is ``exp(x_j - m) / d`` (or
``x_j - m - log d``) at those ``k`` entries only, so nothing of the row's size is ever
written. The row is scanned in blocks of :data:`BLOCK` elements that stay in cache: the
maxima of its chunks of :data:`CHUNK` entries and the block sum of ``exp(x - m_b)`` are
vectorised reductions. The k-th largest chunk maximum bounds the k-th largest score
from below, so only the (about ``k``) chunks reaching it are then searched with a
size-``k`` min-heap; the rest of the row is never compared entry by entry.

Order and ties (the same rule as the reference path of :func:`softmaxkit.softmax_topk`):
results are sorted by decreasing probability (log-probability), equal values by
increasing index, over the whole row: where different scores round to the same value
(e.g. probabilities that underflow to 0), the entries with the smallest indices among
the tied ones are returned.

Rows with a NaN, a ``+inf`` or only ``-inf`` entries are flagged in ``special`` and
left to the caller (the reference handles them).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._intrinsics import cast_like, fmax, wide_vectors
from .parallel import parallel_njit
from .softmax import _max, _sum_exp, merge_state

BLOCK = 2048
#: Entries per chunk whose maximum decides whether the chunk is searched for the top k. LLVM
#: vectorises the chunk loop of :func:`_chunk_maxima` at 128 entries and not at 64: the chunk
#: maxima and sum of a 128256-entry float32 row took 5.3 us with 128, 50 with 64 (9.4 and 50
#: in float64; 2026-12-04, Intel Xeon, AVX-512); the search then reads about twice the entries.
CHUNK = 128


@njit(cache=True, error_model="numpy")
def _worse(va, ia, vb, ib):
    """Entry a ranks below entry b: smaller score, or equal score and larger index."""
    return va < vb or (va == vb and ia > ib)


@njit(cache=True, error_model="numpy")
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


@njit(cache=True, error_model="numpy")
def _kth_largest(v, k, heap, scratch):
    """The ``k``-th largest of ``v`` (``k <= len(v)``; no NaN), keeping a min-heap of the ``k``
    largest so far in ``heap`` (``scratch``: the heap's index array, all equal here, so that
    :func:`_sift_down` compares values alone): one comparison per entry past the first ``k``,
    against ``np.partition``'s copy and selection (27 us against about 5 for the 2004 maxima
    of a 128256-entry row in chunks of 64)."""
    for i in range(k):
        heap[i] = v[i]
        scratch[i] = 0
    for p in range(k // 2 - 1, -1, -1):
        _sift_down(heap, scratch, k, p)
    for i in range(k, v.shape[0]):
        if v[i] > heap[0]:
            heap[0] = v[i]
            _sift_down(heap, scratch, k, 0)
    return heap[0]


@njit(cache=True, error_model="numpy")
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


@njit(fastmath={"reassoc", "nsz", "nnan"}, cache=True, error_model="numpy")
def _chunk_maxima(x, chunk_max):
    """The maximum of each chunk of ``x`` into ``chunk_max``; returns ``(largest, sum of x)``. One
    vectorised pass with a fixed chunk length (a call per chunk cost more than the entries
    of the 64-entry chunks used before; in :func:`_row_topk`, which needs no sum, a :func:`_max` call per
    chunk measured faster, and one call of this per block no faster at 128). The maxima ignore
    a NaN (``nnan``, as the softmax kernels' maxima); the sum carries it."""
    wide_vectors()
    n = x.shape[0]
    top = cast_like(-np.inf, x[0])
    total = cast_like(0.0, x[0])
    c = 0
    while c + CHUNK <= n:
        m = x[c]
        s = cast_like(0.0, x[0])
        for i in range(CHUNK):
            v = x[c + i]
            m = fmax(m, v)
            s += v
        chunk_max[c // CHUNK] = m
        top = fmax(top, m)
        total += s
        c += CHUNK
    if c < n:
        m = x[c]
        for i in range(c, n):
            m = fmax(m, x[i])
            total += x[i]
        chunk_max[c // CHUNK] = m
        top = fmax(top, m)
    return top, total


@njit(cache=True, error_model="numpy")
def _search_chunks(x, k, hv, hi, chunk_max, bound):
    """Push every entry ``>= bound`` of the chunks whose maximum reaches ``bound`` into the
    size-``k`` heap ``(hv, hi)`` (filled from empty)."""
    n = x.shape[0]
    filled = 0
    for c in range((n + CHUNK - 1) // CHUNK):
        if chunk_max[c] >= bound:
            for i in range(c * CHUNK, min(c * CHUNK + CHUNK, n)):
                if x[i] >= bound:
                    filled = _push(hv, hi, k, filled, x[i], i)


@njit(cache=True, error_model="numpy")
def _search_bound(chunk_max, k, hv, hi):
    """The k-th largest chunk maximum, a lower bound on the k-th largest entry (``k`` different
    chunks reach it), or ``-inf`` when there are at most ``k`` chunks (``hv``, ``hi``: scratch)."""
    chunks = chunk_max.shape[0]
    if chunks > k:
        return _kth_largest(chunk_max, k, hv, hi)
    return cast_like(-np.inf, chunk_max[0])


@njit(cache=True, error_model="numpy")
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
    # only chunks reaching the bound can hold the top k (hv, hi: the bound's scratch, then the heap)
    chunks = (n + CHUNK - 1) // CHUNK
    _search_chunks(x, k, hv, hi, chunk_max, _search_bound(chunk_max[:chunks], k, hv, hi))
    return m, d, True


@njit(cache=True, error_model="numpy")
def _value(s, m, d, log_d, log):
    """The output for score ``s``, as the reference computes it: ``exp(s - m) / d`` (libm
    exp: subnormal results kept) or ``(s - m) - log d``."""
    if log:
        return (s - m) - log_d
    return cast_like(math.exp(s - m), d) / d


@njit(cache=True, error_model="numpy")
def _order_by_value(xr, k, sv, si, vals, m, d, log_d, log):
    """Reorder the k entries (sorted by score, then index) to the documented order:
    decreasing value, equal values by increasing index, over the whole row. Different
    scores can round to the same value (probabilities that underflow to 0, scores closer
    than the spacing of the outputs); then entries outside the k best scores can tie with
    the k-th value, and the smallest indices among all tied entries are taken."""
    n = xr.shape[0]
    vk = vals[k - 1]
    gt = 0
    while gt < k and vals[gt] > vk:
        gt += 1
    below = np.nextafter(sv[k - 1], cast_like(-np.inf, sv[k - 1]))
    # (below = -inf too: a k-th score of -inf, or of -finfo.max, ties with the -inf entries left out)
    if k < n and _value(below, m, d, log_d, log) == vk:
        # outside entries can tie with the k-th value: take the smallest tied indices
        ties_hi = sv[gt]
        found = 0
        need = k - gt
        for j in range(n):
            xj = xr[j]
            if xj <= ties_hi and _value(xj, m, d, log_d, log) == vk:
                sv[gt + found] = xj
                si[gt + found] = j
                vals[gt + found] = vk
                found += 1
                if found == need:
                    break
    # equal values (contiguous: values fall with the score): increasing index
    j = 0
    while j < k:
        e = j + 1
        while e < k and vals[e] == vals[j]:
            e += 1
        if e - j > 1:
            si[j:e] = np.sort(si[j:e])
        j = e


@parallel_njit(cache=True, error_model="numpy")
def softmax_topk_rows(x, k, values, indices, special, log):
    """Top-k softmax (or log-softmax) values and indices of each row, sorted, fused.

    ``special`` protocol: filled with 2 by the caller; 0 once a row is written, 1 for a row
    left to the reference (NaN, ``+inf``, nothing visible)."""
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        hv = np.empty(k, x.dtype)
        hi = np.empty(k, np.int64)
        m, d, ok = _row_topk(xr, k, hv, hi, np.empty((n + CHUNK - 1) // CHUNK, x.dtype))
        if not ok:
            for j in range(k):
                values[r, j] = 0
                indices[r, j] = 0
            special[r] = 1
            continue
        order = np.argsort(-hv, kind="mergesort")
        sv = hv[order]
        si = hi[order]
        log_d = np.log(d)
        vals = np.empty(k, x.dtype)
        for j in range(k):
            vals[j] = _value(sv[j], m, d, log_d, log)
        _order_by_value(xr, k, sv, si, vals, m, d, log_d, log)
        for j in range(k):
            values[r, j] = vals[j]
            indices[r, j] = si[j]
        special[r] = 0


@njit(cache=True)
def _has_nan(x):
    """Whether ``x`` holds a NaN: the exact test behind a NaN row sum, which a finite row also
    gives when its sum overflows to ``+inf`` where a ``-inf`` entry (or ``-finfo.max``) meets it."""
    for v in x:
        if v != v:
            return True
    return False


@parallel_njit(cache=True, error_model="numpy")
def topk_rows(x, k, values, indices, special):
    """The ``k`` largest entries of each row and their indices, sorted by decreasing value, equal
    values by increasing index; one read of the row (chunk maxima) and a search of the chunks
    that reach the k-th largest chunk maximum (:func:`_row_topk` without the normaliser).

    ``special``: 0 once a row is written, 1 for a row with a NaN or a ``+inf`` entry (left to the
    caller)."""
    rows, n = x.shape
    chunks = (n + CHUNK - 1) // CHUNK
    for r in prange(rows):
        xr = x[r]
        chunk_max = np.empty(chunks, x.dtype)
        top, total = _chunk_maxima(xr, chunk_max)
        if top == np.inf or (total != total and _has_nan(xr)):   # +inf, or a NaN (the sum keeps it)
            special[r] = 1
            continue
        hv = np.empty(k, x.dtype)
        hi = np.empty(k, np.int64)
        _search_chunks(xr, k, hv, hi, chunk_max, _search_bound(chunk_max, k, hv, hi))
        by_index = np.argsort(hi)
        hv, hi = hv[by_index], hi[by_index]
        order = np.argsort(-hv, kind="mergesort")   # stable: equal values keep increasing index
        for j in range(k):
            values[r, j] = hv[order[j]]
            indices[r, j] = hi[order[j]]
        special[r] = 0


def topk(x, k: int):
    """``(values, indices)`` of the ``k`` largest entries of each row of a 2-d C-contiguous CPU
    float32/float64 tensor (``k <= x.shape[1]``), sorted by decreasing value, equal values by
    increasing index; None when a row holds a NaN or a ``+inf`` entry (the caller's torch path
    then decides)."""
    import torch

    from . import call_kernel, sync_threads

    sync_threads()
    rows = x.shape[0]
    values = torch.empty((rows, k), dtype=x.dtype)
    indices = torch.empty((rows, k), dtype=torch.int64)
    special = torch.full((rows,), 2, dtype=torch.uint8)
    call_kernel("topk", topk_rows, x.detach().numpy(), k, values.numpy(), indices.numpy(), special.numpy())
    if bool((special != 0).any()):
        return None
    return values, indices


def softmax_topk(x, k: int, log: bool = False):
    """Fused top-k of ``softmax(x)`` (or log-softmax) along the last axis of a CPU tensor.

    Returns ``(values, indices, todo)``: ``todo`` (bool, ``x.shape[:-1]``) marks the rows
    not computed (NaN / ``+inf`` / nothing visible), which hold zeros; the dispatcher
    recomputes them with the reference.
    """
    import torch

    from . import FLAG_TODO, call_kernel, sync_threads

    sync_threads()
    n = x.shape[-1]
    x2 = x.detach().reshape(-1, n)
    rows = x2.shape[0]
    values = torch.empty((rows, k), dtype=x.dtype)
    indices = torch.empty((rows, k), dtype=torch.int64)
    special = torch.full((rows,), FLAG_TODO, dtype=torch.uint8)
    call_kernel("softmax_topk", softmax_topk_rows, x2.numpy(), k, values.numpy(), indices.numpy(),
                special.numpy(), log)
    todo = special != 0
    if bool(todo.any()):
        values[todo] = 0
        indices[todo] = 0
    shape = x.shape[:-1] + (k,)
    return values.reshape(shape), indices.reshape(shape), todo.reshape(x.shape[:-1])
