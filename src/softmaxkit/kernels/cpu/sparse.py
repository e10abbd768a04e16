r"""numba kernels for alpha-entmax (sparsemax at alpha = 2, 1.5-entmax at alpha = 1.5).

With ``u = alpha - 1 > 0`` and scores shifted so that the row maximum is 0
(``s = x - max x``), alpha-entmax (Peters, Niculae & Martins 2019, arXiv 1905.05702) is

.. math:: p_i = [u\,(s_i - \theta)]_+^{1/u}, \qquad
          f(\theta) = \sum_i [u\,(s_i - \theta)]_+^{1/u} - 1 = 0,

sparsemax (Martins & Astudillo 2016, arXiv 1602.02068) being ``u = 1``.

Threshold search: safeguarded Newton on ``theta``, on a shrinking candidate set.
``f`` is continuous and decreasing, with ``f(-1/u) >= 0`` (the maximum alone gives 1)
and ``f(-n^{-u}/u) <= 0`` (every entry at most ``1/n``), so the root is bracketed from
the start. Only entries with ``s_i > -1/u`` can ever be in the support; they are copied
once into a scratch list (one pass over the row), and after every step the entries at
or below the lower bracket end are dropped, so later steps touch fewer entries. Each
step takes the Newton point ``theta + F / D`` (``F = f(theta)``,
``D = -f'(theta) = sum w_i^{1/u - 1}``) when it lies inside the bracket and bisects
otherwise.

Why this choice: for ``u <= 1`` (alpha <= 2) ``f`` is convex, so Newton started at the
left end increases monotonically and never leaves the bracket; for sparsemax the steps
are exactly Michelot's (1986) projection iterations, and for sparsemax and 1.5-entmax
``f`` is piecewise linear / quadratic, so once the support is found one closed-form
step on it gives the exact threshold (computed at the end, as the sort-based
reference does). Newton converges quadratically, and in practice in a handful of
steps, each an O(candidates) vectorisable pass, after one O(n) pass over the row:
expected linear time, with no sort and no random access, against ``O(n log n)`` for the
sort-based algorithms and ~50 full passes for bisection. The safeguard (bisection
inside the bracket) bounds the worst case by the bisection rate for any alpha, including
``alpha > 2`` where ``f`` is concave.

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
from .softmax import _max

#: Newton/bisection steps allowed before the bracket is accepted as converged.
MAX_STEPS = 200
#: Entries per chunk: a chunk is scanned entry by entry only if its maximum can matter.
CHUNK = 64


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
def _threshold(vals, idx, count, n, u):
    """Root ``theta`` of ``f`` by safeguarded Newton; returns (theta, candidate count)."""
    lo = -1.0 / u
    hi = -math.exp(-u * math.log(n)) / u
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
    theta = best
    if u == 1.0 or u == 0.5:
        # exact on the support found; repeat while the support it implies differs
        for _ in range(8):
            exact = _closed_form(vals, count, theta, u)
            if exact == theta:
                break
            theta = exact
    return theta, count


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


@njit(cache=True, error_model="numpy")
def _reach(top, u):
    """A value of ``top``'s type ``< top`` and ``<= top - 1/u`` (exactly): entries above it
    are the candidates. ``top - 1/u`` rounded in the input type can equal ``top`` (|x| about
    1e8 in float32, a -1e9 mask fill), which would leave no candidate at all."""
    exact = np.float64(top) - 1.0 / u
    reach = cast_like(exact, top)
    if np.float64(reach) > exact or reach >= top:
        reach = np.nextafter(reach, cast_like(-np.inf, top))
    return reach


@njit(cache=True, error_model="numpy")
def _row(x, out, u):
    """alpha-entmax of one row into ``out``; False for a row it leaves to the reference
    (a NaN or a ``+inf``, or a result that is not a finite distribution)."""
    n = x.shape[0]
    neg_inf = cast_like(-np.inf, x[0])
    top = _max(x, neg_inf)
    out[:] = 0
    if top == -neg_inf:
        return False
    if top == neg_inf:
        return True
    reach = _reach(top, u)
    count, nans = _count_above(x, reach)
    if nans or count == 0:
        return False
    vals = np.empty(count, np.float64)
    idx = np.empty(count, np.int64)
    count = _gather_above(x, reach, top, vals, idx)
    theta, count = _threshold(vals, idx, count, n, u)
    total = 0.0
    for i in range(count):
        w = u * (vals[i] - theta)
        vals[i] = _power(w, u) if w > 0 else 0.0
        total += vals[i]
    if not (total > 0.5 and total < 2.0):
        return False
    scale = 1.0 / total if u != 1.0 and u != 0.5 else 1.0
    for i in range(count):
        out[idx[i]] = vals[i] * scale
    return True


@njit(parallel=True, cache=True, error_model="numpy")
def entmax_rows(x, out, alpha, special):
    """alpha-entmax of each row of ``x`` (C-contiguous 2-d); ``alpha`` float64, one per row."""
    rows, n = x.shape
    for r in prange(rows):
        if n == 0:
            special[r] = 0
            continue
        ok = _row(x[r], out[r], alpha[r] - 1.0)
        special[r] = 0 if ok else 1


@njit(cache=True, error_model="numpy")
def _g(p, u):
    """``p^{2 - alpha}`` for ``p > 0``."""
    if u == 1.0:
        return 1.0
    if u == 0.5:
        return math.sqrt(p)
    return math.exp((1.0 - u) * math.log(p))


@njit(parallel=True, cache=True, error_model="numpy")
def entmax_backward_rows(p, dy, alpha, dx, dalpha):
    """Closed-form gradients of alpha-entmax with respect to the scores and to alpha.

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
        sum_g = 0.0
        sum_g_dy = 0.0
        sum_p_dy = 0.0
        sum_plogp = 0.0
        sum_plogp_dy = 0.0
        for j in range(count):
            pi = vals[j]
            d = np.float64(gr[idx[j]])
            g = _g(pi, u)
            plogp = pi * math.log(pi)
            sum_g += g
            sum_g_dy += g * d
            sum_p_dy += pi * d
            sum_plogp += plogp
            sum_plogp_dy += plogp * d
        mean = sum_g_dy / sum_g if sum_g > 0 else 0.0
        for j in range(count):
            i = idx[j]
            dxr[i] = _g(vals[j], u) * (np.float64(gr[i]) - mean)
        dalpha[r] = (sum_p_dy - mean) / (u * u) - (sum_plogp_dy - mean * sum_plogp) / u
