"""Large CPU outputs backed by transparent huge pages.

A fresh CPU tensor of more than 32 MiB is a fresh ``mmap`` (glibc maps every allocation
above its largest threshold on its own, and unmaps it when freed), so writing it the
first time takes one page fault per 4 KiB page. For a memory-bound op such as a softmax
that is most of the time: ``torch.softmax`` at 4096 x 32768 float32 spends about two
thirds of its time in page faults on our 2-core benchmark machine. torch's own switch,
``THP_MEM_ALLOC_ENABLE=1``, backs large allocations with 2 MiB transparent huge pages
(512 times fewer faults), but it is read once, when the process starts.

:func:`empty` gives the same gain to softmaxkit's own outputs, whatever the environment:
it allocates with ``torch.empty`` and, before anything touches the memory, asks the kernel
(``madvise(MADV_HUGEPAGE)``) to back the 2 MiB-aligned part of the range with huge pages.
Where the system does not offer huge pages (not Linux, THP ``never``), or for smaller
tensors, it is plain ``torch.empty``.

Huge pages still cost a fault and the kernel's zeroing of each 2 MiB page on every call
(softmax at 256 x 32768 float32: 5.1 ms, of which 2.6 ms is writing the output: the rest
is the fresh memory). So outputs of :data:`CACHE_MIN_BYTES` and more come from a cache of
blocks, as PyTorch's CUDA allocator does on the GPU: a block whose tensor (and every view
of it) is gone goes back to the cache, and the next output of the same size (rounded up
to 2 MiB) reuses it, already faulted in. The cache keeps at most :func:`cache_limit`
bytes of unused blocks (the least recently freed go first); :func:`empty_cache` gives
them back to the system, ``SOFTMAXKIT_CPU_CACHE_BYTES=0`` (read at import) or
:func:`set_cache_limit` turns it off. A cached output's storage cannot grow
(``resize_`` to a larger size raises, as for a tensor from ``torch.from_numpy``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import weakref

import torch

#: Bytes from which an output is backed by huge pages: glibc's largest mmap threshold
#: (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit), above which every allocation is a fresh
#: mapping. Smaller allocations are usually reused from the heap, already faulted in.
MIN_BYTES = 32 << 20
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


@functools.cache
def _madvise():
    """libc's ``madvise`` when transparent huge pages can be asked for, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return None
    if "[madvise]" not in mode and "[always]" not in mode:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: torch.Tensor, min_bytes: int | None = None) -> bool:
    """Ask that the untouched memory of ``t`` (a fresh CPU tensor of at least ``min_bytes``,
    default :data:`MIN_BYTES`) be backed by huge pages; whether the system took the advice.
    Only the 2 MiB-aligned pages inside ``t`` are advised, so memory that other tensors
    share is never affected; advising twice, or a failed call, changes nothing."""
    nbytes = t.numel() * t.element_size()
    if nbytes < (MIN_BYTES if min_bytes is None else min_bytes) or not t.is_cpu:
        return False
    madvise = _madvise()
    if madvise is None:
        return False
    start = t.data_ptr()
    low = -(-start // HUGE_PAGE) * HUGE_PAGE
    high = (start + nbytes) // HUGE_PAGE * HUGE_PAGE
    return high > low and madvise(low, high - low, _MADV_HUGEPAGE) == 0


# ---- the cache of large blocks ------------------------------------------------------------

#: Bytes from which an output comes from the cache (a block rounded up to :data:`HUGE_PAGE`).
#: Below it glibc reuses freed memory from its heap, already faulted in.
CACHE_MIN_BYTES = 32 << 20


def _default_limit() -> int:
    """``SOFTMAXKIT_CPU_CACHE_BYTES`` when set, else a sixteenth of the physical memory, at
    most 1 GiB (a forward and backward of a 512 MiB softmax output)."""
    setting = os.environ.get("SOFTMAXKIT_CPU_CACHE_BYTES")
    if setting is not None:
        try:
            return max(0, int(setting))
        except ValueError:
            raise ValueError(f"SOFTMAXKIT_CPU_CACHE_BYTES must be a whole number of bytes, got {setting!r}") from None
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 16 << 30
    return min(1 << 30, physical // 16)


class _BlockCache:
    """Unused blocks by size, least recently freed first. A block is a 2 MiB-aligned numpy
    byte array over memory torch allocated (advised for huge pages once, when made); a tensor
    handed out has the storage of ``torch.from_numpy`` of a slice of it, and a finalizer on
    that slice returns the block when torch frees the storage (after the last tensor on it is
    gone)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.free: list = []   # blocks, oldest first
        self.free_bytes = 0
        self.lock = threading.RLock()   # (re-entrant: a release can run inside a take, from a decref)

    def take(self, nbytes: int):
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        with self.lock:
            for i in range(len(self.free) - 1, -1, -1):   # the most recently freed first: warmest
                if self.free[i].nbytes == size:
                    block = self.free.pop(i)
                    self.free_bytes -= size
                    return block
        owner = torch.empty(size + HUGE_PAGE, dtype=torch.uint8).numpy()
        start = -owner.ctypes.data % HUGE_PAGE
        block = owner[start:start + size]
        if _madvise() is not None:
            _madvise()(block.ctypes.data, size, _MADV_HUGEPAGE)
        return block

    def give_back(self, block) -> None:
        with self.lock:
            if block.nbytes > self.limit:
                return
            self.free.append(block)
            self.free_bytes += block.nbytes
            self.trim()

    def trim(self) -> None:
        """Drop the oldest unused blocks until at most :attr:`limit` bytes are kept."""
        with self.lock:
            while self.free_bytes > self.limit:
                self.free_bytes -= self.free.pop(0).nbytes

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.free_bytes = 0


_CACHE = _BlockCache(_default_limit())
if hasattr(os, "register_at_fork"):   # (a lock another thread held at the fork stays held in the child)
    os.register_at_fork(after_in_child=lambda: setattr(_CACHE, "lock", threading.RLock()))


def _from_cache(shape, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    block = _CACHE.take(nbytes)
    view = block[:nbytes]
    weakref.finalize(view, _CACHE.give_back, block).atexit = False
    # (set_, not .view(dtype).view(shape): a view would have a base, and autograd refuses an
    # in-place op on a view that a custom Function returns)
    return torch.empty(0, dtype=dtype).set_(torch.from_numpy(view).untyped_storage(), 0, shape)  # type: ignore[call-overload]  # (an untyped storage: torch takes it)


def cache_limit() -> int:
    """Bytes of unused blocks the cache of large CPU outputs keeps at most."""
    return _CACHE.limit


def set_cache_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` of unused large-output blocks (0: none, every large output a
    fresh allocation); blocks over the new limit are given back at once."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    with _CACHE.lock:
        _CACHE.limit = nbytes
        _CACHE.trim()


def cached_bytes() -> int:
    """Bytes held in unused blocks by the cache of large CPU outputs."""
    return _CACHE.free_bytes


def empty_cache() -> None:
    """Give the cache's unused blocks back to the system (tensors in use keep theirs)."""
    _CACHE.clear()


def empty(shape, dtype: torch.dtype, min_bytes: int | None = None) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)`` on the CPU, backed by huge pages from ``min_bytes``
    (default :data:`MIN_BYTES`; a buffer that will be written whole can ask from
    :data:`HUGE_PAGE` on); from :data:`CACHE_MIN_BYTES` a block of the cache."""
    shape = torch.Size(shape) if not isinstance(shape, int) else torch.Size((shape,))
    nbytes = shape.numel() * dtype.itemsize
    if nbytes >= CACHE_MIN_BYTES and _CACHE.limit:
        return _from_cache(shape, dtype, nbytes)
    t = torch.empty(shape, dtype=dtype)
    advise_huge_pages(t, min_bytes)
    return t


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A contiguous :func:`empty` of ``x``'s shape, dtype and device (huge pages on the CPU).
    (``torch.empty_like`` costs 1.9 us a call, ``torch.empty(shape, dtype=...)`` 4.5 us: on a
    small softmax's path the difference is a few percent.)"""
    if x.is_cpu and x.numel() * x.element_size() >= CACHE_MIN_BYTES and _CACHE.limit and x.layout is torch.strided:
        return _from_cache(x.shape, x.dtype, x.numel() * x.element_size())
    t = torch.empty_like(x) if x.is_contiguous() else torch.empty_like(x, memory_format=torch.contiguous_format)
    if t.numel() * t.element_size() >= MIN_BYTES:
        advise_huge_pages(t)
    return t
