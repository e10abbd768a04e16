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
"""

from __future__ import annotations

import ctypes
import functools
import sys

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


def empty(shape, dtype: torch.dtype, min_bytes: int | None = None) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)`` on the CPU, backed by huge pages from ``min_bytes``
    (default :data:`MIN_BYTES`; a buffer that will be written whole can ask from
    :data:`HUGE_PAGE` on)."""
    t = torch.empty(shape, dtype=dtype)
    advise_huge_pages(t, min_bytes)
    return t


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A contiguous :func:`empty` of ``x``'s shape, dtype and device (huge pages on the CPU).
    (``torch.empty_like`` costs 1.9 us a call, ``torch.empty(shape, dtype=...)`` 4.5 us: on a
    small softmax's path the difference is a few percent.)"""
    t = torch.empty_like(x) if x.is_contiguous() else torch.empty_like(x, memory_format=torch.contiguous_format)
    if t.numel() * t.element_size() >= MIN_BYTES:
        advise_huge_pages(t)
    return t
