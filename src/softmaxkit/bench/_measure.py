"""Timing and memory helpers for benchmarks: medians and ratios measured in one run.

Benchmarks never assert on time; they report ratios to a baseline timed in the same
process (torch, a peer package, or a plain copy of the same bytes).

Every median comes back as a :class:`Measured` number: a ``float`` (so tables print and
compute exactly as before) that also carries its run-to-run noise, the robust relative
spread of the repeats it is the median of. Arithmetic with other numbers keeps it
(products and quotients of two measurements add their relative noises in quadrature), so
a ratio such as ``t_torch / t_kernel`` carries the noise of both timings into the table,
and from there into ``results.json``, where ``softmaxkit compare`` reads it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import statistics
import time
from collections.abc import Callable

import torch

from ..kernels import memory

#: 1.4826 x the median absolute deviation estimates a normal distribution's standard deviation.
_MAD_TO_SIGMA = 1.4826


class Measured(float):
    """A measured number (a median) with ``noise``: its relative run-to-run spread.

    ``noise`` is ``1.4826 * MAD / median`` of the repeated measurements (the median
    absolute deviation scaled to a standard deviation, relative to the median), or
    ``None`` when it could not be estimated (fewer than two repeats). The value itself
    is an ordinary ``float``.

    ``a * c``, ``a / c`` and ``c / a`` with a plain number ``c`` keep ``a``'s relative noise;
    ``a * b`` and ``a / b`` of two measurements get ``sqrt(noise_a^2 + noise_b^2)`` (None
    if either is None). Sums and differences give plain floats.
    """

    __slots__ = ("noise",)
    noise: float | None

    def __new__(cls, value: float, noise: float | None = None) -> Measured:
        obj = super().__new__(cls, value)
        obj.noise = None if noise is None or noise != noise else float(noise)
        return obj

    def __reduce__(self):
        return (Measured, (float(self), self.noise))

    def __repr__(self) -> str:
        return float.__repr__(self)

    def _combine(self, other, value: float) -> Measured:
        if isinstance(other, Measured):
            if self.noise is None or other.noise is None:
                return Measured(value, None)
            return Measured(value, (self.noise ** 2 + other.noise ** 2) ** 0.5)
        return Measured(value, self.noise)

    def __mul__(self, other):
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return NotImplemented
        return self._combine(other, float(self) * float(other))

    __rmul__ = __mul__

    def __truediv__(self, other):
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return NotImplemented
        return self._combine(other, float(self) / float(other))

    def __rtruediv__(self, other):
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return NotImplemented
        return self._combine(other, float(other) / float(self))

    def __neg__(self):
        return Measured(-float(self), self.noise)

    def __abs__(self):
        return Measured(abs(float(self)), self.noise)


def relative_noise(values) -> float | None:
    """``1.4826 * MAD / |median|`` of ``values`` (None for fewer than two values or a zero median)."""
    values = [float(v) for v in values]
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    if middle == 0:
        return None
    mad = statistics.median(abs(v - middle) for v in values)
    return _MAD_TO_SIGMA * mad / abs(middle)


def summarize(values) -> Measured:
    """The median of ``values`` as a :class:`Measured` carrying their relative spread."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("values must not be empty")
    return Measured(statistics.median(values), relative_noise(values))


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> Measured:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs.

    A :class:`Measured` float: its ``noise`` is the repeats' relative spread.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return summarize(times)


def copy_time(x: torch.Tensor, repeats: int = 5) -> Measured:
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

    Hands freed heap memory back to the kernel (glibc's ``malloc_trim``, and softmaxkit's
    cache of large outputs: otherwise a block freed by an earlier call stays resident and
    is reused unseen), resets the
    kernel's high-water mark (``/proc/self/clear_refs``), runs ``fn`` and reads ``VmHWM``
    minus the resident size before the call. Counts only touched pages, which is what a
    computation costs. On CUDA tensors use ``torch.cuda.max_memory_allocated``.
    """
    gc.collect()
    _release_free_heap()
    memory.empty_cache()
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


def _cpuinfo() -> dict:
    """Model name, physical cores and SIMD level from /proc/cpuinfo (empty where unreadable)."""
    info: dict = {}
    cores: set = set()
    physical = core = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and "model" not in info:
                    info["model"] = value
                elif key == "physical id":
                    physical = value
                elif key == "core id":
                    core = value
                    cores.add((physical, core))
                elif key == "flags" and "flags" not in info:
                    info["flags"] = set(value.split())
    except OSError:
        pass
    if cores:
        info["cores"] = len(cores)
    return info


def simd_level(flags) -> str:
    """The widest x86 vector extension in ``flags``: "avx512f", "avx2", "avx", "sse2" or "none known"."""
    for level in ("avx512f", "avx2", "avx", "sse2"):
        if level in flags:
            return level
    return "none known"


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"
    except Exception as err:  # a broken install still names itself
        return f"unusable ({type(err).__name__})"


def gpu_description() -> str:
    """Name, memory and CUDA version of CUDA device 0, or "none" without CUDA."""
    if not torch.cuda.is_available():
        return "none"
    props = torch.cuda.get_device_properties(0)
    count = torch.cuda.device_count()
    return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
            + (f" ({count} devices; device 0 used)" if count > 1 else ""))


def machine_header() -> dict:
    """The machine a run measured: CPU model, physical cores, logical CPUs (all and usable),
    torch threads, SIMD level, GPU, and the versions of Python, torch, numba, triton and numpy.

    Keys ``cpu``, ``threads`` (torch intra-op threads), ``torch`` and ``numba`` keep their
    meaning across versions (bench notes and older results.json files use them).
    """
    import os
    import platform

    import numpy

    info = _cpuinfo()
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpu": info.get("model") or platform.processor() or platform.machine(),
        "cores": info.get("cores", os.cpu_count()), "logical cpus": os.cpu_count(), "usable cpus": usable,
        "threads": torch.get_num_threads(), "simd": simd_level(info.get("flags", ())),
        "gpu": gpu_description(),
        "torch": torch.__version__, "numba": _version("numba"), "triton": _version("triton"),
        "numpy": numpy.__version__, "python": platform.python_version(), "os": platform.platform(),
    }
