"""numba CPU kernels: softmax family, fused softmax + top-k, sparsemax and entmax.

The kernels work on C-contiguous float32 / float64 arrays along the last axis, run in
parallel over rows with as many threads as ``torch.get_num_threads()`` (capped by
numba's pool size), and are compiled on first use and cached on disk
(``cache=True``). Use them through :mod:`softmaxkit.kernels.dispatch`, which decides
when they apply; :mod:`.functions` holds the autograd-aware entry points.

Protocol (never unwritten memory): every entry point returns its output and a bool
tensor of the rows it did not compute (shape ``x.shape[:-1]``); those rows hold zeros
and the dispatcher recomputes them with the reference. Each kernel receives a
``special`` array filled with :data:`FLAG_TODO` and overwrites a row's flag only after
the row is written, so a row whose thread stopped on an error stays flagged.
"""

from __future__ import annotations

import warnings

import numba
import numpy as np
import torch
from numba.core.dispatcher import Dispatcher
from numba.np.ufunc import parallel as _numba_parallel

from .parallel import runnable

#: ``special`` value of a row no kernel has finished (see the module docstring).
FLAG_TODO = 2


def keep_torch_threads(kernel, *args) -> None:
    """Run ``kernel(*args)`` and give torch back its thread count: numba's OpenMP layer shares
    torch's OpenMP runtime and sets the count torch reads to its pool size on every parallel
    launch (seen: ``torch.set_num_threads(1)`` read back as 2 after one kernel), which would
    then run every later torch op on an oversubscribed team."""
    threads = torch.get_num_threads()
    try:
        compiled_call(kernel, *args)
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def call_kernel(op: str, kernel, *args) -> None:
    """Run ``kernel(*args)`` (torch's thread count kept, see :func:`keep_torch_threads`); an
    exception is reported as a warning naming ``op`` (the rows it did not finish keep
    :data:`FLAG_TODO` and are recomputed by the reference)."""
    try:
        keep_torch_threads(kernel, *args)
    except Exception as exc:
        warnings.warn(f"the numba kernel for {op} raised {type(exc).__name__}: {exc}; the rows it did "
                      "not finish are recomputed by the reference", RuntimeWarning, stacklevel=3)


_ENTRY_POINTS: dict = {}


_SCALARS = (int, float, bool, np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_)


def _arg_key(arg):
    if isinstance(arg, np.ndarray):
        flags = arg.flags
        return (arg.dtype.char, arg.ndim, flags.c_contiguous, flags.writeable, flags.aligned)
    if isinstance(arg, Dispatcher):
        return id(arg)
    kind = type(arg)
    return kind if kind in _SCALARS else None   # None: a type the key cannot tell apart (a tuple)


def entry_point(kernel, *args):
    """The compiled entry point of ``kernel``'s specialisation for ``args`` (after a call
    that compiled it), or None where numba converts an argument on each call. Calling it
    skips the dispatcher's typing of every argument; the caller keeps the argument types."""
    compiled = kernel.overloads.get(tuple(kernel.typeof_pyval(arg) for arg in args))
    return None if compiled is None else compiled.entry_point


def compiled_call(kernel, *args) -> None:
    """``kernel(*args)`` through the entry point of the specialisation that matches the
    arguments, found once per kind of arguments: numba's dispatcher types every argument on
    every call, and a function argument (the attention row kernels' pieces) costs it about
    60 us, as much as a small kernel. The key holds what the type of each argument depends
    on (dtype, dimensions, layout and flags of an array; the identity of a function, which the
    entry keeps alive; the Python type of a scalar)."""
    kernel = runnable(kernel)
    key = (id(kernel),) + tuple(map(_arg_key, args))
    entry = _ENTRY_POINTS.get(key)
    if entry is None and None in key:
        kernel(*args)
        return
    if entry is None:
        kernel(*args)   # compiles on first use
        entry = entry_point(kernel, *args)
        if entry is not None:   # (None: numba converted an argument; the dispatcher keeps doing so)
            held = tuple(arg for arg in args if isinstance(arg, Dispatcher))
            _ENTRY_POINTS[key] = (entry, kernel, held)
        return
    entry[0](*args)


def sync_threads() -> int:
    """Make numba use ``torch.get_num_threads()`` threads (at most numba's pool size).

    Runs before every parallel kernel launch. Once numba's pool is up, the calling thread's
    count is read from the threading layer itself: ``numba.get_num_threads()`` takes two
    locks each call (one a process lock), about 1 us in a hot loop and 7-9 us after a large
    op has evicted them from the caches: a kernel's forward and backward each paid it, and the
    direct read took 5-10 us off a softmax forward+backward of 0.17-0.9 ms (2026-12-04)."""
    threads = torch.get_num_threads()
    n = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]  # numba sets it at import
    if _pool_thread_count() == n:
        return n
    if numba.get_num_threads() != n:   # the first call starts numba's pool, which resets torch's count
        numba.set_num_threads(n)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return n


def _pool_thread_count() -> int:
    """The calling thread's numba thread count as the started pool's threading layer holds
    it, or 0 before the pool starts (the caller then asks ``numba.get_num_threads()``,
    which starts it)."""
    if not getattr(_numba_parallel, "_is_initialized", False):
        return 0
    count = getattr(_numba_parallel, "_get_num_threads", None)
    return count() if count is not None else 0
