r"""A vectorisable ``exp`` for numba kernels, float32 and float64.

.. math:: e^{x} = 2^{n} e^{r},\quad n = \mathrm{rint}(x \log_2 e),\quad
          r = x - n \ln 2 \in [-\tfrac{\ln 2}{2}, \tfrac{\ln 2}{2}]

Range reduction after Cody & Waite (1980): ``ln 2`` is split into a high part and a
low correction so that ``r`` is computed almost exactly (with FMA contraction). ``n``
comes from the "magic number" rounding trick (adding ``1.5 * 2^p`` rounds to an integer
held in the low mantissa bits), so no float-to-int conversion is needed, and ``2^n`` is
built directly in the exponent bits. ``e^r = 1 + r + r^2 q(r)`` with ``q`` a polynomial
fitted on Chebyshev nodes of the reduced interval (degree 4 for float32, relative error
1.0e-8 < 2^-24; for float64 the Taylor polynomial of degree 11, 5e-18). Every step is branch-free (selects
only), so LLVM vectorises loops that call it. The measured maximum relative error
against a float64 reference, next to torch's own ``exp``, is in the kernel tests and
the kernel benchmark.

:func:`exp` is the full function: ``exp(-inf) = 0``, arguments below the smallest
normal result give 0, above the largest give ``inf``, NaN stays NaN.
:func:`exp_parts` returns the pair ``(e^r, n)`` without building ``2^n``: the
(mantissa, exponent) representation of the Two-Pass softmax (Dukhan & Ablavatski 2020,
arXiv 2001.04438), which never overflows.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from ._intrinsics import _bits_f32, _bits_f64, _f32_from_bits, _f64_from_bits, fused_multiply_add, held_constant

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

_Q32 = (0.5000000013462216, 0.1666666671900769, 0.04166646497612782, 0.008333298480363262,
        0.0013933643522430362, 0.00019899276217880582)
_Q64 = tuple(1.0 / math.factorial(k + 2) for k in range(12))   # Taylor: 5e-18 on the interval

# float32 constants
_F_LOG2E = np.float32(LOG2E)
_F_LN2_HI = np.float32(0.693359375)                # 9 significant bits: n * hi is exact
_F_LN2_LO = np.float32(LN2 - 0.693359375)
_F_LN2_HEAD = np.float32(LN2)                       # ln2 = head + tail to ~2^-48: exact products by FMA
_F_LN2_TAIL = np.float32(LN2 - float(np.float32(LN2)))
_F_MAGIC = np.float32(1.5 * 2.0 ** 23 + 127.0)     # rounds x log2e to an integer; bias 127 built in
_F_ROUND = np.float32(1.5 * 2.0 ** 23)
_F_LOW = np.float32(-87.33654)                       # exp(_F_LOW) ~ smallest normal float32
_F_HIGH = np.float32(88.72283)
_F_TOP = np.float32(127.5)
_F_TWO = np.float32(2.0)
_F_ZERO = np.float32(0.0)
_F_ONE = np.float32(1.0)
_F_INF = np.float32(np.inf)
_F_Q0, _F_Q1, _F_Q2, _F_Q3, _F_Q4, _F_Q5 = (np.float32(c) for c in _Q32)

# float64 constants
_D_LN2_HI = 6.93147180369123816490e-01            # 32 significant bits: n * hi is exact
_D_LN2_LO = 1.90821492927058770002e-10
_D_MAGIC = 1.5 * 2.0 ** 52 + 1023.0
_D_ROUND = 1.5 * 2.0 ** 52
_D_LOW = -708.3964185322641
_D_HIGH = 709.782712893384
_D_Q = _Q64


# ---- float32 -------------------------------------------------------------------------

@njit(cache=True, error_model="numpy")
def _two_sum(a, b):
    # s + err == a + b exactly (Knuth's TwoSum): keeps the reduced argument to ~2^-48.
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit(cache=True, error_model="numpy")
def _one_plus(r, tail):
    # 1 + r + tail with one rounding of the leading sum: (1 + r) is split exactly into
    # head + err (Fast2Sum, |1| >= |r|), so only the final addition rounds.
    head = _F_ONE + r
    err = (_F_ONE - head) + r
    return head + (err + tail)


@njit(cache=True, error_model="numpy")
def _one_plus64(r, tail):
    head = 1.0 + r
    err = (1.0 - head) + r
    return head + (err + tail)


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _reduce32(x):
    return _reduce32_clamped(min(max(x, _F_LOW), _F_HIGH))


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _poly32(r):
    # q(r), exp(r) = 1 + r + r^2 q(r) on |r| <= ln2 / 2. Constants through held_constant (here and
    # in the reductions): kept across the caller's loop, not re-broadcast every iteration.
    q = held_constant(_F_Q5)
    q = q * r + held_constant(_F_Q4)
    q = q * r + held_constant(_F_Q3)
    q = q * r + held_constant(_F_Q2)
    q = q * r + held_constant(_F_Q1)
    return q * r + held_constant(_F_Q0)


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _reduce32_clamped(xc):
    magic = held_constant(_F_MAGIC)
    t = xc * held_constant(_F_LOG2E) + magic
    n = t - magic
    r, r_err = _two_sum(xc - n * held_constant(_F_LN2_HI), -(n * held_constant(_F_LN2_LO)))
    return _one_plus(r, r * r * _poly32(r) + r_err), t, n


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp32(x):
    p, t, n = _reduce32(x)
    # 2^n with n = 128 (x near the overflow limit) is built as 2 * 2^127
    top = n > _F_TOP
    scale = _f32_from_bits(np.int32((_bits_f32(t) - np.int32(top)) << 23))
    e = p * scale * (_F_TWO if top else _F_ONE)
    e = _F_ZERO if x < _F_LOW else e
    e = _F_INF if x > _F_HIGH else e
    return e if x == x else x


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp_nonpositive32(x):
    xc = _F_LOW if x < _F_LOW else x          # a select: NaN passes through
    p, t, _ = _reduce32_clamped(xc)
    e = p * _f32_from_bits(np.int32(_bits_f32(t) << 23))
    return _F_ZERO if x < _F_LOW else e


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp_parts32(x):
    # n is x*log2e rounded; the argument is clamped only to keep |n| small enough for
    # the magic rounding (2^22), far beyond any exponent difference that matters.
    # selects, not min/max: a NaN argument must come out as a NaN mantissa
    xc = np.float32(-2.0e6) if x < np.float32(-2.0e6) else x
    xc = np.float32(2.0e6) if xc > np.float32(2.0e6) else xc
    rounding = held_constant(_F_ROUND)
    t = fused_multiply_add(xc, held_constant(_F_LOG2E), rounding)   # (a rounded x log2e can miss n by 1)
    n = t - rounding
    # |n| reaches 2^22 here, where n * ln2_hi (9 bits) is no longer exact and n * ln2_lo rounds
    # by more than r's precision (5e-6 relative at x = 9e5): two exact products (FMA) against
    # ln2 split into float32 head and tail keep r within 3e-8
    r = fused_multiply_add(-n, held_constant(_F_LN2_HEAD), xc)
    r = fused_multiply_add(-n, held_constant(_F_LN2_TAIL), r)
    return _one_plus(r, r * r * _poly32(r)), n


# ---- float64 -------------------------------------------------------------------------

@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _tail64(r):
    q = held_constant(_D_Q[11])
    q = q * r + held_constant(_D_Q[10])
    q = q * r + held_constant(_D_Q[9])
    q = q * r + held_constant(_D_Q[8])
    q = q * r + held_constant(_D_Q[7])
    q = q * r + held_constant(_D_Q[6])
    q = q * r + held_constant(_D_Q[5])
    q = q * r + held_constant(_D_Q[4])
    q = q * r + held_constant(_D_Q[3])
    q = q * r + held_constant(_D_Q[2])
    q = q * r + held_constant(_D_Q[1])
    q = q * r + held_constant(_D_Q[0])
    return r * r * q


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp64(x):
    xc = min(max(x, _D_LOW), _D_HIGH)
    t = xc * LOG2E + _D_MAGIC
    n = t - _D_MAGIC
    r, r_err = _two_sum(xc - n * _D_LN2_HI, -(n * _D_LN2_LO))
    top = n > 1023.5
    scale = _f64_from_bits((_bits_f64(t) - np.int64(top)) << 52)
    e = _one_plus64(r, _tail64(r) + r_err) * scale * (2.0 if top else 1.0)
    e = 0.0 if x < _D_LOW else e
    e = np.inf if x > _D_HIGH else e
    return e if x == x else x


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp_nonpositive64(x):
    xc = _D_LOW if x < _D_LOW else x
    t = xc * LOG2E + _D_MAGIC
    n = t - _D_MAGIC
    r, r_err = _two_sum(xc - n * _D_LN2_HI, -(n * _D_LN2_LO))
    e = _one_plus64(r, _tail64(r) + r_err) * _f64_from_bits(_bits_f64(t) << 52)
    return 0.0 if x < _D_LOW else e


@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp_parts64(x):
    xc = -1.0e15 if x < -1.0e15 else x
    xc = 1.0e15 if xc > 1.0e15 else xc
    t = xc * LOG2E + _D_ROUND
    n = t - _D_ROUND
    r, r_err = _two_sum(xc - n * _D_LN2_HI, -(n * _D_LN2_LO))
    return _one_plus64(r, _tail64(r) + r_err), n


# ---- generic entry points ------------------------------------------------------------

def exp(x):
    """``e^x`` (float32 or float64 scalar, inside numba code)."""
    raise NotImplementedError("call from numba-compiled code")


def exp_nonpositive(x):
    """:func:`exp` for ``x <= 0`` (and ``-inf``, NaN): the softmax case, a few operations fewer."""
    raise NotImplementedError("call from numba-compiled code")


def exp_parts(x):
    """``(m, n)`` with ``e^x = m * 2^n``, ``m`` in ``[2^-0.5, 2^0.5]`` (inside numba code)."""
    raise NotImplementedError("call from numba-compiled code")


def pow2(n, like):
    """``2^n`` for an integer-valued float ``n``; 0 below the smallest normal number."""
    raise NotImplementedError("call from numba-compiled code")


@overload(exp, inline="always")
def _ov_exp(x):
    if x == types.float32:
        return lambda x: _exp32(x)
    if x == types.float64:
        return lambda x: _exp64(x)


@overload(exp_nonpositive, inline="always")
def _ov_exp_nonpositive(x):
    if x == types.float32:
        return lambda x: _exp_nonpositive32(x)
    if x == types.float64:
        return lambda x: _exp_nonpositive64(x)


@overload(exp_parts, inline="always")
def _ov_exp_parts(x):
    if x == types.float32:
        return lambda x: _exp_parts32(x)
    if x == types.float64:
        return lambda x: _exp_parts64(x)


@njit(cache=True, error_model="numpy")
def _pow2_32(n):
    nc = max(n, np.float32(-127.0))
    s = _f32_from_bits(np.int32((np.int32(nc) + np.int32(127)) << 23))
    return s if n > np.float32(-127.0) else _F_ZERO


@njit(cache=True, error_model="numpy")
def _pow2_64(n):
    nc = max(n, -1023.0)
    s = _f64_from_bits(np.int64((np.int64(nc) + np.int64(1023)) << 52))
    return s if n > -1023.0 else 0.0


@overload(pow2, inline="always")
def _ov_pow2(n, like):
    if like == types.float32:
        return lambda n, like: _pow2_32(n)
    if like == types.float64:
        return lambda n, like: _pow2_64(n)


@njit(cache=True, error_model="numpy")
def exp_array(x, out, nonpositive):
    """Elementwise :func:`exp` (or :func:`exp_nonpositive`) of a 1-d array, for measurements."""
    if nonpositive:
        for i in range(x.shape[0]):
            out[i] = exp_nonpositive(x[i])
    else:
        for i in range(x.shape[0]):
            out[i] = exp(x[i])


# ---- a cheaper float32 exp for x <= 0 ------------------------------------------------

@njit(fastmath={"contract"}, cache=True, error_model="numpy")
def _exp_nonpositive32_fast(x):
    # the reduction and polynomial of _exp_nonpositive32 without the compensated sums
    # (TwoSum of the reduced argument, Fast2Sum of 1 + r): within 2 ulp, ~10 operations fewer
    low, magic = held_constant(_F_LOW), held_constant(_F_MAGIC)
    xc = low if x < low else x
    t = xc * held_constant(_F_LOG2E) + magic
    n = t - magic
    r = (xc - n * held_constant(_F_LN2_HI)) - n * held_constant(_F_LN2_LO)
    e = (held_constant(_F_ONE) + (r + r * r * _poly32(r))) * _f32_from_bits(np.int32(_bits_f32(t) << 23))
    return _F_ZERO if x < low else e


def exp_nonpositive_fast(x):
    """:func:`exp_nonpositive` within 2 ulp in float32 (no compensated sums; the attention row
    kernels' exponential); float64: :func:`exp_nonpositive` itself."""
    raise NotImplementedError("call from numba-compiled code")


@overload(exp_nonpositive_fast, inline="always")
def _ov_exp_nonpositive_fast(x):
    if x == types.float32:
        return lambda x: _exp_nonpositive32_fast(x)
    if x == types.float64:
        return lambda x: _exp_nonpositive64(x)
