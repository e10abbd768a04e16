"""A numba scan that reads one entry per row: the cheap check behind the aten path.

``torch.softmax`` / ``log_softmax`` leave a row that the reference defines differently
(nothing visible, a NaN, a ``+inf``) all NaN, and every other row free of NaN, so the
first entry of each row tells the two apart. Reading it with torch or numpy costs a few
microseconds of fixed overhead per call (a strided view, a temporary, a reduction);
this scan reads the entries in place, from the tensor's address, at about 0.3 us plus
one cache line per row.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import carray, njit, prange

from . import entry_point, sync_threads
from ._intrinsics import cast_like, wide_vectors
from ._intrinsics import pointer_to as _pointer
from .parallel import parallel_njit, runnable


@njit(cache=True, nogil=True)
def _scan(address, count, stride, inf_too, like):
    values = carray(_pointer(address, like), (count * stride,))
    for r in range(count):
        v = values[r * stride]
        if v != v or (inf_too and v - v != 0):
            return True
    return False


@parallel_njit(cache=True, nogil=True)
def _scan_parallel(address, count, stride, inf_too, like):
    values = carray(_pointer(address, like), (count * stride,))
    found = 0
    for r in prange(count):
        v = values[r * stride]
        if v != v or (inf_too and v - v != 0):
            found += 1
    return found > 0


#: From this many rows the scan runs on every thread: one cache miss per row, so many
#: short rows (attention probabilities) cost tens of microseconds on one thread.
PARALLEL_ROWS = 4096
_LIKE = {torch.float32: np.float32(0), torch.float64: np.float64(0)}


def first_entries_have_nan(t: torch.Tensor, inf_too: bool = False) -> bool:
    """Whether any row of ``t`` (CPU, float32 or float64, C-contiguous, rows along the last
    axis, at least one column) has a NaN as its first entry (with ``inf_too``, a NaN or an
    infinity: the backward hooks' look for rows an infinite incoming gradient reached)."""
    n = t.shape[-1]
    rows = t.numel() // n
    if rows >= PARALLEL_ROWS:
        sync_threads()
        return runnable(_scan_parallel)(t.data_ptr(), rows, n, inf_too, _LIKE[t.dtype])
    return _call(_scan, t.data_ptr(), rows, n, inf_too, _LIKE[t.dtype])


_ENTRIES: dict = {}


def _call(kernel, *args):
    """``kernel(*args)`` through its compiled entry point, found once per (kernel, dtype): the
    dispatcher's typing of the arguments (the scalar standing for the dtype among them) cost
    about 5 us a call, more than the read itself."""
    key = (kernel, type(args[-1]))
    entry = _ENTRIES.get(key)
    if entry is None:
        result = kernel(*args)
        _ENTRIES[key] = entry_point(kernel, *args) or kernel
        return result
    return entry(*args)



@njit(cache=True, nogil=True)
def _finite(values):
    finite = True
    for i in range(values.shape[0]):   # no early exit: a vectorised AND (NaN and +-inf give v - v NaN)
        v = values[i]
        finite = finite & (v - v == 0)
    return finite


@njit(cache=True, nogil=True)
def _all_finite(address, count, like):
    return _finite(carray(_pointer(address, like), (count,)))


@njit(cache=True, nogil=True)
def _reaches(address, count, like, floor):
    values = carray(_pointer(address, like), (count,))
    found = False
    for i in range(count):   # no early exit: a vectorised OR of the comparisons (a bool: an
        found = found | (values[i] == floor)   # integer accumulator vectorised at half the rate)
    return found


def reaches_floor(t: torch.Tensor, floor: float) -> bool:
    """Whether an entry of ``t`` (CPU, float32 or float64, C-contiguous, not empty) equals
    ``floor``: the lanes' look for the outputs that pass no gradient, ``-inf`` in a
    log-softmax and 0 in a softmax, read in place on one thread (``float(t.amin())`` cost
    about 10 us of torch's parallel launch at 1 x 32000)."""
    like = _LIKE[t.dtype]
    return _call(_reaches, t.data_ptr(), t.numel(), like, type(like)(floor))


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` (CPU, float32 or float64, C-contiguous) is finite: the
    log-sum-exp lane's check of its result, read in place (numpy's ``isfinite(...).all()``
    cost about 8 us a call, more than a small log-sum-exp); on every thread from
    :data:`PARALLEL_NUMEL` entries."""
    count = t.numel()
    if count < PARALLEL_NUMEL:
        return _call(_all_finite, t.data_ptr(), count, _LIKE[t.dtype])
    sync_threads()
    return _call(runnable(_all_finite_parallel), t.data_ptr(), count, _LIKE[t.dtype])


@njit(cache=True, nogil=True)
def _below_finite(values, threshold):
    wide_vectors()
    neg_inf = cast_like(-np.inf, threshold)
    found = False
    for i in range(values.shape[0]):   # one vectorised OR
        v = values[i]
        found = found | ((v < threshold) & (v != neg_inf))
    return found


@njit(cache=True, nogil=True)
def _below_finite_at(address, count, like, threshold):
    return _below_finite(carray(_pointer(address, like), (count,)), threshold)


@parallel_njit(cache=True, nogil=True)
def _below_finite_at_parallel(address, count, like, threshold):
    values = carray(_pointer(address, like), (count,))
    found = 0
    for c in prange((count + _CHUNK - 1) // _CHUNK):
        found += _below_finite(values[c * _CHUNK:min(count, (c + 1) * _CHUNK)], threshold)
    return found > 0


_MAX = {dtype: float(np.finfo(type(like)).max) for dtype, like in _LIKE.items()}


def overflows_when_scaled(t: torch.Tensor, scale: float) -> bool:
    """Whether a finite entry of ``t`` (CPU, float32 or float64, C-contiguous) times ``scale``
    (``1 / T``, ``T < 1``) may be ``-inf``: a finfo.min fill over the temperature, whose row
    the reference computes as ``(x - max) / T``. The aten path's look, one pass without
    temporaries (four torch ops cost 30-100 us on 64 x 1000 entries), for entries below
    ``-finfo.max / scale`` with a margin of a millionth: True also for an entry a rounding
    away from overflowing, which the caller's exact test then clears."""
    count = t.numel()
    if not count:
        return False
    like = _LIKE[t.dtype]
    threshold = -_MAX[t.dtype] / scale * (1.0 - 1e-6)
    args = (t.data_ptr(), count, like, type(like)(threshold))
    if count < PARALLEL_NUMEL:
        return _call(_below_finite_at, *args)
    sync_threads()
    return _call(runnable(_below_finite_at_parallel), *args)


#: Bits of :func:`nan_or_floor`'s result.
NAN_FOUND, FLOOR_FOUND = 1, 2


@njit(cache=True, nogil=True)
def _any_not_above(values, floor):
    wide_vectors()   # (32000 float32 entries in cache: 0.6 us, with 256-bit vectors 0.9)
    found = False
    for i in range(values.shape[0]):   # one vectorised OR: NaN is not above the floor either
        found = found | (not values[i] > floor)
    return found


@njit(cache=True, nogil=True)
def _not_above(address, count, like, floor):
    return _any_not_above(carray(_pointer(address, like), (count,)), floor)


#: Entries per chunk of :func:`_not_above_parallel`, and the count from which it runs.
_CHUNK = 1 << 16
PARALLEL_NUMEL = 1 << 18


@parallel_njit(cache=True, nogil=True)
def _not_above_parallel(address, count, like, floor):
    values = carray(_pointer(address, like), (count,))
    found = 0
    for c in prange((count + _CHUNK - 1) // _CHUNK):
        found += _any_not_above(values[c * _CHUNK:min(count, (c + 1) * _CHUNK)], floor)
    return found > 0


@parallel_njit(cache=True, nogil=True)
def _all_finite_parallel(address, count, like):
    values = carray(_pointer(address, like), (count,))
    bad = 0
    for c in prange((count + _CHUNK - 1) // _CHUNK):
        bad += not _finite(values[c * _CHUNK:min(count, (c + 1) * _CHUNK)])
    return bad == 0


@njit(cache=True, nogil=True)
def _nan_or_floor(address, count, like, floor):
    values = carray(_pointer(address, like), (count,))
    nan = False
    at_floor = False
    for i in range(count):   # no early exit: two vectorised ORs
        v = values[i]
        nan = nan | (v != v)
        at_floor = at_floor | (v == floor)
    return (NAN_FOUND if nan else 0) | (FLOOR_FOUND if at_floor else 0)


_NOT_ABOVE: dict = {}
_FLOORS = {(dtype, floor): type(like)(floor) for dtype, like in _LIKE.items() for floor in (0.0, -np.inf)}


def nan_or_floor(t: torch.Tensor, floor: float) -> int:
    """One pass over ``t`` (CPU, float32 or float64, C-contiguous, not empty; ``floor`` 0 or
    ``-inf``): :data:`NAN_FOUND` when an entry is NaN, or'ed with :data:`FLOOR_FOUND` when one
    equals ``floor``. The lanes' check of an aten output that records a gradient: a NaN
    marks a row aten leaves all NaN where the reference differs, a floor entry (a zero
    probability, a ``-inf`` log-probability) one that must pass no gradient; one call, while
    the output is in cache, on every thread from :data:`PARALLEL_NUMEL` entries."""
    dtype = t.dtype
    count = t.numel()
    args = (t.data_ptr(), count, _LIKE[dtype], _FLOORS[dtype, floor])
    # the common output (every entry above the floor) in one OR, half the time of two
    if count < PARALLEL_NUMEL:
        entry = _NOT_ABOVE.get(dtype)
        if entry is None:
            suspect = _call(_not_above, *args)
            entry = _NOT_ABOVE[dtype] = _ENTRIES[_not_above, type(args[-1])]
        else:   # (the entry by dtype: the lanes' one call per softmax with a gradient)
            suspect = entry(*args)
    else:
        sync_threads()
        suspect = _call(runnable(_not_above_parallel), *args)
    return _call(_nan_or_floor, *args) if suspect else 0
