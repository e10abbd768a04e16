r"""numba kernels for softmax, log-softmax and log-sum-exp along the last axis.

Each kernel works on a C-contiguous 2-d array (rows, n), float32 or float64, parallel
over rows (``prange``). Three algorithms compute the normaliser of a row:

* **three-pass**: ``m = max x``; ``s = sum exp(x - m)``; ``y = exp(x - m) / s``.
* **two-pass** (Dukhan & Ablavatski 2020, "The Two-Pass Softmax Algorithm",
  arXiv 2001.04438): every ``e^{x_i}`` is kept as a (mantissa, exponent) pair
  ``(m_i, n_i)``, ``e^{x_i} = m_i 2^{n_i}``, which cannot overflow, so no maximum is
  needed: pass 1 accumulates ``(S, N) = sum_i m_i 2^{n_i}`` (pairs are added by
  rescaling to the larger exponent, block by block), pass 2 writes
  ``y_i = m_i 2^{n_i - N} / S``.
* **online** (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax",
  arXiv 1805.02867): pass 1 keeps the running ``(m, d)`` and merges block results with
  ``(m, d) (+) (m', d') = (M, d e^{m-M} + d' e^{m'-M})``; pass 2 writes
  ``exp(x - m) / d``.

Inside a pass, work is done on blocks of :data:`BLOCK` elements that stay in the L1
cache, so every inner loop is a plain vectorisable reduction or map. On this
compute-bound hardware ``exp`` dominates, so each variant evaluates it once per entry:
the first pass that computes it also stores it in the output (``exp(x - m)`` for
three-pass, ``exp(x - m_b)`` with the block maximum for online, ``m_i 2^{n_i - N_b}``
with the block's largest exponent for two-pass), and the last pass only rescales
(by ``1/s``, ``e^{m_b - m}/d`` or ``2^{N_b - N}/S`` per block); this is the "reloading"
form of each algorithm in Dukhan & Ablavatski's terms. The three-pass and online sums use
``exp_nonpositive_fast`` (float32: within 2 ulp, no compensated sums; measured error of the
probabilities within 1.2x of ``torch.softmax``'s against float64), and the loops run on
512-bit vectors where the CPU has AVX-512 (:func:`._intrinsics.wide_vectors`).

Rows the fast path does not handle (a NaN, a ``+inf``, every entry ``-inf``, or, for
two-pass, magnitudes beyond :data:`TWO_PASS_LIMIT`) are finished by a scalar routine
that follows the reference definition: a ``+inf`` maximum gives equal weight to the
``+inf`` entries, a row of ``-inf`` gives zeros (log-softmax ``-inf``, log-sum-exp
``-inf``), and a NaN makes every visible entry of its row NaN (the NaN stays in its
row; the reference, whose normaliser is then NaN, returns unnormalised values there). Such rows are flagged in
``special`` when their reference gradient is zero (``+inf`` rows; all ``-inf`` rows
for log-softmax), so that the backward kernels can return 0 there.

log-softmax and log-sum-exp need ``x - m`` with ``m`` the row maximum to stay exact for
large magnitudes, so they use the online normaliser when two-pass is asked for.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from ._exp import exp, exp_nonpositive_fast, exp_parts, pow2
from ._intrinsics import cast_like, fmax, pointer_to, wide_vectors
from .parallel import parallel_njit, serial_twin

THREE_PASS, TWO_PASS, ONLINE = 0, 1, 2
ALGORITHMS = {"three_pass": THREE_PASS, "two_pass": TWO_PASS, "online": ONLINE}
PROBS, LOG_PROBS, LSE = 0, 1, 2

#: Elements per block: 8 KiB of float32, well inside L1.
BLOCK = 2048
#: Two-pass rounds ``x log2 e`` with the magic-number trick, exact while |x log2 e| < 2^22.
TWO_PASS_LIMIT = 1.0e6

_FAST = {"reassoc", "nsz", "contract", "arcp"}
#: No FMA contraction where ``x * scale - shift`` is formed: the product must be rounded
#: first, as the reference's ``z = x * scale`` is, or a huge ``|x * scale|`` leaves a
#: residual of up to half an ulp of it in the exponent (exp of +-1e30 for finfo.min / 3).
_FAST_NO_FMA = {"reassoc", "nsz", "arcp"}
_SPECIAL_ZERO_GRAD = np.uint8(1)
#: A row whose maximum is ``+inf``: its output is the limit (equal weights on the ``+inf``
#: entries) and its gradient zero, as for ``_SPECIAL_ZERO_GRAD``; told apart because nothing
#: in the output shows it (a row with nothing visible shows it: all 0, or all ``-inf``).
_SPECIAL_LIMIT = np.uint8(3)
#: A row left to the reference (the package's FLAG_TODO).
_SPECIAL_TODO = np.uint8(2)
#: ``special`` value of a row not (yet) computed. The caller fills ``special`` with it;
#: each row overwrites it only once its output is complete, so a row left at FLAG_TODO
#: (a kernel thread that stopped, a row the kernel cannot handle) is recomputed by the
#: reference and never returned unwritten.
FLAG_TODO = np.uint8(2)


# ---- vectorised block primitives ------------------------------------------------------

# nnan lets LLVM vectorise the max reduction; a NaN in the row can then give any value
# here, but the NaN also makes the row's sum NaN, which sends the row to _careful_row.
@njit(fastmath={"reassoc", "nsz", "nnan"}, cache=True, error_model="numpy")
def _max(x, init):
    wide_vectors()
    m = init
    for i in range(x.shape[0]):
        m = fmax(m, x[i])
    return m


@njit(cache=True, inline="always", error_model="numpy")
def merge_state(m, d, mb, db):
    """Online-normalizer merge (Milakov & Gimelshein 2018), as OnlineSoftmaxState.merge:
    ``(m, d) + (mb, db) = (M, d e^{m-M} + db e^{mb-M})``, M = max(m, mb), with finite ``mb``."""
    if mb > m:
        return mb, d * exp(m - mb) + db
    return m, d + db * exp(mb - m)


@njit(fastmath=_FAST_NO_FMA, cache=True, error_model="numpy")
def _sum_exp(x, scale, shift):
    wide_vectors()
    s = shift - shift
    for i in range(x.shape[0]):
        s += exp_nonpositive_fast(x[i] * scale - shift)
    return s


@njit(fastmath=_FAST_NO_FMA, cache=True, error_model="numpy")
def _store_exp(x, out, scale, shift):
    """``out = exp(x scale - shift)``; returns the sum. (Loops run over slices from 0:
    numba then knows the index is non-negative and LLVM vectorises them.)"""
    wide_vectors()
    s = shift - shift
    for i in range(x.shape[0]):
        e = exp_nonpositive_fast(x[i] * scale - shift)
        out[i] = e
        s += e
    return s


@njit(fastmath=_FAST, cache=True, error_model="numpy")
def _rescale(out, factor):
    wide_vectors()
    for i in range(out.shape[0]):
        out[i] *= factor


@njit(cache=True, error_model="numpy")
def _write_log_probs(x, out, scale, shift, log_sum):
    """``out = x * scale - shift - log_sum``; whether a finite score gave ``-inf`` (``x - max``
    overflowed: finfo.max beside finfo.min; or ``x * scale`` did: a finfo.min fill over
    ``T < 1``). The reference passes that entry's gradient, where a ``-inf`` output otherwise
    marks a ``-inf`` score that passes none, so such a row is left to the reference."""
    wide_vectors()
    neg_inf = cast_like(-np.inf, scale)
    overflow = False
    for i in range(x.shape[0]):
        v = (x[i] * scale - shift) - log_sum
        out[i] = v
        overflow = overflow | ((v == neg_inf) & (x[i] != neg_inf))
    return overflow


@njit(fastmath=_FAST, cache=True, error_model="numpy")
def _overflows_when_scaled(x, scale):
    """Whether a finite score's ``x * scale`` is ``-inf`` (a finfo.min fill over ``T < 1``).
    The reference computes such a row as ``(x - max) / T``, exact where the other entries'
    rounded ``x / T`` is not (T = 0.01, scores near 1000: probabilities 0.1% apart); the
    row is left to it."""
    wide_vectors()
    neg_inf = cast_like(-np.inf, scale)
    found = False
    for i in range(x.shape[0]):
        found = found | ((x[i] * scale == neg_inf) & (x[i] != neg_inf))
    return found


# nnan (for the vectorised max reductions) is safe: exp_parts propagates a NaN to its
# mantissa, which makes the block's pair sum NaN, and that sends the row to _careful_row.
@njit(fastmath=_FAST | {"nnan"}, cache=True, error_model="numpy")
def _block_parts(x, out, expo, scale, limit):
    """Mantissas of ``e^{x scale}`` into ``out``, exponents into ``expo``; (max exponent, out of range)."""
    wide_vectors()
    nmax = -limit - limit
    vmax = nmax
    for i in range(x.shape[0]):
        v = x[i] * scale
        m, n = exp_parts(v)
        out[i] = m
        expo[i] = n
        nmax = fmax(nmax, n)
        vmax = fmax(vmax, v)
    return nmax, not vmax <= limit


@njit(fastmath=_FAST, cache=True, error_model="numpy")
def _block_pair_sum(out, expo, nmax):
    """``out_i = m_i 2^{n_i - nmax}`` on the block; returns their sum."""
    wide_vectors()
    s = nmax - nmax
    for i in range(out.shape[0]):
        e = out[i] * pow2(expo[i] - nmax, nmax)
        out[i] = e
        s += e
    return s


# ---- softmax rows: each writes exp once per entry, then rescales ------------------------

@njit(cache=True, error_model="numpy", inline="always")
def _three_pass_probs(x, out, scale):
    """max; store exp(x - max) and sum; scale by 1/sum (three-pass, reloading). The sum is
    taken per block of :data:`BLOCK` and the block sums added (a long float32 row stays
    within about 1e-6 of 1, as the online sum); every entry is ``exp(x - max)`` times the
    same ``1 / sum``, so equal scores get equal probabilities wherever they lie."""
    neg_inf = cast_like(-np.inf, scale)
    m = _max(x, neg_inf) * scale
    # a short row: one pass, checked after it, not before (a branch between the passes cost
    # a row of 128 entries a third of its time). A row with a non-finite maximum fills
    # ``out`` with values of no use (the exponential takes any argument safely), which
    # _careful_row overwrites.
    s = _store_exp(x, out, scale, m) if x.shape[0] <= BLOCK else _block_exp_sums(x, out, scale, m)
    if not ((m > neg_inf) & (m < -neg_inf) & (s > 0) & (s < -neg_inf)):
        return False
    _rescale(out, cast_like(1.0, s) / s)
    return True


@njit(cache=True, error_model="numpy")
def _block_exp_sums(x, out, scale, m):
    """``out = exp(x scale - m)`` and its sum, taken per block of :data:`BLOCK` (NaN where ``m``
    is not finite)."""
    if not (m > -np.inf and m < np.inf):
        return m - m
    s = m - m
    n = x.shape[0]
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        s += _store_exp(x[start:stop], out[start:stop], scale, m)
    return s


@njit(cache=True, error_model="numpy")
def _online_probs(x, out, scale, block_max):
    """Online normaliser over blocks; each block stored as exp(x - m_b), rescaled at the end."""
    neg_inf = cast_like(-np.inf, scale)
    n = x.shape[0]
    m = neg_inf
    d = cast_like(0.0, scale)
    for b, start in enumerate(range(0, n, BLOCK)):
        stop = min(start + BLOCK, n)
        mb = _max(x[start:stop], neg_inf) * scale
        block_max[b] = mb
        if mb == neg_inf:
            continue
        if not mb < -neg_inf:
            return False
        db = _store_exp(x[start:stop], out[start:stop], scale, mb)
        if mb > m:
            d = d * exp(m - mb) + db
            m = mb
        else:
            d = d + db * exp(mb - m)
    if not (m > neg_inf and d > 0 and d < -neg_inf):
        return False
    inv = cast_like(1.0, d) / d
    for b, start in enumerate(range(0, n, BLOCK)):
        stop = min(start + BLOCK, n)
        if block_max[b] == neg_inf:
            for i in range(start, stop):
                out[i] = cast_like(0.0, scale)
        else:
            _rescale(out[start:stop], exp(block_max[b] - m) * inv)
    return True


@njit(cache=True, error_model="numpy")
def _two_pass_probs(x, out, scale, expo, block_exp):
    """Two-pass: (mantissa, exponent) pairs, summed block by block as S 2^N, then rescaled."""
    limit = cast_like(TWO_PASS_LIMIT, scale)
    big = cast_like(np.inf, scale)
    n_total = -big
    s_total = cast_like(0.0, scale)
    n = x.shape[0]
    for b, start in enumerate(range(0, n, BLOCK)):
        stop = min(start + BLOCK, n)
        nb, bad = _block_parts(x[start:stop], out[start:stop], expo, scale, limit)
        if bad:
            return False
        sb = _block_pair_sum(out[start:stop], expo, nb)
        block_exp[b] = nb
        if nb > n_total:
            s_total = s_total * pow2(n_total - nb, nb) + sb
            n_total = nb
        else:
            s_total = s_total + sb * pow2(nb - n_total, nb)
    # every entry clamped from below (a row of -inf or of huge negative scores): not exact
    lowest = cast_like(-(TWO_PASS_LIMIT - 200.0) * 1.4426950408889634, scale)
    if not (n_total > lowest and s_total > 0 and s_total < big):
        return False
    inv = cast_like(1.0, s_total) / s_total
    for b, start in enumerate(range(0, n, BLOCK)):
        _rescale(out[start:min(start + BLOCK, n)], pow2(block_exp[b] - n_total, n_total) * inv)
    return True


# ---- log-softmax / log-sum-exp rows: (m, s, ok) with softmax = exp(x - m) / s ------------

@njit(cache=True, error_model="numpy", inline="always")
def _three_pass_stats(x, scale):
    neg_inf = cast_like(-np.inf, scale)
    m = _max(x, neg_inf) * scale
    # (checked after the pass, as in _three_pass_probs)
    s = _sum_exp(x, scale, m) if x.shape[0] <= BLOCK else _block_sum_exp(x, scale, m)
    return m, s, (m > neg_inf) & (m < -neg_inf) & (s > 0) & (s < -neg_inf)


@njit(cache=True, error_model="numpy")
def _block_sum_exp(x, scale, m):
    """:func:`_block_exp_sums` without writing the exponentials."""
    if not (m > -np.inf and m < np.inf):
        return m - m
    s = m - m
    n = x.shape[0]
    for start in range(0, n, BLOCK):
        s += _sum_exp(x[start:min(start + BLOCK, n)], scale, m)
    return s


@njit(cache=True, error_model="numpy")
def _online_stats(x, scale):
    neg_inf = cast_like(-np.inf, scale)
    m = neg_inf
    d = cast_like(0.0, scale)
    n = x.shape[0]
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        mb = _max(x[start:stop], neg_inf) * scale
        if mb == neg_inf:
            continue
        if not mb < -neg_inf:
            return mb, mb, False
        m, d = merge_state(m, d, mb, _sum_exp(x[start:stop], scale, mb))
    return m, d, m > neg_inf and d > 0 and d < -neg_inf


# ---- the exact scalar path for rows with NaN / inf -----------------------------------

@njit(cache=True, error_model="numpy")
def _careful_row(x, out, scale, mode):
    """Reference semantics for any row; returns (lse, special flag)."""
    neg_inf = cast_like(-np.inf, scale)
    nan = cast_like(np.nan, scale)
    has_nan = False
    m = neg_inf
    for i in range(x.shape[0]):
        v = x[i] * scale
        if v != v:
            if x[i] == x[i]:
                # 0 * scale with 1/T overflowing: x / T overflowed, not a NaN score; the
                # reference computes the row as (x - max) / T
                return neg_inf, _SPECIAL_TODO
            has_nan = True
        elif v > m:
            m = v
    if has_nan:
        for i in range(x.shape[0]):
            if mode != LSE:
                if x[i] != -np.inf:
                    out[i] = nan
                else:
                    out[i] = neg_inf if mode == LOG_PROBS else cast_like(0.0, scale)
        return nan, np.uint8(0)
    if m == -neg_inf:
        for i in range(x.shape[0]):
            if x[i] * scale == -neg_inf and x[i] != -neg_inf:
                # a finite score whose x / T overflowed: not a +inf score (the reference
                # computes the row as (x - max) / T)
                return neg_inf, _SPECIAL_TODO
        count = 0
        for i in range(x.shape[0]):
            count += x[i] * scale == -neg_inf
        w = cast_like(1.0 / count, scale)
        for i in range(x.shape[0]):
            if mode == PROBS:
                out[i] = w if x[i] * scale == -neg_inf else cast_like(0.0, scale)
            elif mode == LOG_PROBS:
                out[i] = np.log(w) if x[i] * scale == -neg_inf else neg_inf
        return -neg_inf, _SPECIAL_LIMIT
    if m == neg_inf:
        for i in range(x.shape[0]):
            if x[i] != -np.inf:
                # every visible entry overflowed in x * scale (finfo.min / T, T < 1): not a
                # row with nothing visible; the reference scales it after its maximum
                return neg_inf, _SPECIAL_TODO
        for i in range(x.shape[0]):
            if mode == PROBS:
                out[i] = cast_like(0.0, scale)
            elif mode == LOG_PROBS:
                out[i] = neg_inf
        return neg_inf, _SPECIAL_ZERO_GRAD if mode == LOG_PROBS else np.uint8(0)
    if mode == PROBS:
        s = _store_exp(x, out, scale, m)
        _rescale(out, cast_like(1.0, s) / s)
    else:
        s = _sum_exp(x, scale, m)
    if mode == LOG_PROBS and _write_log_probs(x, out, scale, m, np.log(s)):
        return neg_inf, _SPECIAL_TODO
    return m + np.log(s), np.uint8(0)


# ---- the kernel --------------------------------------------------------------------

@njit(cache=True, error_model="numpy", inline="always")
def _normalize_row(x, out, lse, special, scale, algorithm, mode, r):
    """Row ``r`` of :func:`normalize_rows`."""
    n = x.shape[1]
    xr = x[r]
    outr = out[r] if mode != LSE else out[0]
    if n == 0:
        if mode == LSE:
            lse[r] = cast_like(-np.inf, scale)
        special[r] = 0
        return
    if mode == PROBS:
        if algorithm == THREE_PASS:
            ok = _three_pass_probs(xr, outr, scale)
        elif algorithm == TWO_PASS:
            ok = _two_pass_probs(xr, outr, scale, np.empty(BLOCK, x.dtype),
                                 np.empty((n + BLOCK - 1) // BLOCK, x.dtype))
        else:
            ok = _online_probs(xr, outr, scale, np.empty((n + BLOCK - 1) // BLOCK, x.dtype))
        if ok:
            # (as log-probabilities, whose -inf tells; here the 0 does not)
            special[r] = _SPECIAL_TODO if scale > 1 and _overflows_when_scaled(xr, scale) else 0
            return
    else:
        if algorithm == THREE_PASS:
            m, s, ok = _three_pass_stats(xr, scale)
        else:
            m, s, ok = _online_stats(xr, scale)
        if ok:
            if mode == LOG_PROBS:
                if _write_log_probs(xr, outr, scale, m, np.log(s)):
                    special[r] = _SPECIAL_TODO
                    return
            else:
                lse[r] = m + np.log(s)
            special[r] = 0
            return
    value, flag = _careful_row(xr, outr, scale, mode)
    if mode == LSE:
        lse[r] = value
    special[r] = flag


@parallel_njit(cache=True, error_model="numpy")
def normalize_rows(x, out, lse, special, scale, algorithm, mode):
    """Softmax (``mode`` PROBS), log-softmax (LOG_PROBS) or log-sum-exp (LSE) of each row.

    Args:
        x: (rows, n) C-contiguous input.
        out: (rows, n) output for PROBS / LOG_PROBS (ignored for LSE).
        lse: (rows,) receives the row log-sum-exp for LSE (ignored otherwise).
        special: (rows,) uint8, filled with FLAG_TODO by the caller; each finished row
            gets 0, or 1 where the reference gradient is zero.
        scale: ``1 / temperature``, same dtype as ``x``.
        algorithm: THREE_PASS, TWO_PASS or ONLINE.
    """
    for r in prange(x.shape[0]):
        _normalize_row(x, out, lse, special, scale, algorithm, mode, r)


#: :func:`normalize_rows` without the parallel launch, for a single row.
normalize_rows_serial = serial_twin(normalize_rows)


@njit(cache=True)
def _arrays_at(x_address, out_address, lse_address, rows, n, scale, mode):
    """:func:`normalize_rows`'s arrays on the tensors at these addresses (``out`` unused for
    LSE, ``lse`` for the other modes), and a fresh ``special``."""
    out_rows, out_n = (1, 0) if mode == LSE else (rows, n)
    x = carray(pointer_to(x_address, scale), (rows, n))
    out = carray(pointer_to(out_address, scale), (out_rows, out_n))
    lse = carray(pointer_to(lse_address, scale), (rows if mode == LSE else 0,))
    special = np.empty(rows, np.uint8)
    special[:] = FLAG_TODO
    return x, out, lse, special


@njit(cache=True)
def _rows_status(special):
    """Twice the number of rows left to the reference (``FLAG_TODO``), plus 1 where a row
    took its ``+inf`` limit (``_SPECIAL_LIMIT``), whose zero gradient a backward from the
    output alone cannot tell."""
    left = 0
    limit = 0
    for r in range(special.shape[0]):
        left += special[r] == FLAG_TODO
        limit |= special[r] == _SPECIAL_LIMIT
    return 2 * left + limit


@parallel_njit(cache=True, error_model="numpy")
def normalize_rows_at(x_address, out_address, lse_address, rows, n, scale, algorithm, mode):
    """:func:`normalize_rows` on C-contiguous tensors given by their addresses (``out`` the
    output for PROBS / LOG_PROBS, ``lse`` the ``(rows,)`` result for LSE; pass any valid
    address for the one the mode does not use). Returns the number of rows left to the
    reference, times 2, plus 1 where a row took its ``+inf`` limit (:func:`_rows_status`).
    Called with addresses, the kernel costs about 0.5 us of Python instead of the
    ~10 us of converting and unboxing four arrays: the lanes' forward on small inputs."""
    x, out, lse, special = _arrays_at(x_address, out_address, lse_address, rows, n, scale, mode)
    for r in prange(rows):
        _normalize_row(x, out, lse, special, scale, algorithm, mode, r)
    return _rows_status(special)

