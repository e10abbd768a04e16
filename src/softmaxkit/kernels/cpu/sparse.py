r"""numba kernels for alpha-entmax (sparsemax at alpha = 2, 1.5-entmax at alpha = 1.5).

With ``u = alpha - 1 > 0`` and scores shifted so that the row maximum is 0
(``s = x - max x``), alpha-entmax (Peters, Niculae & Martins 2019, arXiv 1905.05702) is

.. math:: p_i = [u\,(s_i - \theta)]_+^{1/u}, \qquad
          f(\theta) = \sum_i [u\,(s_i - \theta)]_+^{1/u} - 1 = 0,

sparsemax (Martins & Astudillo 2016, arXiv 1602.02068) being ``u = 1``.

Threshold search, in two levels over a row's visible prefix (``x[:stop]``; entries past it
are hidden whatever they hold, ``-inf`` entries are hidden too):

1. One vectorised pass takes the maximum of each block of :data:`BLOCK` entries. ``f``
   only grows when entries are added, so the threshold of any subset of the row is a
   lower bound on the row's: the threshold of the block maxima is one, and a tight one
   (the support's entries are mostly block maxima). Measured on causal attention tiles
   (L = 4096, D = 64): it leaves ~4 candidates for sparsemax and ~20 for 1.5-entmax,
   against ~17 and ~160 above the classic bound ``max - 1/u``.
2. Only the blocks whose maximum exceeds that bound are read entry by entry; their entries
   above it are the candidates (float64, shifted by the row maximum), and the threshold is
   solved on them from the bound.

Solvers, each started from a lower bound and never stepping past the root, so the
candidate set always contains the support and shrinks as they go:

* sparsemax (``u = 1``): Michelot's (1986) iteration ``theta <- (sum_S v - 1) / |S|`` on
  ``S = {v > theta}`` (each iterate is the threshold of a subset); exact when ``S`` stops
  shrinking.
* 1.5-entmax (``u = 1/2``): Newton steps (``f`` is convex, so Newton from the left stays
  left). Each pass also gives the root of the quadratic ``f`` restricted to ``S`` from the
  moments ``sum w``, ``sum w^2``; once every entry of ``S`` lies above it, it is the exact
  threshold (recomputed by the stable two-pass closed form).
* other alpha: Newton safeguarded by bisection inside the bracket
  ``[lower, -count^{-u}/u]`` (the bisection covers ``alpha > 2``, where ``f`` is concave).

This is the approach of AdaSplash (Gonçalves, Treviso & Martins 2025, arXiv 2502.12082:
Halley/Newton steps safeguarded by bisection, per row) with a tight starting bound in the
spirit of AdaSplash-2's coarse histogram initialisation (arXiv 2604.15180), here the block
maxima, which cost nothing beyond the row's maximum. Expected linear time with one pass
over the row plus a few passes over tens of candidates, no sort and no full-row
iteration. :func:`entmax_attend` multiplies the support by ``v`` directly (a few rows of
``v`` per query instead of a GEMM over the tile); :func:`entmax_tile_grad` is the fused
attention's backward on a tile, given each row's threshold.

Backward (closed form, Peters et al. 2019, Prop. 1): ``g_i = p_i^{2-alpha}`` on the
support, ``dx = g * dy - g <g, dy> / sum g``. Gradient with respect to alpha
(Correia, Niculae & Martins 2019, arXiv 1909.00015), derived from
``p_i = [u (s_i - theta)]_+^{1/u}`` and ``sum_i dp_i/dalpha = 0``: with
``g^ = g / sum g`` and ``H = sum_j p_j log p_j``,

.. math:: \frac{\partial p_i}{\partial \alpha} = \frac{p_i - \hat g_i}{u^2}
          - \frac{p_i \log p_i - \hat g_i H}{u}.

The search runs in float64 for float32 inputs too. ``special`` protocol: the caller
fills it with 2 ("not computed"); a finished row sets 0, and a row the kernel does not
handle (a NaN or a ``+inf``, or no finite distribution found) sets 1. Rows left at 1 or
2 are recomputed by the reference (:func:`softmaxkit.kernels.dispatch.run`); they hold
zeros, never unwritten memory.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._intrinsics import cast_like
from .parallel import parallel_njit
from .softmax import _max

#: Newton/bisection steps allowed before the bracket is accepted as converged.
MAX_STEPS = 200
#: Entries per chunk: a chunk is scanned entry by entry only if its maximum can matter.
CHUNK = 64
#: Entries per block of the forward row solver: the block maxima give a lower bound on the
#: threshold, and only blocks whose maximum exceeds it are read entry by entry.
BLOCK = 32
#: Slack under the block-level bound (shifted units, where the threshold lies in [-1/u, 0]):
#: covers the solver's rounding and tolerance, costs no candidate in practice.
MARGIN = 1e-6
#: Row groups per thread in :func:`entmax_rows` (rows are dealt round-robin to the groups).
GROUPS_PER_THREAD = 8


@njit(cache=True, error_model="numpy")
def _power(w, u):
    """``w^{1/u}`` for ``w > 0``, with the two common cases exact and cheap."""
    if u == 1.0:
        return w
    if u == 0.5:
        return w * w
    return math.exp(math.log(w) / u)


@njit(cache=True, error_model="numpy")
def _evaluate(vals, count, theta, u):
    """``F = f(theta)``, ``D = -f'(theta)`` and the support size, over the candidates."""
    total = 0.0
    slope = 0.0
    size = 0
    for i in range(count):
        w = u * (vals[i] - theta)
        if w > 0:
            p = _power(w, u)
            total += p
            slope += p / w
            size += 1
    return total - 1.0, slope, size


