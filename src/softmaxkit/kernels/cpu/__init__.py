"""numba CPU kernels: softmax family, fused softmax + top-k, sparsemax and entmax.

The kernels work on C-contiguous float32 / float64 arrays along the last axis, run in
parallel over rows with as many threads as ``torch.get_num_threads()`` (capped by
numba's pool size), and are compiled on first use and cached on disk
(``cache=True``). Use them through :mod:`softmaxkit.kernels.dispatch`, which decides
when they apply; :mod:`.functions` holds the autograd-aware entry points.
"""

from __future__ import annotations

import numba
import torch


def sync_threads() -> int:
    """Make numba use ``torch.get_num_threads()`` threads (at most numba's pool size)."""
    n = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    return n
