r"""numba row kernels for the one-pass families of fused attention, generic over the pieces.

The CPU fused attention (:mod:`softmaxkit.attention.fused`) computes each score tile with a
torch GEMM; these kernels then do all of the normalizer's elementwise work on the tile in
one call, row by row, so that each row (a few thousand floats) stays in L1 while it is
read, reduced and rewritten, instead of one pass over the whole tile per torch operation.
They are parallel over rows (``prange``) and take the normalizer's scalar pieces as
arguments: numba compiles one specialisation per piece set and inlines the pieces, so
there is one kernel per family, never one per normalizer.

Arguments shared by every kernel (``R`` rows of ``C`` keys; float32 or float64):

* ``s``: the score tile ``(R, C)``, overwritten with the attention weights, 0 at hidden
  entries: forward, before the division by the row's normaliser, which the kernels write
  to ``den`` (``(R,)``: ``sum e^{g - m}``, ``sum h + eps``, or 1 for an empty row), so that
  the caller divides ``P v`` (``R x D``) instead of ``P``; backward, ``p`` itself;
* ``lim``: ``(R,)`` int64, entries ``j >= lim[r]`` are hidden (the causal triangle);
* ``hidden``: ``(R, C)`` bool, True = hidden, or an array with 0 rows when nothing else
  is hidden;
* ``cnt``: ``(R,)`` the ``n`` the pieces see (visible keys, at least 1, or the parameter);
* ``par``: ``(heads, P)`` each head's packed parameters (same dtype as ``s``); row ``r``
  belongs to head ``r // rows_per_head``;
* ``check_nan``: whether a score may be NaN. The kernels run with ``nnan`` (so that LLVM
  vectorises the max reductions), under which a NaN score could come out as a number or an
  empty row; with ``check_nan`` each row's raw scores are tested on their bits first, and a
  row holding a NaN is written as the reference has it (NaN at every visible entry of a
  normalised row; NaN at the entry itself for ``elementwise``). The caller passes False when
  the scores cannot be NaN (finite q and k whose products cannot overflow, no NaN in the
  mask), which saves that pass (8-14% of a row kernel's time);
* ``row_of(n, par)``: what the pieces receive as their second argument, computed once per
  row (``n`` itself, or e.g. ``s log n``, so that no logarithm runs per score);
* the pieces: ``fn(x, a, par)``, ``dfn(x, a, par)`` (njit functions of one score, ``a`` =
  ``row_of(n, par)``).

The backward kernels recompute ``p`` into ``s`` (for ``dv = p^T dO``) and overwrite ``dp``
(``dO v^T``) with ``dS``, the gradient at the scores, by the closed forms of
:mod:`softmaxkit.attention.fused` (``dd`` = ``rowsum(dO * O)``): ``softmax_of``
``dg * p * (dp - dd)``; ``sum_normalized`` ``dh * (dp - dd) / (sum h + eps)``;
``elementwise`` ``dh * dp``. With ``apply_d=False`` they leave out the factor ``dg``/``dh``
(the gradient at ``g``/``h``, which the caller needs for parameter gradients).

``softmax_of`` with a ``weight`` piece ``w(x) = e^{g(x)}`` that cannot overflow (StableMax's
rational map) skips the maximum and the exponential: ``p = w / sum w``.

Extras (:mod:`.pieces`), for normalizers that stream through their own rule: ``softmax_of``
takes a ``sink`` logit per row (``-inf``: none) that joins the maximum and the denominator;
:func:`factor_forward` / :func:`factor_backward` multiply the softmax weights by a factor
``w(x)`` (``dS = q (dg (w dp - dd) + dw dp)``, ``q`` the softmax weights);
:func:`signed_forward` / :func:`signed_backward` are the signed ``sum_normalized`` variant
with the row shift ``c = max(m, 0)``, ``p = relu(h) / (sum |h| + eps e^{m - c})``.

A row with nothing visible gives ``p = 0`` and ``dS = 0``.

The family kernels are not cached on disk (``cache=False``): numba keys a specialisation on
its function arguments by their identity in the process, so a cached entry is never found
again and every process would append a new one. Each process compiles a family kernel once
per piece set and dtype (about a second; the pieces themselves are cached), before any timing.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._exp import exp_nonpositive_fast
from ._intrinsics import cast_like, fmax, is_nan, wide_vectors
from .parallel import parallel_njit

#: nnan lets LLVM vectorise the max reductions; a NaN score still makes its row NaN through
#: the sum of exponentials.
_FAST = {"nsz", "contract", "arcp", "reassoc", "nnan"}


@njit(cache=True, error_model="numpy", inline="always")
def _zero_tail(row, start):
    for j in range(start, row.shape[0]):
        row[j] = 0.0


@njit(cache=False, error_model="numpy", inline="always")
def _hidden_row(hidden, r, masked, none):
    """Row ``r`` of the hidden mask, or ``none`` (all False, as long as a row) when nothing is
    hidden. Reading it unconditionally (``zero if hid[j] else f``) keeps the loop one that LLVM
    vectorises without masked byte loads, which AVX2 lacks: behind ``if masked`` the sigmoid row
    kernel ran scalar there (4.5 ns a score against 1.3)."""
    return hidden[r] if masked else none


@njit(cache=False, error_model="numpy", inline="always")
def _has_nan(row, hidden, r, masked):
    """Whether a visible raw score of ``row`` is NaN (read before the row is overwritten)."""
    found = 0
    if masked:
        for j in range(row.shape[0]):
            found |= 1 if is_nan(row[j]) and not hidden[r, j] else 0
    else:
        for j in range(row.shape[0]):
            found |= 1 if is_nan(row[j]) else 0
    return found != 0


@njit(cache=False, error_model="numpy", inline="always")
def _nan_row(full, end, hidden, r, masked):
    """A row of a normalised family with a NaN score, as the reference has it: its normaliser is
    NaN, so every visible weight (and gradient) is NaN; hidden entries and the tail 0."""
    nan = cast_like(np.nan, full[0])
    zero = cast_like(0.0, full[0])
    for j in range(end):
        full[j] = zero if masked and hidden[r, j] else nan
    _zero_tail(full, end)


@njit(cache=False, error_model="numpy", inline="always")
def _g_held(g, x, n, hp, lowest):
    """``g(x)`` within ``[lowest, -lowest]`` (``lowest = -finfo.max``), held at ``lowest`` where
    ``g`` overflows a score that is not ``-inf`` (SSMax's ``s log n`` or MultiMax's slope above 1
    on a ``finfo.min`` mask fill):
    such a row, all of whose visible scores overflowed, gets equal weights on them, as the
    dense path has it, instead of reading as a row with nothing visible. In any other row the
    held entries still get weight 0, and so a zero gradient. In a row whose every visible entry
    was held, ``softmax_of_backward`` gives the dense path's ``g'(x) p (dp - D)`` where ``g'``
    and it are finite, and 0 elsewhere (``g'`` reaches ``inf`` at MultiMax's quadratic terms
    there, which made the gradient NaN); the other backward kernels give held entries 0."""
    return _g_and_held(g, x, n, hp, lowest)[0]


@njit(cache=False, error_model="numpy", inline="always")
def _g_and_held(g, x, n, hp, lowest):
    """``(`` :func:`_g_held` ``, whether it held g(x))``: the backward kernels zero a held
    entry's derivative."""
    z = g(x, n, hp)
    held = x >= lowest and not z >= lowest
    # g overflowing up (MultiMax's t3 > 0 on a finfo.min fill) is held at finfo.max, not flagged:
    # such entries share the row's weight, as softmax gives a row's +inf entries, and keep g'
    return (lowest if held else (-lowest if z > -lowest else z)), held