@njit(cache=True, error_model="numpy")
def _closed_form(vals, count, theta, u):
    """Exact threshold for the support ``{s > theta}`` when alpha is 2 or 1.5; else ``theta``."""
    size = 0
    total = 0.0
    for i in range(count):
        if vals[i] > theta:
            size += 1
            total += vals[i]
    if size == 0:
        return theta
    if u == 1.0:
        return (total - 1.0) / size
    if u == 0.5:
        # sum (s/2 - tau)^2 = 1 on the support, tau = theta / 2
        mean = total / (2 * size)
        ss = 0.0
        for i in range(count):
            if vals[i] > theta:
                d = vals[i] / 2 - mean
                ss += d * d
        return 2.0 * (mean - math.sqrt(max(1.0 - ss, 0.0) / size))
    return theta


@njit(cache=True, error_model="numpy")
def _compact(vals, idx, count, lower):
    """Keep the candidates above ``lower``; returns the new count."""
    kept = 0
    for i in range(count):
        if vals[i] > lower:
            vals[kept] = vals[i]
            idx[kept] = idx[i]
            kept += 1
    return kept


@njit(cache=True, error_model="numpy")
def _threshold(vals, idx, count, u, lo):
    """Root ``theta`` of ``f`` over the candidates, from the lower bound ``lo``, by safeguarded
    Newton (any alpha); returns (theta, candidate count). ``-count^{-u} / u`` bounds the root
    from above (each of the ``count`` terms is at most ``1 / count`` there)."""
    hi = max(-math.exp(-u * math.log(max(count, 1))) / u, lo)
    theta = lo
    tol = 4e-16 * max(1.0, count)
    best, best_f = theta, math.inf
    prev_f = math.inf
    for _ in range(MAX_STEPS):
        F, D, size = _evaluate(vals, count, theta, u)
        if abs(F) < best_f:
            best, best_f = theta, abs(F)
        if F > 0:
            lo = theta
        else:
            hi = theta
        if abs(F) <= tol or size == 0:
            break
        count = _compact(vals, idx, count, lo)
        mid = 0.5 * (lo + hi)
        if not (lo < mid < hi):
            break   # the bracket is two adjacent floats
        step = theta + F / D
        # Newton inside the bracket, unless it failed to halve |f| (concave f for
        # alpha > 2, or a root next to a support entry, where f' is unbounded)
        if not (lo < step < hi) or step == theta or abs(F) > 0.5 * prev_f:
            step = mid
        prev_f = abs(F)
        theta = step
    return best, count


@njit(fastmath={"reassoc", "nsz"}, cache=True, error_model="numpy")
def _count_above(x, reach):
    """Entries above ``reach`` and NaN entries (vectorised counts)."""
    above = 0
    nans = 0
    for i in range(x.shape[0]):
        above += x[i] > reach
        nans += x[i] != x[i]
    return above, nans