#: :func:`normalize_rows_at` without the parallel launch, for a single row.
normalize_rows_at_serial = serial_twin(normalize_rows_at)


# ---- backward -------------------------------------------------------------------------

#: What :func:`_row_sum` adds: ``g``, ``y g``, ``g`` where ``y > -inf`` (log-softmax's visible
#: entries), ``y g`` where ``y != 0`` (softmax's support).
_G, _YG, _G_VISIBLE, _YG_SUPPORT = 0, 1, 2, 3


@njit(fastmath=_FAST, cache=True, error_model="numpy", inline="always")
def _row_sum(y, g, kind):
    """A backward row sum (``kind``: see :data:`_G`): each block of BLOCK entries added in the
    row's dtype (vectorised), the blocks' sums in float64, as the forward does (one running
    float32 sum over a row of 2^20 entries put a peaked row's log-softmax gradient 43 ulps of
    sum(g) off; the reference: 1). ``kind`` is a constant at each call, so each inlined copy
    keeps one branch of the loop. A ``-inf`` output's gradient is dropped, NaN included (an
    entropy ``where(isfinite(logp), p logp, 0)`` sends NaN there)."""
    wide_vectors()
    zero = cast_like(0.0, g[0])
    neg_inf = cast_like(-np.inf, y[0])
    n = g.shape[0]
    total = 0.0
    for k in range((n + BLOCK - 1) // BLOCK):   # (a loop over range(start, end) is not vectorised)
        start = k * BLOCK
        s = zero
        for j in range(min(BLOCK, n - start)):
            i = start + j
            if kind == _G:
                s += g[i]
            elif kind == _YG:
                s += y[i] * g[i]
            elif kind == _G_VISIBLE:
                s += g[i] if y[i] != neg_inf else zero
            else:
                s += y[i] * g[i] if y[i] != zero else zero
        total += s
    return cast_like(total, g[0])


@njit(fastmath=_FAST, cache=True, error_model="numpy")
def _log_backward_without_hidden(y, g, dx, scale):
    """The log-softmax row gradient ``dx = scale (g - e^y sum g)`` of a row with no ``-inf``
    output, the common row, whose sum reads only ``g``: True when done; False (``dx`` to be
    rewritten) when the sum is not finite or an output is ``-inf`` (the sum must leave its
    ``g`` out). A separate look for ``-inf`` outputs before the sum read ``y`` twice: 1.2-1.3x
    aten's backward on 8 x 50257, whose rows stream from L3."""
    s = _row_sum(y, g, _G)
    if not np.isfinite(s):
        return False
    wide_vectors()
    neg_inf = cast_like(-np.inf, scale)
    hidden = False
    for i in range(y.shape[0]):   # one vectorised OR of the comparisons alongside
        dx[i] = scale * (g[i] - exp_nonpositive_fast(y[i]) * s)
        hidden = hidden | (y[i] == neg_inf)
    return not hidden


@njit(fastmath=_FAST, cache=True, error_model="numpy", inline="always")
def _backward_row(yr, gr, dr, scale, mode):
    """One row of :func:`backward_rows` (not flagged special)."""
    wide_vectors()
    if mode == PROBS:
        c = _row_sum(yr, gr, _YG)
        if not np.isfinite(c):
            # a NaN row, or a NaN or infinite gradient: at entries of weight 0 it is dropped, as
            # the reference drops it, and those entries keep the reference's 0 (not 0 * inf)
            c = _row_sum(yr, gr, _YG_SUPPORT)
        zero = cast_like(0.0, scale)
        for i in range(yr.shape[0]):   # (a select, not 0 * (g - c): a huge finite g_i - c overflows)
            dr[i] = scale * yr[i] * (gr[i] - c) if yr[i] != zero else zero
    else:
        if _log_backward_without_hidden(yr, gr, dr, scale):
            return
        c = _row_sum(yr, gr, _G_VISIBLE)
        if not np.isfinite(c):
            _log_backward_non_finite_sum(yr, gr, dr, scale, c)
            return
        neg_inf = cast_like(-np.inf, scale)
        for i in range(yr.shape[0]):   # y <= 0 (to rounding)
            v = scale * (gr[i] - exp_nonpositive_fast(yr[i]) * c)
            dr[i] = v if yr[i] != neg_inf else cast_like(0.0, scale)


@njit(cache=True, error_model="numpy")
def _log_backward_non_finite_sum(y, g, dx, scale, c):
    """A log-softmax row's ``dx = scale (g - e^y c)`` where ``c``, the sum of its incoming
    gradient, is infinite or NaN. ``e^y`` is libm's, which keeps a subnormal probability (the
    fast one flushes it, and ``0 * inf`` is NaN where the reference has ``-inf``). The
    reference's ``e^y c`` is ``e^{x - max} / d * c``: where ``e^y`` rounds to 0 but
    ``e^{x - max}`` does not (a subnormal within a factor ``d`` of the smallest), it is ``c``
    itself; ``x - max`` is ``y`` less the row's largest ``y`` (``-log d``), to rounding."""
    neg_inf = cast_like(-np.inf, scale)
    top = neg_inf
    for i in range(y.shape[0]):
        if y[i] > top:
            top = y[i]
    for i in range(y.shape[0]):
        if y[i] == neg_inf:
            dx[i] = cast_like(0.0, scale)
            continue
        e = np.exp(y[i])
        if e == 0 and np.exp(y[i] - top) != 0:
            dx[i] = scale * (g[i] - c)
        else:
            dx[i] = scale * (g[i] - e * c)


@parallel_njit(fastmath=_FAST, cache=True, error_model="numpy")
def backward_rows(y, g, dx, special, scale, mode):
    """Gradient of softmax (``mode`` PROBS) or log-softmax (LOG_PROBS) from its output ``y``.

    softmax: ``dx = scale * y (g - <y, g>)``; log-softmax: ``dx = scale * (g - e^y sum g)``
    over visible entries (``y > -inf``), 0 elsewhere. Rows flagged in ``special`` get 0. In a
    softmax row whose ``<y, g>`` is not finite, ``<y, g>`` is taken over ``y != 0`` (a NaN or
    infinite gradient at a probability 0 is dropped, as the reference drops it) and entries
    with ``y = 0`` get 0.
    """
    rows, n = y.shape
    for r in prange(rows):
        if n == 0:
            continue
        if special[r]:
            for i in range(n):
                dx[r, i] = cast_like(0.0, scale)
            continue
        _backward_row(y[r], g[r], dx[r], scale, mode)


@parallel_njit(fastmath=_FAST, cache=True, error_model="numpy")
def backward_rows_at(y_address, g_address, dx_address, rows, n, scale, mode):
    """:func:`backward_rows` with no special row, on C-contiguous ``(rows, n)`` tensors given
    by their addresses (``n >= 1``): the lanes' backward, without the ~10 us of converting
    and unboxing four arrays per call."""
    y = carray(pointer_to(y_address, scale), (rows, n))
    g = carray(pointer_to(g_address, scale), (rows, n))
    dx = carray(pointer_to(dx_address, scale), (rows, n))
    for r in prange(rows):
        _backward_row(y[r], g[r], dx[r], scale, mode)


#: :func:`backward_rows_at` without the parallel launch, for a single row.
backward_rows_at_serial = serial_twin(backward_rows_at)
