"""Parallel numba kernels that survive ``fork``.

numba runs ``prange`` loops on its threading layer, here GNU OpenMP (``omp``). libgomp's
thread pool does not survive ``fork``: in a child forked after the parent launched a
parallel kernel (``multiprocessing``'s default start method on Linux, a DataLoader's
workers), numba kills the child at its first parallel launch ("fork() called from a
process already using GNU OpenMP, this is unsafe"), whatever the thread count.

Each parallel kernel is therefore declared with :func:`parallel_njit`, which also keeps the
recipe of its serial twin (the same function compiled without ``parallel``, where
``prange`` is ``range``). Every launch goes through :func:`runnable`, which hands back the
parallel kernel, or, in a child forked after the pool started, the serial twin (compiled
on first use there). The child computes the same rows on one thread. The twins also serve
single rows (:func:`serial_twin`), where a parallel launch costs more than it gains.
"""

from __future__ import annotations

import os
import types

import numba
from numba import njit
from numba.core.dispatcher import Dispatcher
from numba.np.ufunc import parallel as _numba_parallel  # (imported here: no import inside the fork hook)

#: ``id(parallel kernel)`` -> (its Python function, its njit options without ``parallel``).
_RECIPES: dict[int, tuple[types.FunctionType, dict]] = {}
_TWINS: dict[int, Dispatcher] = {}
_pool_inherited = False


def parallel_njit(**options):
    """``numba.njit(parallel=True, **options)``, with the kernel's serial twin on record for
    :func:`runnable`."""
    def declare(function: types.FunctionType) -> Dispatcher:
        kernel = njit(parallel=True, **options)(function)
        _RECIPES[id(kernel)] = (function, options)
        return kernel
    return declare


def runnable(kernel: Dispatcher) -> Dispatcher:
    """``kernel``, or its serial twin in a process forked after numba's OpenMP pool started
    (see the module docstring). Any kernel not declared with :func:`parallel_njit` is
    returned as is."""
    if not _pool_inherited or id(kernel) not in _RECIPES:
        return kernel
    return serial_twin(kernel)


def serial_twin(kernel: Dispatcher) -> Dispatcher:
    """The kernel declared with :func:`parallel_njit`, compiled without ``parallel`` (one per
    kernel; compiled on first call): also what a single row runs, where the parallel launch,
    and the OpenMP workers it leaves spinning on the cores the caller's next operations need,
    cost more than a second thread gains."""
    twin = _TWINS.get(id(kernel))
    if twin is None:
        function, options = _RECIPES[id(kernel)]
        # numba's disk cache names entries by the function's qualified name and first line,
        # not by its options: the twin needs a name of its own or it would load (and
        # overwrite) the parallel kernel's entries
        copy = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                  function.__defaults__, function.__closure__)
        copy.__qualname__ = function.__qualname__ + "__serial"
        copy.__doc__ = function.__doc__
        twin = _TWINS[id(kernel)] = njit(**options)(copy)
    return twin


def pool_inherited() -> bool:
    """Whether this process was forked after its parent started numba's OpenMP pool (its
    parallel kernels then run as their serial twins)."""
    return _pool_inherited


def serial_twins_made() -> list[str]:
    """The names of the kernels whose serial twins this process declared."""
    return [twin.py_func.__name__ for twin in _TWINS.values()]


def _note_fork_in_child() -> None:
    global _pool_inherited
    if getattr(_numba_parallel, "_is_initialized", False) and numba.threading_layer() == "omp":
        _pool_inherited = True


os.register_at_fork(after_in_child=_note_fork_in_child)