@njit(cache=True, error_model="numpy")
def _gather_above(x, reach, top, vals, idx):
    """Copy ``x_i - top`` (float64) and ``i`` for the entries above ``reach``.

    Chunks whose maximum does not reach are skipped after a vectorised max.
    """
    n = x.shape[0]
    count = 0
    for c in range(0, n, CHUNK):
        stop = min(c + CHUNK, n)
        if _max(x[c:stop], reach) > reach:
            for i in range(c, stop):
                if x[i] > reach:
                    vals[count] = np.float64(x[i]) - np.float64(top)
                    idx[count] = i
                    count += 1
    return count


@njit(fastmath={"reassoc", "nsz"}, cache=True, error_model="numpy")
def _count_nan(x):
    """NaN entries of ``x`` (vectorised count)."""
    bad = 0
    for i in range(x.shape[0]):
        bad += x[i] != x[i]
    return bad


@njit(cache=True, error_model="numpy")
def _sparsemax_threshold(vals, idx, count, theta):
    """Michelot's (1986) iteration from a lower bound ``theta``: ``theta <- (sum_S v - 1) / |S|``
    over ``S = {v > theta}`` until ``S`` stops shrinking. Every iterate is a lower bound (the
    threshold of a subset), so ``S`` always contains the support and the last iterate is exact.
    Returns (theta, support size); the support is compacted to the front of ``vals`` / ``idx``."""
    first = True
    for _ in range(count + 2):
        kept = 0
        total = 0.0
        for i in range(count):
            v = vals[i]
            if v > theta:
                vals[kept] = v
                idx[kept] = idx[i]
                kept += 1
                total += v
        if kept == 0 or (kept == count and not first):
            return theta, kept
        first = False
        count = kept
        theta = (total - 1.0) / kept
    return theta, count


@njit(cache=True, error_model="numpy")
def _entmax15_threshold(vals, idx, count, theta):
    """1.5-entmax threshold from a lower bound ``theta``: Newton steps (``f`` is convex, so they
    stay below the root and ``S = {v > theta}`` keeps the support), each pass also giving the
    closed-form root of ``f`` restricted to ``S``; that root is exact as soon as every entry of
    ``S`` lies above it. Returns (theta, support size) like :func:`_sparsemax_threshold`."""
    for _ in range(MAX_STEPS):
        kept = 0
        s1 = 0.0
        s2 = 0.0
        low = math.inf
        for i in range(count):
            v = vals[i]
            if v > theta:
                vals[kept] = v
                idx[kept] = idx[i]
                kept += 1
                w = 0.5 * (v - theta)
                s1 += w
                s2 += w * w
                low = min(low, v)
        count = kept
        if kept == 0:
            return theta, 0
        excess = s2 - 1.0       # f(theta) = sum_S w^2 - 1, -f'(theta) = sum_S w
        if excess <= 0.0:
            break               # theta is the root to rounding
        disc = s1 * s1 - kept * excess
        if disc >= 0.0 and low > theta + 2.0 * (s1 - math.sqrt(disc)) / kept:
            return _closed_form(vals, count, theta, 0.5), count   # the same root, computed stably
        step = theta + excess / s1
        if not step > theta:
            break
        theta = step
    return theta, count


@njit(cache=True, error_model="numpy")
def _solve(vals, idx, count, u, lower):
    """The threshold of the candidates ``vals[:count]`` (shifted scores, maximum 0, all above
    the lower bound ``lower``) for ``u = alpha - 1``; returns (theta, candidates left)."""
    if u == 1.0:
        return _sparsemax_threshold(vals, idx, count, lower)
    if u == 0.5:
        return _entmax15_threshold(vals, idx, count, lower)
    return _threshold(vals, idx, count, u, lower)


