"""Timing and memory helpers for benchmarks: medians and ratios measured in one run.

Benchmarks never assert on time; they report ratios to a baseline timed in the same
process (torch, a peer package, or a plain copy of the same bytes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import statistics
import time
from typing import Callable

import torch


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_time(x: torch.Tensor, repeats: int = 5) -> float:
    """Median time of a plain copy of ``x`` into a preallocated tensor: the bandwidth bound."""
    out = torch.empty_like(x)
    return median_time(lambda: out.copy_(x), repeats=repeats)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Extra peak resident memory (bytes) while running ``fn()`` on the CPU.

    Hands freed heap memory back to the kernel (glibc's ``malloc_trim``: otherwise a
    block freed by an earlier call stays resident and is reused unseen), resets the
    kernel's high-water mark (``/proc/self/clear_refs``), runs ``fn`` and reads ``VmHWM``
    minus the resident size before the call. Counts only touched pages, which is what a
    computation costs. On CUDA tensors use ``torch.cuda.max_memory_allocated``.
    """
    gc.collect()
    _release_free_heap()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    gc.collect()
    return max(peak - before, 0) * 1024


def _release_free_heap() -> None:
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def machine_header() -> dict:
    """CPU model, thread count and library versions, for the header of every benchmark."""
    import platform

    import numpy

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import numba
        numba_version = numba.__version__
    except ImportError:
        numba_version = "not installed"
    return {
        "cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "numba": numba_version, "numpy": numpy.__version__, "python": platform.python_version(),
    }