# ---- softmax_of ------------------------------------------------------------------------

@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def softmax_of_forward(s, den, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, g, sink):
    masked = hidden.shape[0] > 0
    ninf = cast_like(-np.inf, s[0, 0])
    lowest = -np.finfo(s.dtype).max
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            den[r] = 1.0
            continue
        extra = sink(n, hp)
        m = extra
        if masked:
            hid = hidden[r, :end]
            for j in range(row.shape[0]):
                z = _g_held(g, row[j], n, hp, lowest)
                z = ninf if hid[j] else z
                row[j] = z
                m = fmax(m, z)
        else:
            for j in range(row.shape[0]):
                z = _g_held(g, row[j], n, hp, lowest)
                row[j] = z
                m = fmax(m, z)
        if m == ninf:
            _zero_tail(full, 0)
            den[r] = 1.0
            continue
        total = exp_nonpositive_fast(extra - m) if extra > ninf else cast_like(0.0, m)
        for j in range(row.shape[0]):
            e = exp_nonpositive_fast(row[j] - m)
            row[j] = e
            total += e
        den[r] = total
        _zero_tail(full, end)


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def softmax_of_backward(s, dp, dd, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, g, dg, sink, apply_d):
    """``dS = g'(x) p (dp - D)`` with ``D = sum_j p_j dp_j`` formed from the row itself, not
    from ``dd = rowsum(dO * O)`` (unused here): the two differ by the rounding of ``O`` and of
    the two GEMMs, and ``g'`` multiplies that difference. Where ``g'`` is large (MultiMax's
    quadratic terms at scores of 1e4: ``g' ~ 4e4``; a small temperature) a row whose mass sits
    on one key got float32 gradients of 4-600 where the exact ones are 0. Entries of weight
    exactly 0 (among them those whose ``g`` was held) get ``dS = 0``; a row whose every visible
    ``g`` was held keeps ``g'(x) p (dp - D)`` where it is finite (see :func:`_g_held`). A row with
    a visible ``+inf`` score has the limit's weights (equal on its ``+inf`` entries), which do not
    move with the scores: ``dS = 0`` there, as the dense path has it."""
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    ninf = cast_like(-np.inf, s[0, 0])
    zero = cast_like(0.0, s[0, 0])
    lowest = -np.finfo(s.dtype).max
    biggest = -lowest
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        drow = dp[r, :end]
        dfull = dp[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            _nan_row(dfull, end, hidden, r, masked)
            continue
        raw = row.copy()   # g'(x) is taken at the raw scores after the row holds the weights
        extra = sink(n, hp)
        m = extra
        free = 0   # visible entries whose g was not held
        for j in range(row.shape[0]):
            z, held = _g_and_held(g, row[j], n, hp, lowest)
            free += 0 if held or hid[j] else 1
            z = ninf if hid[j] else z
            row[j] = z
            m = fmax(m, z)
        if m == ninf:
            _zero_tail(full, 0)
            _zero_tail(dfull, 0)
            continue
        # a visible +inf score (g holds it at finfo.max): the row's weights are their limit, constant
        # in the scores
        infinite = _count_infinite(raw, hid) if m >= biggest else 0
        total = exp_nonpositive_fast(extra - m) if extra > ninf else cast_like(0.0, m)
        weighted = zero
        for j in range(row.shape[0]):
            e = exp_nonpositive_fast(row[j] - m)
            row[j] = e
            total += e
            weighted += e * drow[j]
        inv = cast_like(1.0, m) / total
        d0 = weighted * inv
        # a row whose every visible g was held (a row of finfo.min fills under s log n > 1) has
        # equal weights, and g'(x) p (dp - D) as the dense path's gradient where g' and that
        # product are finite; 0 elsewhere (MultiMax's quadratic g' overflows at the fill)
        all_held = free == 0 and extra == ninf
        if infinite != 0:
            for j in range(row.shape[0]):
                row[j] = row[j] * inv
                drow[j] = zero
        elif all_held:   # (rare: its checks in a loop of their own, so that the common one vectorises)
            for j in range(row.shape[0]):
                p = row[j] * inv
                row[j] = p
                slope = dg(raw[j], n, hp)
                before = p * (drow[j] - d0)
                d = slope * before
                finite = abs(slope) <= biggest and abs(d) <= biggest
                # without apply_d the caller multiplies by g' (a learnable parameter's path)
                kept = d if apply_d else before
                drow[j] = kept if p != zero and finite else zero
        else:
            for j in range(row.shape[0]):
                p = row[j] * inv
                row[j] = p
                d = p * (drow[j] - d0)
                if apply_d:
                    d = dg(raw[j], n, hp) * d
                drow[j] = d if p != zero else zero
        _zero_tail(full, end)
        _zero_tail(dfull, end)


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def factor_forward(s, den, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, g, sink, w):
    """``softmax_of`` times a factor: ``p = w(x) e^{g(x) - m} / (sum e^{g - m} (+ e^{sink - m}))``,
    written whole (``den`` = 1)."""
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    ninf = cast_like(-np.inf, s[0, 0])
    zero = cast_like(0.0, s[0, 0])
    lowest = -np.finfo(s.dtype).max
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            den[r] = 1.0
            continue
        extra = sink(n, hp)
        m = _max_of(row, hidden, r, masked, g, n, hp, extra, lowest)
        if m == ninf:
            _zero_tail(full, 0)
            den[r] = 1.0
            continue
        total = exp_nonpositive_fast(extra - m) if extra > ninf else zero
        for j in range(row.shape[0]):
            x = row[j]
            e = exp_nonpositive_fast(_g_held(g, x, n, hp, lowest) - m)
            e = zero if hid[j] else e
            row[j] = zero if e == zero else w(x, n, hp) * e
            total += e
        # normalised here, not by the caller after the value GEMM: w e summed against the values
        # overflows where the output does not (SA-Softmax's w(x) = x on a row of finfo.min fills:
        # the sum of n fills times v, then / n)
        inv = cast_like(1.0, m) / total
        for j in range(row.shape[0]):
            row[j] = row[j] * inv
        den[r] = 1.0
        _zero_tail(full, end)


#: The factor backward forms ``q (g' (w dp - D) + w' dp)`` as written: ``D`` sums the rounded
#: products ``w dp``, and an FMA ``fma(w, dp, -D)`` (contraction) or ``(w dp + dp) - D``
#: (reassociation) leaves the product's rounding where the exact difference is 0 (one-hot rows
#: of SA-Softmax at scores of 1e2-1e3: q and k gradients 500x the dense float32 error). Its
#: sums run in :func:`_factor_sums`, with the usual flags.
_FAST_UNFUSED = _FAST - {"contract", "reassoc"}


@njit(fastmath=_FAST, cache=False, error_model="numpy", inline="never")
def _factor_sums(row, raw, drow, hid, g, w, n, hp, m, total, lowest, shrink):
    """Writes ``e = e^{g(x) - m}`` (0 where hidden) over ``row``; returns ``(total + sum e,
    sum e w(x) shrink dp, max |w(x)|)`` (``raw``: the scores; ``shrink``: a power of two, see
    :func:`_factor_unit`; the maximum over the entries with a weight)."""
    zero = cast_like(0.0, m)
    weighted = zero
    top = zero
    for j in range(row.shape[0]):
        e = exp_nonpositive_fast(_g_held(g, raw[j], n, hp, lowest) - m)
        e = zero if hid[j] else e
        total += e
        row[j] = e
        wx = w(raw[j], n, hp)
        top = fmax(top, abs(wx) if e != zero else zero)
        weighted += e * (wx * shrink) * drow[j] if e != zero else zero
    return total, weighted, top


@njit(cache=False, error_model="numpy", inline="always")
def _factor_unit(top, lowest):
    """A power of two ``u``: ``2^-B`` times the largest ``|w(x)|`` of a row, ``top``, with ``B`` a
    quarter of the dtype's exponent range, and at least 1. The backward sums ``w / u``, which
    neither overflows nor leaves the normal range, and multiplies the result by ``u``
    (SA-Softmax's ``w(x) = x`` on a row of finfo.min fills: ``sum e w dp`` overflowed to
    ``inf - inf``, NaN, where the gradient itself is finite), as the dense reference scales
    its gradient per row."""
    quarter = math.frexp(lowest)[1] // 4
    if not top <= -lowest:   # (an infinite factor: the +inf limit, which takes no gradient)
        return cast_like(1.0, lowest)
    return cast_like(math.ldexp(1.0, max(math.frexp(float(top))[1] - quarter, 0)), lowest)


@parallel_njit(fastmath=_FAST_UNFUSED, cache=False, error_model="numpy")
def factor_backward(s, dp, dd, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, g, dg, sink, w, dw):
    """``dS = q (dg (w dp - D) + dw dp)``, ``q = e^{g - m} / sum``, ``p = w q``, with
    ``D = sum_j q_j w_j dp_j`` formed from the row, not from ``dd = rowsum(dO * O)`` (unused
    here), as in :func:`softmax_of_backward`: ``w dp - D`` cancels where ``w`` is large
    (SA-Softmax's ``w(x) = x`` at scores of 1e2-1e3: q and k gradients 1000x the dense float32
    error with the rounded ``O``)."""
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    ninf = cast_like(-np.inf, s[0, 0])
    zero = cast_like(0.0, s[0, 0])
    lowest = -np.finfo(s.dtype).max
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        drow = dp[r, :end]
        dfull = dp[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            _nan_row(dfull, end, hidden, r, masked)
            continue
        extra = sink(n, hp)
        m = _max_of(row, hidden, r, masked, g, n, hp, extra, lowest)
        if m == ninf:
            _zero_tail(full, 0)
            _zero_tail(dfull, 0)
            continue
        raw = row.copy()   # the row then holds e^{g - m}; w, g' and w' are taken at the raw scores
        total = exp_nonpositive_fast(extra - m) if extra > ninf else zero
        one = cast_like(1.0, m)
        summed, weighted, top = _factor_sums(row, raw, drow, hid, g, w, n, hp, m, total, lowest, one)
        unit = _factor_unit(top, lowest)
        if unit != one:   # w e dp may overflow: the sums again, of w / unit
            summed, weighted, top = _factor_sums(row, raw, drow, hid, g, w, n, hp, m, total, lowest, one / unit)
        total = summed
        shrink = one / unit
        inv = one / total
        d0 = weighted * inv
        # selects only (every value computed, then chosen): the if/else per entry kept this loop
        # scalar (SA-Softmax's backward row kernel 5x its forward)
        for j in range(row.shape[0]):
            q = row[j] * inv
            x = raw[j]
            wx = w(x, n, hp)
            d = drow[j]
            held = _g_and_held(g, x, n, hp, lowest)[1]
            ds = q * (dg(x, n, hp) * ((wx * shrink) * d - d0) + (dw(x, n, hp) * shrink) * d) * unit
            ds = zero if held else ds
            row[j] = wx * q if q != zero else zero
            drow[j] = ds if q != zero else zero
        _zero_tail(full, end)
        _zero_tail(dfull, end)


@njit(cache=False, error_model="numpy", inline="always")
def _max_of(row, hidden, r, masked, g, n, hp, start, lowest):
    """The largest ``g(x)`` (:func:`_g_held`) over the visible entries of ``row`` and ``start``."""
    m = start
    ninf = cast_like(-np.inf, start)
    if masked:
        for j in range(row.shape[0]):
            z = _g_held(g, row[j], n, hp, lowest)
            m = fmax(m, ninf if hidden[r, j] else z)
    else:
        for j in range(row.shape[0]):
            m = fmax(m, _g_held(g, row[j], n, hp, lowest))
    return m


@njit(cache=False, error_model="numpy", inline="always")
def _piece_sums(row, drow, hid, fn, n, hp):
    """``sum f`` and ``sum f dp`` over the visible entries of ``row``, ``f = fn(x)``: the first
    pass of the backward kernels that form ``dp - dd`` from the row."""
    zero = cast_like(0.0, n)
    total = zero
    weighted = zero
    for j in range(row.shape[0]):
        f = fn(row[j], n, hp)
        f = zero if hid[j] else f
        total += f
        weighted += f * drow[j]
    return total, weighted


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def weighted_backward(s, dp, dd, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, w, dg, apply_d):
    """``dS = dg p (dp - dd)``, ``p = w / W``, with ``dp - dd`` formed from the row as
    ``(dp W - sum_i w_i dp_i) / W`` (see :func:`sum_normalized_backward`; ``dd`` is unused)."""
    masked = hidden.shape[0] > 0
    biggest = np.finfo(s.dtype).max
    large = np.sqrt(biggest)
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        drow = dp[r, :end]
        dfull = dp[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            _nan_row(dfull, end, hidden, r, masked)
            continue
        zero = cast_like(0.0, n)
        total, weighted = _piece_sums(row, drow, hid, w, n, hp)
        if total > biggest and _infinite_limit(row, hid, False, w, n, hp, biggest):
            _zero_tail(full, end)
            _zero_tail(dfull, 0)   # the limit does not move with the scores
            continue
        inv = cast_like(1.0, n) / total if total > 0 else zero
        scaled = total > large
        mean = _weighted_mean(row, drow, hid, w, n, hp, inv) if scaled else zero
        for j in range(row.shape[0]):
            x = row[j]
            e = w(x, n, hp)
            e = zero if hid[j] else e
            p = e * inv
            d = drow[j] - mean if scaled else (drow[j] * total - weighted) * inv
            if apply_d:
                d = dg(x, n, hp) * d
            row[j] = p
            drow[j] = d * p
        _zero_tail(full, end)
        _zero_tail(dfull, end)


@njit(fastmath=_FAST - {"reassoc"}, cache=False, error_model="numpy", inline="never")
def _weighted_mean(row, drow, hid, fn, n, hp, inv):
    """``sum_j fn(x_j) inv dp_j`` over visible entries: ``sum p dp`` formed after the division, for
    rows whose sum passes the square root of the range (a mask bonus of 1e38 under relu_l1 or
    stablemax), where ``dp S`` and ``sum fn dp`` overflow. (Not reassociated: ``inv`` taken out of
    the sum is that overflow again. A rare row: a scalar loop.)"""
    zero = cast_like(0.0, inv)
    mean = zero
    for j in range(row.shape[0]):
        p = fn(row[j], n, hp) * inv
        mean += zero if hid[j] else p * drow[j]
    return mean


@njit(cache=False, error_model="numpy")
def _count_infinite(row, hid):
    """How many visible entries of ``row`` are ``+inf`` (called off the kernels' hot loops)."""
    count = 0
    for j in range(row.shape[0]):
        count += 1 if row[j] == np.inf and not hid[j] else 0
    return count


@njit(cache=False, error_model="numpy")
def _infinite_limit(row, hid, values, fn, n, hp, biggest):
    """The limit weights of a row with visible infinite terms (``fn(x) = +inf`` of the raw scores
    in ``row``; with ``values``, ``row`` holds the terms themselves): equal on those entries, 0
    elsewhere, written over ``row``, as the dense path has it. Returns how many there are (0:
    none, ``row`` untouched: a sum that overflowed on finite terms keeps the formula)."""
    count = 0
    for j in range(row.shape[0]):
        f = row[j] if values else fn(row[j], n, hp)
        count += 1 if f > biggest and not hid[j] else 0
    if count == 0:
        return 0
    share = cast_like(1.0, row[0]) / count
    zero = cast_like(0.0, row[0])
    for j in range(row.shape[0]):
        f = row[j] if values else fn(row[j], n, hp)
        row[j] = share if f > biggest and not hid[j] else zero
    return count


# ---- sum_normalized --------------------------------------------------------------------

@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def sum_normalized_forward(s, den, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, h, eps):
    """``p = h(x) / (sum h + eps)``: ``h`` over ``s`` and the divisor in ``den``, or (a row whose
    sum passes the square root of the range) ``p`` itself over ``s`` and ``den`` = 1."""
    masked = hidden.shape[0] > 0
    biggest = np.finfo(s.dtype).max
    large = np.sqrt(biggest)
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            den[r] = 1.0
            continue
        zero = cast_like(0.0, n)
        total = zero
        for j in range(row.shape[0]):
            f = h(row[j], n, hp)
            f = zero if hid[j] else f
            row[j] = f
            total += f
        d = total + eps
        den[r] = d if d != 0 else cast_like(1.0, n)
        if total > biggest and _infinite_limit(row, hid, True, h, n, hp, biggest):
            den[r] = cast_like(1.0, n)
        elif total > large:
            # normalised here: the value GEMM would sum h v past the range where h / den v does not
            # (a mask bonus of 1e38 under relu_l1)
            inv = cast_like(1.0, n) / d
            for j in range(row.shape[0]):
                row[j] = row[j] * inv
            den[r] = cast_like(1.0, n)
        _zero_tail(full, end)


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def sum_normalized_backward(s, dp, dd, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, h, dh, eps, apply_d):
    """``dS = dh (dp - dd) / den`` with ``dp - dd`` formed as ``(dp (S + eps) - sum_i h_i dp_i) / den``
    from the row itself (``S = sum h``, ``den = S + eps``), not from ``dd = rowsum(dO * O)``: in a
    row whose mass sits on few keys ``dp_j - dd`` is a difference of nearly equal numbers, and
    ``O``'s rounding alone left float32 gradients 5-20x less accurate than the dense path's
    (``dd`` is unused here)."""
    masked = hidden.shape[0] > 0
    biggest = np.finfo(s.dtype).max
    large = np.sqrt(biggest)
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        drow = dp[r, :end]
        dfull = dp[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            _nan_row(dfull, end, hidden, r, masked)
            continue
        zero = cast_like(0.0, n)
        total, weighted = _piece_sums(row, drow, hid, h, n, hp)
        if total > biggest and _infinite_limit(row, hid, False, h, n, hp, biggest):
            _zero_tail(full, end)
            _zero_tail(dfull, 0)   # the limit does not move with the scores
            continue
        den = total + eps
        inv = cast_like(1.0, n) / den if den != 0 else cast_like(1.0, n)
        scaled = total > large
        mean = _weighted_mean(row, drow, hid, h, n, hp, inv) if scaled else zero
        for j in range(row.shape[0]):
            x = row[j]
            f = h(x, n, hp)
            g = drow[j]
            d = (g - mean) * inv if scaled else (g * eps + (g * total - weighted)) * inv * inv
            if apply_d:
                d = dh(x, n, hp) * d
            f = zero if hid[j] else f
            d = zero if hid[j] else d
            row[j] = f * inv
            drow[j] = d
        _zero_tail(full, end)
        _zero_tail(dfull, end)


@njit(cache=False, error_model="numpy", inline="always")
def _identity_map(x, n, hp):
    return x


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def signed_forward(s, den, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, h, eps):
    """Signed ``sum_normalized`` with the row shift ``c = max(m, 0)`` (``m`` the row maximum):
    ``p = relu(h(x; c)) / (sum |h(x; c)| + eps e^{m - c})``."""
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    ninf = cast_like(-np.inf, s[0, 0])
    zero = cast_like(0.0, s[0, 0])
    lowest = -np.finfo(s.dtype).max
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            den[r] = 1.0
            continue
        m = _max_of(row, hidden, r, masked, _identity_map, n, hp, ninf, lowest)
        if m == ninf:
            _zero_tail(full, 0)
            den[r] = 1.0
            continue
        # (m is held at finfo.max): a visible +inf score makes the row its limit
        if m >= -lowest and _infinite_limit(row, hid, True, _identity_map, n, hp, -lowest):
            den[r] = 1.0
            _zero_tail(full, end)
            continue
        c = fmax(m, zero)
        total = eps * exp_nonpositive_fast(m - c)
        for j in range(row.shape[0]):
            a = h(row[j], c, n, hp)
            a = zero if hid[j] else a
            row[j] = fmax(a, zero)
            total += abs(a)
        den[r] = total if total != zero else cast_like(1.0, m)
        _zero_tail(full, end)


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def signed_backward(s, dp, dd, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, h, dh, eps):
    """``dS = dh ([h > 0] dp - sign(h) dd) / den``, and at the row maximum (shared between ties, as
    ``torch.amax`` does) ``- eps e^{m - c} dd / den``."""
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    ninf = cast_like(-np.inf, s[0, 0])
    zero = cast_like(0.0, s[0, 0])
    lowest = -np.finfo(s.dtype).max
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        drow = dp[r, :end]
        dfull = dp[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        if check_nan and _has_nan(row, hidden, r, masked):
            _nan_row(full, end, hidden, r, masked)
            _nan_row(dfull, end, hidden, r, masked)
            continue
        d0 = dd[r]
        m = _max_of(row, hidden, r, masked, _identity_map, n, hp, ninf, lowest)
        if m == ninf:
            _zero_tail(full, 0)
            _zero_tail(dfull, 0)
            continue
        # (m is held at finfo.max): a visible +inf score makes the row its limit, constant in the scores
        if m >= -lowest and _infinite_limit(row, hid, True, _identity_map, n, hp, -lowest):
            _zero_tail(full, end)
            _zero_tail(dfull, 0)
            continue
        ties = zero
        one = cast_like(1.0, m)
        if masked:
            for j in range(row.shape[0]):
                ties += zero if hidden[r, j] else (one if row[j] == m else zero)
        else:
            for j in range(row.shape[0]):
                ties += one if row[j] == m else zero
        c = fmax(m, zero)
        top = eps * exp_nonpositive_fast(m - c)
        share = top * d0 / ties
        total = top
        for j in range(row.shape[0]):
            x = row[j]
            a = h(x, c, n, hp)
            d = drow[j]
            g = (d - d0) if a > zero else (d0 if a < zero else zero)
            g = dh(x, c, n, hp) * g
            g = (g - share) if x == m else g
            a = zero if hid[j] else a
            g = zero if hid[j] else g
            row[j] = fmax(a, zero)
            drow[j] = g
            total += abs(a)
        inv = cast_like(1.0, m) / total if total != zero else cast_like(1.0, m)
        for j in range(row.shape[0]):
            row[j] *= inv
            drow[j] *= inv
        _zero_tail(full, end)
        _zero_tail(dfull, end)


# ---- elementwise -----------------------------------------------------------------------

@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def elementwise_forward(s, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, h):
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        zero = cast_like(0.0, n)
        for j in range(row.shape[0]):
            x = row[j]
            f = h(x, n, hp)
            if check_nan and is_nan(x):   # (the kernel's nnan would let h turn a NaN into a number)
                f = x
            f = zero if hid[j] else f
            row[j] = f
        _zero_tail(full, end)


@parallel_njit(fastmath=_FAST, cache=False, error_model="numpy")
def elementwise_backward(s, dp, lim, hidden, cnt, par, rows_per_head, check_nan, row_of, h, dh, apply_d):
    masked = hidden.shape[0] > 0
    none = np.zeros(s.shape[1], np.bool_)   # the hidden row when nothing is hidden (see _hidden_row)
    for r in prange(s.shape[0]):
        wide_vectors()
        end = lim[r]
        row = s[r, :end]
        full = s[r]
        hid = _hidden_row(hidden, r, masked, none)
        drow = dp[r, :end]
        dfull = dp[r]
        hp = par[r // rows_per_head]
        n = row_of(cnt[r], hp)
        zero = cast_like(0.0, n)
        for j in range(row.shape[0]):
            x = row[j]
            f = h(x, n, hp)
            d = drow[j]
            if apply_d:
                d = dh(x, n, hp) * d
            if check_nan and is_nan(x):
                f = x
                d = x
            f = zero if hid[j] else f
            d = zero if hid[j] else d
            row[j] = f
            drow[j] = d
        _zero_tail(full, end)
        _zero_tail(dfull, end)