@njit(cache=True, error_model="numpy")
def _support(x, u, stop, peaks, vals, idx):
    """Solve alpha-entmax on ``x[:stop]`` (entries past ``stop`` are hidden, as are ``-inf``).

    Returns ``(status, tau, count, top)``: status 0 with the weights of the support in
    ``vals[:count]`` at the positions ``idx[:count]``, the threshold ``tau`` relative to the
    row maximum ``top`` (``p = [u (x - top) - tau]_+^{1/u}``: relative, the threshold keeps its
    precision at huge scores such as a row of ``finfo.min`` mask fills); status 2 for a row
    with nothing visible (``tau = top = 0``); status 1 for a row left to the reference (a NaN
    or a ``+inf``, or no finite distribution found). ``peaks``, ``vals``, ``idx``: scratch of
    at least ``ceil(stop / BLOCK)``, ``stop``, ``stop`` entries. ``x`` is only read.
    """
    if stop <= 0:
        return 2, 0.0, 0, 0.0
    xs = x[:stop]
    if _count_nan(xs):
        return 1, 0.0, 0, 0.0
    neg_inf = cast_like(-np.inf, x[0])
    nb = (stop + BLOCK - 1) // BLOCK
    top = neg_inf
    for b in range(nb):
        m = _max(xs[b * BLOCK:min(stop, b * BLOCK + BLOCK)], neg_inf)
        peaks[b] = m
        if m > top:
            top = m
    if top == -neg_inf:
        return 1, 0.0, 0, 0.0
    if top == neg_inf:
        return 2, 0.0, 0, 0.0
    top64 = np.float64(top)
    # level 1: the block maxima are a subset of the row, and the threshold of a subset is a
    # lower bound on the row's (f only grows with more entries)
    count = 0
    for b in range(nb):
        v = peaks[b] - top64
        if v > -1.0 / u:
            vals[count] = v
            idx[count] = b
            count += 1
    theta, _ = _solve(vals, idx, count, u, -1.0 / u)
    lower = max(theta - MARGIN, -1.0 / u)
    # level 2: the entries above the bound, from the blocks that have any
    count = 0
    for b in range(nb):
        if peaks[b] - top64 > lower:
            for i in range(b * BLOCK, min(stop, b * BLOCK + BLOCK)):
                v = np.float64(xs[i]) - top64
                if v > lower:
                    vals[count] = v
                    idx[count] = i
                    count += 1
    theta, count = _solve(vals, idx, count, u, lower)
    total = 0.0
    for i in range(count):
        w = u * (vals[i] - theta)
        vals[i] = _power(w, u) if w > 0 else 0.0
        total += vals[i]
    if not (total > 0.5 and total < 2.0):
        return 1, 0.0, 0, 0.0
    if u != 1.0 and u != 0.5:   # closed forms are exact; elsewhere the tolerance of the solver
        for i in range(count):
            vals[i] /= total
    return 0, u * theta, count, top64


@parallel_njit(cache=True, error_model="numpy")
def entmax_rows(x, out, alpha, stop, tau, shift, special, groups):
    """alpha-entmax of each row of ``x`` (C-contiguous 2-d) into ``out`` (which may be ``x``:
    a row is written after it is solved; a row flagged in ``special`` is not written).

    ``alpha`` float64 and ``stop`` int64 (entries ``>= stop`` are hidden), one per row;
    ``tau`` and ``shift`` (float64) receive each row's threshold and maximum,
    ``p = [(alpha - 1) (x - shift) - tau]_+^{1/(alpha-1)}``.
    Rows are dealt round-robin to ``groups`` groups (causal rows differ in length; a few per
    thread balance them), each with its own scratch."""
    rows, n = x.shape
    groups = max(1, min(rows, groups))
    for g in prange(groups):
        peaks = np.empty((n + BLOCK - 1) // BLOCK + 1, np.float64)
        vals = np.empty(n + 1, np.float64)
        idx = np.empty(n + 1, np.int64)
        for r in range(g, rows, groups):
            status, t, count, top = _support(x[r], alpha[r] - 1.0, min(n, stop[r]), peaks, vals, idx)
            tau[r] = t
            shift[r] = top
            special[r] = 1 if status == 1 else 0
            if status != 1:
                o = out[r]
                o[:] = 0
                for i in range(count):
                    o[idx[i]] = vals[i]


@parallel_njit(cache=True, error_model="numpy")
def entmax_attend(x, v, rows_per_head, alpha, stop, out, tau, shift, special, groups):
    """``out = alpha-entmax(x) v`` row by row, from the support only (no weight matrix).

    ``x`` ``(rows, n)`` C-contiguous scores (``-inf`` hidden), row ``r`` belonging to head
    ``r // rows_per_head`` of ``v`` ``(heads, n, d)``; ``out`` ``(rows, d)``; ``alpha``, ``stop``,
    ``tau``, ``shift``, ``special`` as in :func:`entmax_rows` (a flagged row of ``out`` is not written).
    The products accumulate in float64."""
    rows, n = x.shape
    d = v.shape[2]
    groups = max(1, min(rows, groups))
    for g in prange(groups):
        peaks = np.empty((n + BLOCK - 1) // BLOCK + 1, np.float64)
        vals = np.empty(n + 1, np.float64)
        idx = np.empty(n + 1, np.int64)
        acc = np.empty(d, np.float64)
        for r in range(g, rows, groups):
            status, t, count, top = _support(x[r], alpha[r] - 1.0, min(n, stop[r]), peaks, vals, idx)
            tau[r] = t
            shift[r] = top
            special[r] = 1 if status == 1 else 0
            if status == 1:
                continue
            vh = v[r // rows_per_head]
            acc[:] = 0
            for i in range(count):
                p = vals[i]
                vj = vh[idx[i]]
                for e in range(d):
                    acc[e] += p * vj[e]
            o = out[r]
            for e in range(d):
                o[e] = acc[e]


@njit(fastmath={"reassoc", "nsz"}, cache=True, error_model="numpy")
def _grad_sums(z, dp, u, t):
    """``sum s`` and ``sum s dp`` over a row, ``s = w^{1/u - 1}`` on the support ``w = u z - t > 0``
    (a NaN in ``w`` makes both NaN), for sparsemax (``u = 1``) and 1.5-entmax (``u = 1/2``)."""
    zero = cast_like(0.0, z[0])
    s_sum = zero
    sd = zero
    if u == 1.0:
        for j in range(z.shape[0]):
            s = cast_like(1.0, z[0]) if not (u * z[j] - t <= zero) else zero
            s_sum += s
            sd += s * dp[j]
    elif u == 0.5:
        for j in range(z.shape[0]):
            w = u * z[j] - t
            s = w if not (w <= zero) else zero
            s_sum += s
            sd += s * dp[j]
    return s_sum, sd


@njit(fastmath={"reassoc", "nsz"}, cache=True, error_model="numpy")
def _grad_write(z, dp, u, t, mean):
    """``z <- p = w^{1/u}``, ``dp <- s (dp - mean)`` on the support, 0 elsewhere."""
    zero = cast_like(0.0, z[0])
    if u == 1.0:
        for j in range(z.shape[0]):
            w = u * z[j] - t
            on = not (w <= zero)
            z[j] = w if on else zero
            dp[j] = (dp[j] - mean) if on else zero
    elif u == 0.5:
        for j in range(z.shape[0]):
            w = u * z[j] - t
            w = w if not (w <= zero) else zero
            z[j] = w * w
            dp[j] = w * (dp[j] - mean)


@njit(cache=True, error_model="numpy")
def _power_grad(z, dp, u, t, c):
    """:func:`_grad_sums` and :func:`_grad_write` for any other alpha, with the support's
    ``w = u (z - c) - t`` formed in float64 as the forward forms it (float32 lost the small
    weights near the threshold: the gradient of v was 100x the dense path's at alpha = 5).
    Past alpha = 2 (``u > 1``) the weight ``s = w^{1/u - 1}`` of the smallest support entry
    may hold nearly all of ``sum s``, where its ``dp - mean`` cancels: that entry takes the
    leave-one-out form ``s_k sum_{j != k} s_j (dp_k - dp_j) / sum s``."""
    e = 1.0 / u - 1.0
    s_sum = 0.0
    sd = 0.0
    k = -1
    wk = 0.0
    for j in range(z.shape[0]):
        w = u * (np.float64(z[j]) - c) - t
        if not (w <= 0.0):
            s = math.exp(e * math.log(w))
            s_sum += s
            sd += s * np.float64(dp[j])
            if k < 0 or w < wk:
                k, wk = j, w
    mean = sd / s_sum if s_sum > 0 else 0.0
    grad_k = 0.0
    if u > 1.0 and k >= 0:
        dk = np.float64(dp[k])
        spread = 0.0
        for j in range(z.shape[0]):
            w = u * (np.float64(z[j]) - c) - t
            if w > 0.0 and j != k:
                spread += math.exp(e * math.log(w)) * (dk - np.float64(dp[j]))
        grad_k = math.exp(e * math.log(wk)) * spread / s_sum
    zero = cast_like(0.0, z[0])
    for j in range(z.shape[0]):
        w = u * (np.float64(z[j]) - c) - t
        if not (w <= 0.0):
            lw = math.log(w)
            z[j] = cast_like(math.exp(lw / u), zero)
            dp[j] = cast_like(math.exp(e * lw) * (np.float64(dp[j]) - mean), zero)
        else:
            z[j] = zero
            dp[j] = zero
    if u > 1.0 and k >= 0:
        dp[k] = cast_like(grad_k, zero)


@parallel_njit(cache=True, error_model="numpy")
def entmax_tile_grad(z, dp, alpha, tau, shift, stop, groups):
    """The closed-form backward of alpha-entmax rows given their thresholds, in place.

    Row ``r`` of ``z`` (scores, ``-inf`` hidden; entries ``>= stop[r]`` hidden whatever they
    hold) becomes ``p = [u (z - shift_r) - tau_r]_+^{1/u}`` and row ``r`` of ``dp`` (the incoming gradient
    of ``p``) becomes the gradient of the scores, ``s (dp - sum(s dp) / sum(s))`` with
    ``s = p^{2 - alpha}`` on the support (Peters, Niculae & Martins 2019, arXiv 1905.05702).
    Two passes over each row's visible prefix, in the scores' precision for sparsemax and
    1.5-entmax (closed forms), in float64 for any other alpha (:func:`_power_grad`)."""
    rows, n = z.shape
    u = alpha - 1.0
    groups = max(1, min(rows, groups))
    for g in prange(groups):
        for r in range(g, rows, groups):
            stop_r = min(n, stop[r])
            zr = z[r]
            dr = dp[r]
            if stop_r > 0:
                if u != 1.0 and u != 0.5:
                    _power_grad(zr[:stop_r], dr[:stop_r], u, tau[r], shift[r])
                else:
                    t = cast_like(tau[r], zr[0])
                    c = cast_like(shift[r], zr[0])
                    if c != 0:   # here, not in the fastmath loops, whose reassociation would undo it
                        for j in range(stop_r):
                            zr[j] = zr[j] - c
                    uu = cast_like(u, zr[0])
                    s_sum, sd = _grad_sums(zr[:stop_r], dr[:stop_r], uu, t)
                    mean = sd / s_sum if s_sum > 0 else sd - sd
                    _grad_write(zr[:stop_r], dr[:stop_r], uu, t, mean)
            zr[stop_r:] = 0
            dr[stop_r:] = 0


@njit(cache=True, error_model="numpy")
def _g(p, u):
    """``p^{2 - alpha}`` for ``p > 0``."""
    if u == 1.0:
        return 1.0
    if u == 0.5:
        return math.sqrt(p)
    return math.exp((1.0 - u) * math.log(p))


@njit(cache=True, error_model="numpy")
def _alpha_weight(p, g, u):
    r"""``h = p d^2 M(u d)`` at ``p > 0`` (``g = p^{1-u}``, ``u = alpha - 1``): ``dp/dalpha = h - g
    sum h / sum g``. ``d = expm1(u log p) / u`` (``log p`` at ``u = 0``) and
    ``M(t) = (1/(1+t) - log1p(t)/t) / t`` by its series ``-1/2 + 2t/3 - 3t^2/4 + ...`` where
    ``|t| < 0.05``. Used below alpha = 2: the form ``(sum p dy - mean) / u^2 - ...`` divides a
    difference of nearly equal sums of the float32 ``p`` by ``u^2`` (100x the reference's error
    at alpha = 1.05); above, ``h`` grows as ``p^(1-u)`` and that form is the accurate one."""
    log_p = math.log(p)
    d = math.expm1(u * log_p) / u if u > 0.0 else log_p
    t = u * d
    if abs(t) < 0.05:
        m = 0.0
        for k in range(16, 0, -1):
            m = m * t + (k / (k + 1.0) if k % 2 == 0 else -k / (k + 1.0))
        return p * d * d * m
    return d * d * (g - p * (u * log_p) / t) / t


@parallel_njit(cache=True, error_model="numpy")
def entmax_backward_rows(p, dy, alpha, dx, dalpha, want_alpha=True):
    """Closed-form gradients of alpha-entmax with respect to the scores and to alpha
    (``dalpha`` written only with ``want_alpha``; its sums cost a third of the pass).

    Only the support (``p > 0``, found chunk by chunk after a vectorised max) is visited
    entry by entry; the rest of ``dx`` is set to 0 in one vectorised pass.
    """
    rows, n = p.shape
    for r in prange(rows):
        u = alpha[r] - 1.0
        pr = p[r]
        gr = dy[r]
        dxr = dx[r]
        dxr[:] = 0
        if n == 0:
            continue
        zero = pr[0] - pr[0]
        count, _ = _count_above(pr, zero)
        vals = np.empty(count, np.float64)
        idx = np.empty(count, np.int64)
        count = _gather_above(pr, zero, zero, vals, idx)
        gs = np.empty(count, np.float64)
        sum_g = 0.0
        sum_g_dy = 0.0
        sum_h = 0.0   # alpha < 2: dalpha = sum h dy - mean sum h (see _alpha_weight)
        sum_h_dy = 0.0
        sum_p = 0.0      # alpha >= 2, where h grows as p^(1 - u) and its two sums cancel
        sum_p_dy = 0.0
        sum_plogp = 0.0
        sum_plogp_dy = 0.0
        for j in range(count):
            pi = vals[j]
            d = np.float64(gr[idx[j]])
            g = _g(pi, u)
            gs[j] = g
            sum_g += g
            sum_g_dy += g * d
            if not want_alpha:
                continue
            if u < 1.0:
                h = _alpha_weight(pi, g, u)
                sum_h += h
                sum_h_dy += h * d
            else:
                plogp = pi * math.log(pi)
                sum_p += pi
                sum_p_dy += pi * d
                sum_plogp += plogp
                sum_plogp_dy += plogp * d
        mean = sum_g_dy / sum_g if sum_g > 0 else 0.0
        for j in range(count):
            i = idx[j]
            dxr[i] = gs[j] * (np.float64(gr[i]) - mean)
        finite = math.isfinite(mean)   # else an infinite or NaN dy on the support: the reference's inf - inf
        if u > 1.0 and count > 1 and finite:
            # past alpha = 2, g = p^{2-alpha} grows without bound as p -> 0: the smallest p may
            # hold nearly all of sum g, and its dy - mean cancels; it takes the leave-one-out form
            k = 0
            for j in range(1, count):
                k = j if vals[j] < vals[k] else k
            dk = np.float64(gr[idx[k]])
            spread = 0.0
            for j in range(count):
                spread += 0.0 if j == k else gs[j] * (dk - np.float64(gr[idx[j]]))
            dxr[idx[k]] = gs[k] * spread / sum_g
        if not want_alpha:
            dalpha[r] = 0.0
        elif not finite:
            # entry by entry, sum_i dy_i dp_i/dalpha, as the reference sums it: one infinite dy
            # gives an infinity, where the row sums above would give inf - inf
            total = 0.0
            for j in range(count):
                pi, g = vals[j], gs[j]
                if u < 1.0:
                    w = _alpha_weight(pi, g, u) - g * sum_h / sum_g
                else:
                    w = (pi - g * sum_p / sum_g) / (u * u) - (pi * math.log(pi) - g * sum_plogp / sum_g) / u
                total += w * np.float64(gr[idx[j]])
            dalpha[r] = total
        elif u < 1.0:
            dalpha[r] = sum_h_dy - mean * sum_h
        else:
            # (sum_p, not 1: the output's p sums to 1 only to its rounding, and the terms sum to 0
            # only with the actual sum: at alpha = 2 on a near-flat float32 row of 500, 1.7e-3
            # relative error where the reference has 5e-8)
            dalpha[r] = (sum_p_dy - mean * sum_p) / (u * u) - (sum_plogp_dy - mean * sum_plogp) / u
