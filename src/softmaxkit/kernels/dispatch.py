"""The one place that decides which backend computes an op: reference, aten, numba or Triton.

Public functions call :func:`run` with their reference implementation::

    return dispatch.run("softmax", _softmax_reference, x, dim, mask, temperature=temperature)

``reference`` is a callable with the public signature ``reference(x, dim=..., mask=...,
**params)``; it is used when no faster path applies and for the rows a kernel flags.

Kernel protocol: a kernel returns its output and a bool tensor of the rows it did not
compute (``x.shape[:-1]``); :func:`run` recomputes exactly those rows with ``reference``
and splices them in (differentiably). A kernel never returns unwritten memory: rows it
did not finish, for any reason, are flagged (see :mod:`softmaxkit.kernels.cpu`).

Backends (:func:`use_backend`):

* ``"reference"``: always the plain-PyTorch definition.
* ``"numba"``: the CPU kernels for every input they cover (CPU tensor, float32 or
  float64, C-contiguous, normalised along the last axis, no ``mask`` except for sparsemax
  and entmax, whose kernels take a bool mask as ``-inf`` scores; op-specific parameters
  such as a float temperature, see :func:`plan`), whatever its size.
* ``"triton"``: the GPU kernels (softmax and log-softmax, forward and backward) for CUDA
  inputs when Triton is importable.
* ``"auto"`` (default): for ``softmax`` / ``log_softmax`` / ``logsumexp``, the numba
  kernel only where it measurably beats aten (:data:`NUMBA_WINS`, measured per op,
  dtype, forward or forward+backward, row-length class and thread count), aten
  (``torch.softmax`` / ``log_softmax`` / ``logsumexp``, masks applied with
  ``masked_fill``, rows aten does not define as the reference does recomputed by it)
  otherwise, so that ``sk.softmax`` is never measurably slower than ``torch.softmax``.
  On CUDA these three ops take aten: the Triton kernels lost to it in every cell of the
  dispatch grid on an H200 (1.4-7x; ``softmaxkit bench dispatch --device cuda``).
  For the ops without an aten equivalent (sparsemax, entmax, fused top-k) numba for
  covered CPU inputs of at least :data:`AUTO_MIN_NUMEL` elements, the reference otherwise.

The choice is a context variable: it is per thread (and per asyncio task), and
``use_backend`` blocks nest, the innermost winning.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.autograd import forward_ad

from .._checks import (
    backward_in_torch_ops,
    dispatch_modes,
    has_no_data,
    is_functorch_wrapped,
    transforms_active,
    under_transform,
)
from . import memory
from .cpu._intrinsics import CPU_VENDOR, VECTOR_ISA
from .temperature import times_inverse_temperature

BACKENDS = ("reference", "numba", "triton", "auto")
OPS = ("softmax", "log_softmax", "logsumexp", "sparsemax", "entmax15", "entmax", "softmax_topk",
       "log_softmax_topk")
SOFTMAX_ALGORITHMS = ("three_pass", "two_pass", "online")

#: ``auto`` uses numba from this many elements on. The kernels beat the reference at
#: every size (measured: 73 us against 240 us for 64 elements, 175 us against 1.46 ms for
#: 65536), but the first call in a fresh environment compiles them (seconds, then cached
#: on disk); small calls stay on the reference so that toy use never pays that.
AUTO_MIN_NUMEL = 16384
#: ``auto`` takes a measured kernel win (:data:`NUMBA_WINS`) on two rows or more only from this
#: many elements: below, the kernel's parallel launch costs more than the faster loop saves.
#: A single row runs the serial kernel (no launch) and is left to the table's "one row" and
#: "one long row" cells. Measured 2026-12-03 (AVX2, the forward through
#: ``functions.forward_only``, 1 / 2 threads, kernel / torch): float32 softmax 1.13 / 1.41 at
#: 4 x 4096, 0.95 / 1.17 at 8 x 4096, 0.79 / 0.88 at 32 x 4096 and 128 x 1024 (log-softmax
#: within 0.05 of it); log-sum-exp 0.6-0.9 from 2 x 4096 on (aten's is five full-size ops).
KERNEL_MIN_NUMEL = {"softmax": 1 << 17, "log_softmax": 1 << 17, "logsumexp": 1 << 12}
#: entmax kernels cover alpha >= this (closer to 1 the reference's log1p form is used).
ENTMAX_MIN_ALPHA = 1.05


@dataclass(frozen=True)
class _Choice:
    backend: str = "auto"
    algorithm: str | None = None


_current: contextvars.ContextVar[_Choice] = contextvars.ContextVar("softmaxkit_backend", default=_Choice())


@contextlib.contextmanager
def use_backend(name: str, *, algorithm: str | None = None):
    """Use backend ``name`` for the ops called inside the ``with`` block.

    Args:
        name: ``"reference"``, ``"numba"``, ``"triton"`` or ``"auto"``.
        algorithm: for the numba softmax kernels, ``"three_pass"``, ``"two_pass"`` or
            ``"online"`` (Milakov & Gimelshein 2018, arXiv 1805.02867; Dukhan &
            Ablavatski 2020, arXiv 2001.04438); ``None`` keeps the default (the fastest
            in the kernel benchmark).

    Example::

        with sk.use_backend("reference"):
            p = sk.softmax(x)
    """
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {name!r}")
    if algorithm is not None and algorithm not in SOFTMAX_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(map(repr, SOFTMAX_ALGORITHMS))} or None; "
                         f"got {algorithm!r}")
    token = _current.set(_Choice(name, algorithm))
    try:
        yield name
    finally:
        _current.reset(token)


def current_backend() -> str:
    """The backend name in effect (``"auto"`` outside any :func:`use_backend` block)."""
    return _current.get().backend


@functools.cache
def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _traced(x) -> bool:
    """Whether ``x`` is seen through a transform (``torch.func.vmap`` / ``grad``, or
    ``torch.compile``; or a ``torch.func`` transform wraps another argument, a ``vmap`` over the
    mask alone): no data pointer to read and no data-dependent branch, so only the
    reference (plain PyTorch ops) applies. Also inside a forward-mode AD level
    (``torch.autograd.forward_ad.dual_level``): the kernels' autograd functions have no
    ``jvp`` (they raised, and the fused top-k dropped the tangent), the reference has one."""
    return (torch.compiler.is_compiling() or under_transform()
            or (isinstance(x, torch.Tensor) and (is_functorch_wrapped(x) or has_no_data(x))))


def _plain_last_axis(x, dim) -> bool:
    """A plain strided tensor, normalised along its (contiguous) last axis."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.is_nested or x.dim() == 0:
        return False
    if type(x) not in (torch.Tensor, torch.nn.Parameter):
        return False
    if _traced(x) or torch.jit.is_scripting():
        return False
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (-1, x.dim() - 1):
        return False
    return x.is_contiguous()


def _numba_covers(x, dim, mask, backend: str) -> bool:
    if mask is not None or not _plain_last_axis(x, dim) or not x.shape[-1]:
        return False   # (an empty normalised axis: the reference's empty result)
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if backend == "auto" and x.numel() < AUTO_MIN_NUMEL:
        return False
    return numba_available()


def _triton_covers(x, dim, mask) -> bool:
    return (mask is None and _plain_last_axis(x, dim) and x.device.type == "cuda"
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and triton_available())


def _plain_float(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ----------------------------------------------------------------------------------------
# measured crossovers: where a numba kernel beats aten
# ----------------------------------------------------------------------------------------

#: Shape classes of the crossover table, by what decides who wins: a single row (the
#: kernels parallelise over rows, aten inside one; a long one amortises the Python around
#: the kernel), short rows (per-row overhead), small inputs (fixed per-call cost) and the rest.
SHAPE_CLASSES = ("one row", "one long row", "short rows", "small", "large")
#: Rows shorter than this are "short rows"; inputs with fewer elements are "small".
SHORT_ROW = 512
SMALL_NUMEL = 1 << 21
#: A single row of at least this many entries is "one long row".
ONE_LONG_ROW = 1 << 14
#: A single row takes a kernel win only from this many entries, the shortest row the
#: crossovers measure (1 x 4096): shorter ones are unmeasured, and a toy call such as
#: ``sk.softmax(torch.tensor([1., 2., 3.]))`` must not load the compiled kernels (about a
#: second in a fresh process).
ONE_ROW_MIN = 1 << 12


#: Cells (op, dtype, pass, shape class, threads) where the numba kernel measurably beat
#: aten, per vector instruction set numba compiles for and whose cores run it
#: (:data:`VECTOR_ISA`, :data:`CPU_VENDOR`: the vendors' cores may run the same code at
#: different speeds, so a table is measured per vendor, though the AVX-512 cores of Intel
#: and AMD gave one table); everywhere else ``auto`` calls aten. A cell is a win
#: when, over the shapes of the class in the dispatch benchmark's grid, the median of kernel
#: time / torch time is <= :data:`WIN_MEDIAN` and none is above :data:`WIN_WORST` (each
#: side's fastest interleaved round, in shuffled order).
#: ``pass`` is ``"fwd"`` when no gradient is recorded, ``"fwd+bwd"`` when ``x`` requires
#: grad under grad mode. Thread counts not listed (not measured) use aten, and so does
#: every cell on an instruction set with no table (``"other"``); a vendor with no table of
#: its instruction set uses the other vendor's (:func:`wins_for_cpu`). Each table is printed by
#:   ``python -m softmaxkit.bench.dispatch --crossovers --threads 1 2 [--runs 2]``
#: on a machine of its kind.
#:
#: AVX-512 (Intel and AMD): measured 2026-12-03 on the shared 2-core development machine of
#: that day (AMD EPYC, Zen 4: ``znver4``; torch 2.13.0+cpu, numba 0.68.1), 1 and 2 threads, the
#: whole grid twice with ``--runs 2`` (four runs pooled, each shape's ratio the median of its
#: runs), each side as ``auto`` runs it (as for the AVX2 table below). The Intel table of
#: that time chose aten for most of these cells, which made ``auto`` 1.1-3.5x slower than the
#: kernel here (65 of 144 dispatch cells within target). The kernels win every cell without a
#: gradient except float32 softmax on short rows (1.02) and float32 log-softmax on short
#: rows on one thread (0.99): single rows 0.63-0.76 (log-sum-exp 0.25-0.46), small inputs
#: 0.72-0.84, short float64 rows 0.64-0.80, large inputs 0.89-0.92 (softmax float32: the
#: attention shapes 0.87-0.89, the vocabulary rows 0.97-1.08). With a gradient they win
#: short float64 rows (0.77-0.86), small inputs (0.89-0.95) and log-sum-exp everywhere
#: but single rows; they lose single rows (the autograd Function, 1.07-2.1) and are within
#: 5% of aten elsewhere. Log-softmax with a gradient on float32 "large" inputs is kept by
#: hand as in the AVX2 table: outputs of 32 MiB and more take the kernel on both sides of
#: the measurement, and the two smaller shapes measured 0.84-0.94. Float32 log-softmax on
#: short rows on two threads was dropped on 2026-12-04: two dispatch grids and a hot loop
#: that day put the kernel 1.13-1.30 over aten on both attention shapes of 128 columns. Later
#: that day the row kernel lost its per-row calls (``_normalize_row``, the three-pass row and
#: the backward row inlined into the row loop, the short row's finiteness checked after its
#: pass): a row of 128 float32 entries took 0.93 ms of aten's 1.39 at 16 x 8 x 128 x 128 (it
#: took 1.52), and a crossover run (``--crossovers --threads 1 2``) put float32 softmax and
#: log-softmax on short rows at 0.59-0.73 of aten without a gradient and 0.73-0.81 with one,
#: on both thread counts: those eight cells were added, the others kept from the pooled runs.
#: The cells with a gradient were measured again at 09:43 UTC the same day (``--passes fwd+bwd
#: --runs 2 --threads 1 2``), each side's fastest round (the medians had moved identical calls
#: by up to 23%): the faster row kernel now wins float32 softmax on large inputs (0.72-0.99 of
#: aten on every shape, both thread counts) and on small ones on two threads, float64 softmax
#: on large inputs on one thread (median 0.94, worst 1.13) and float64 softmax and
#: log-softmax on small inputs on two threads. Kept by hand: float32 log-softmax on large
#: inputs on two threads (0.73-1.05, median 0.99) and float64 softmax on large inputs on two
#: threads, which the rule dropped for 1.13-1.18 at 256 x 32768 (median 0.93): the dispatch
#: grid without it ran the three attention shapes 1.10-1.13 over the kernel, and timed alone
#: 256 x 32768 took 17.9-19.9 ms in the kernel and 18.4-19.9 in aten. And float64
#: log-softmax on large inputs, both thread counts, as float32's: outputs of 32 MiB and more
#: run the kernel on both sides (0.98-1.03), and below, where the aten lane adds a pass that
#: looks for ``-inf`` outputs, the kernel took 0.90-0.93 of it (32 x 128256: aten's lane
#: 8.1-8.7 ms against torch's 7.2-7.4, the kernel 7.5-7.8). At 10:06 UTC, after log-sum-exp
#: with a gradient got the lane's own kernel Function (:class:`_KernelLogSumExp`: it took the
#: full numba path before, 2.2 times aten on one row), one more run with a gradient added
#: log-sum-exp on single rows (0.56-0.72 of aten's lane, both dtypes and thread counts); the
#: float32 log-softmax and float64 softmax cells on large inputs on one thread it missed
#: (0.99 and 0.96 medians there) are kept from the runs before.
#: Intel: measured again on 2026-12-04 at 11:25-11:33 UTC on that day's Intel Xeon (AVX-512
#: with AMX; torch 2.13.0+cpu, numba 0.68.1), the whole grid (``--runs 2``) and the cells
#: with a gradient once more (``--passes fwd+bwd --runs 2``), pooled. The table measured on
#: Intel's cores on 2026-12-01, before the row kernel lost its per-row calls and the lanes
#: their extra passes, sent 24 cells to the kernel: the dispatch grid put ``auto`` at 1.1-2.9
#: times the kernel in 82 of 144 cells. The rule's wins there were this table's cells less
#: six, all kept here by hand: log-softmax with a gradient on large inputs (float32 medians
#: 0.96-0.99, worst 1.02; float64 0.99, worst 1.02) and float64 log-softmax with a gradient
#: on small inputs on two threads (0.96, worst 0.99), where the kernel is no slower than the
#: aten lane and the lane's extra pass makes the kernel the faster against bare torch. The
#: two vendors' cores give the same table, so it serves both.
_WINS_AVX512 = frozenset({
    ('log_softmax', 'float32', 'fwd', 'large', 1),
    ('log_softmax', 'float32', 'fwd', 'large', 2),
    ('log_softmax', 'float32', 'fwd', 'one long row', 1),
    ('log_softmax', 'float32', 'fwd', 'one long row', 2),
    ('log_softmax', 'float32', 'fwd', 'one row', 1),
    ('log_softmax', 'float32', 'fwd', 'one row', 2),
    ('log_softmax', 'float32', 'fwd', 'short rows', 1),
    ('log_softmax', 'float32', 'fwd', 'short rows', 2),
    ('log_softmax', 'float32', 'fwd', 'small', 1),
    ('log_softmax', 'float32', 'fwd', 'small', 2),
    ('log_softmax', 'float32', 'fwd+bwd', 'large', 1),
    ('log_softmax', 'float32', 'fwd+bwd', 'large', 2),
    ('log_softmax', 'float32', 'fwd+bwd', 'short rows', 1),
    ('log_softmax', 'float32', 'fwd+bwd', 'short rows', 2),
    ('log_softmax', 'float32', 'fwd+bwd', 'small', 1),
    ('log_softmax', 'float32', 'fwd+bwd', 'small', 2),
    ('log_softmax', 'float64', 'fwd', 'large', 1),
    ('log_softmax', 'float64', 'fwd', 'large', 2),
    ('log_softmax', 'float64', 'fwd', 'one long row', 1),
    ('log_softmax', 'float64', 'fwd', 'one long row', 2),
    ('log_softmax', 'float64', 'fwd', 'one row', 1),
    ('log_softmax', 'float64', 'fwd', 'one row', 2),
    ('log_softmax', 'float64', 'fwd', 'short rows', 1),
    ('log_softmax', 'float64', 'fwd', 'short rows', 2),
    ('log_softmax', 'float64', 'fwd', 'small', 1),
    ('log_softmax', 'float64', 'fwd', 'small', 2),
    ('log_softmax', 'float64', 'fwd+bwd', 'large', 1),
    ('log_softmax', 'float64', 'fwd+bwd', 'large', 2),
    ('log_softmax', 'float64', 'fwd+bwd', 'short rows', 1),
    ('log_softmax', 'float64', 'fwd+bwd', 'short rows', 2),
    ('log_softmax', 'float64', 'fwd+bwd', 'small', 1),
    ('log_softmax', 'float64', 'fwd+bwd', 'small', 2),
    ('logsumexp', 'float32', 'fwd', 'large', 1),
    ('logsumexp', 'float32', 'fwd', 'large', 2),
    ('logsumexp', 'float32', 'fwd', 'one long row', 1),
    ('logsumexp', 'float32', 'fwd', 'one long row', 2),
    ('logsumexp', 'float32', 'fwd', 'one row', 1),
    ('logsumexp', 'float32', 'fwd', 'one row', 2),
    ('logsumexp', 'float32', 'fwd', 'short rows', 1),
    ('logsumexp', 'float32', 'fwd', 'short rows', 2),
    ('logsumexp', 'float32', 'fwd', 'small', 1),
    ('logsumexp', 'float32', 'fwd', 'small', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'large', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'large', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'one long row', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'one long row', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'one row', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'one row', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'short rows', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'short rows', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'small', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'small', 2),
    ('logsumexp', 'float64', 'fwd', 'large', 1),
    ('logsumexp', 'float64', 'fwd', 'large', 2),
    ('logsumexp', 'float64', 'fwd', 'one long row', 1),
    ('logsumexp', 'float64', 'fwd', 'one long row', 2),
    ('logsumexp', 'float64', 'fwd', 'one row', 1),
    ('logsumexp', 'float64', 'fwd', 'one row', 2),
    ('logsumexp', 'float64', 'fwd', 'short rows', 1),
    ('logsumexp', 'float64', 'fwd', 'short rows', 2),
    ('logsumexp', 'float64', 'fwd', 'small', 1),
    ('logsumexp', 'float64', 'fwd', 'small', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'large', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'large', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'one long row', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'one long row', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'one row', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'one row', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'short rows', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'short rows', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'small', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'small', 2),
    ('softmax', 'float32', 'fwd', 'large', 1),
    ('softmax', 'float32', 'fwd', 'large', 2),
    ('softmax', 'float32', 'fwd', 'one long row', 1),
    ('softmax', 'float32', 'fwd', 'one long row', 2),
    ('softmax', 'float32', 'fwd', 'one row', 1),
    ('softmax', 'float32', 'fwd', 'one row', 2),
    ('softmax', 'float32', 'fwd', 'short rows', 1),
    ('softmax', 'float32', 'fwd', 'short rows', 2),
    ('softmax', 'float32', 'fwd', 'small', 1),
    ('softmax', 'float32', 'fwd', 'small', 2),
    ('softmax', 'float32', 'fwd+bwd', 'large', 1),
    ('softmax', 'float32', 'fwd+bwd', 'large', 2),
    ('softmax', 'float32', 'fwd+bwd', 'short rows', 1),
    ('softmax', 'float32', 'fwd+bwd', 'short rows', 2),
    ('softmax', 'float32', 'fwd+bwd', 'small', 1),
    ('softmax', 'float32', 'fwd+bwd', 'small', 2),
    ('softmax', 'float64', 'fwd', 'large', 1),
    ('softmax', 'float64', 'fwd', 'large', 2),
    ('softmax', 'float64', 'fwd', 'one long row', 1),
    ('softmax', 'float64', 'fwd', 'one long row', 2),
    ('softmax', 'float64', 'fwd', 'one row', 1),
    ('softmax', 'float64', 'fwd', 'one row', 2),
    ('softmax', 'float64', 'fwd', 'short rows', 1),
    ('softmax', 'float64', 'fwd', 'short rows', 2),
    ('softmax', 'float64', 'fwd', 'small', 1),
    ('softmax', 'float64', 'fwd', 'small', 2),
    ('softmax', 'float64', 'fwd+bwd', 'large', 1),
    ('softmax', 'float64', 'fwd+bwd', 'large', 2),
    ('softmax', 'float64', 'fwd+bwd', 'short rows', 1),
    ('softmax', 'float64', 'fwd+bwd', 'short rows', 2),
    ('softmax', 'float64', 'fwd+bwd', 'small', 1),
    ('softmax', 'float64', 'fwd+bwd', 'small', 2),
})

#: AVX2, AMD: measured 2026-12-03 on the shared 2-core development machine of that day (AMD
#: EPYC, AVX2 and FMA, no AVX-512; torch 2.13.0+cpu, numba 0.68.1), 1 and 2 threads, two
#: runs pooled as ``--runs 2`` pools them (each shape's ratio the median of its runs), each
#: side as ``auto`` runs it: the kernel's forward through ``functions.forward_only`` (which
#: hands the kernel the tensors' addresses: about 4 us of Python a call, not 12), aten
#: through ``auto`` with no kernel win (its output check, and huge pages on outputs of 32 MiB
#: and more). Earlier tables timed bare ``torch.softmax``, whose large fresh outputs fault in
#: every 4 KiB page: against that the kernels "won" large float64 inputs (0.66-0.75) that
#: aten on huge pages runs as fast. On 256-bit vectors, with the three-pass algorithm
#: (:data:`softmaxkit.kernels.cpu.functions.DEFAULT_ALGORITHM`), the kernels win large
#: float32 inputs, single rows (the serial kernel against aten's one-thread row and the
#: lane's checks), and log-sum-exp almost everywhere without a gradient (aten's is five ops).
#: With a gradient they win on large float32 inputs only: on smaller ones the autograd
#: Function around the kernel costs more than the faster loops save. The softmax and
#: log-softmax cells with a gradient were re-measured the same day with the kernel as the
#: lane now runs it (``_KernelSoftmax``: the forward above and the one-pass backward, no
#: per-row flags), kernel / aten medians 0.83-0.93 on large float32 inputs (one cell each,
#: log-softmax 1 thread and softmax 2 threads, at 0.91-0.98 in that run and kept from the
#: first), 0.95-1.08 elsewhere. Re-measured at 14:25-14:43 UTC the same day, after the
#: kernel's backward took the tensors' addresses and the log-softmax lane's two passes became
#: one: the whole grid (``--runs 2``) and the cells with a gradient once more (``--passes
#: fwd+bwd --runs 2``), pooled, under the rule of 0.95 / 1.10 (it was 0.9 / 1.15, which left
#: with aten cells where the kernel took 0.90-0.95 of the aten lane's time; the lane's checks
#: make aten 5-10% slower than bare torch there, so a 5% win of the kernel is the faster
#: path for the dispatch grid's target). New wins: short rows without a gradient on two
#: threads (softmax 0.90-0.95, log-softmax 0.85-0.91, float64 log-softmax 0.84-0.96), small
#: float32 inputs with a gradient (softmax 0.85-0.96, log-softmax 0.81-0.94), log-sum-exp
#: with a gradient on short rows. Log-softmax with a gradient on float32 "large" inputs is
#: kept: outputs of 32 MiB and more take the kernel on both sides of the measurement (1.0),
#: the three smaller shapes measured 0.72-0.84.
_WINS_AVX2_AMD = frozenset({
    ('log_softmax', 'float32', 'fwd', 'large', 1),
    ('log_softmax', 'float32', 'fwd', 'large', 2),
    ('log_softmax', 'float32', 'fwd', 'one long row', 1),
    ('log_softmax', 'float32', 'fwd', 'one long row', 2),
    ('log_softmax', 'float32', 'fwd', 'one row', 1),
    ('log_softmax', 'float32', 'fwd', 'one row', 2),
    ('log_softmax', 'float32', 'fwd', 'short rows', 1),
    ('log_softmax', 'float32', 'fwd', 'short rows', 2),
    ('log_softmax', 'float32', 'fwd', 'small', 1),
    ('log_softmax', 'float32', 'fwd', 'small', 2),
    ('log_softmax', 'float32', 'fwd+bwd', 'large', 1),
    ('log_softmax', 'float32', 'fwd+bwd', 'large', 2),
    ('log_softmax', 'float32', 'fwd+bwd', 'small', 1),
    ('log_softmax', 'float32', 'fwd+bwd', 'small', 2),
    ('log_softmax', 'float64', 'fwd', 'one row', 1),
    ('log_softmax', 'float64', 'fwd', 'one row', 2),
    ('log_softmax', 'float64', 'fwd', 'short rows', 1),
    ('log_softmax', 'float64', 'fwd', 'short rows', 2),
    ('logsumexp', 'float32', 'fwd', 'large', 1),
    ('logsumexp', 'float32', 'fwd', 'large', 2),
    ('logsumexp', 'float32', 'fwd', 'one long row', 1),
    ('logsumexp', 'float32', 'fwd', 'one long row', 2),
    ('logsumexp', 'float32', 'fwd', 'one row', 1),
    ('logsumexp', 'float32', 'fwd', 'one row', 2),
    ('logsumexp', 'float32', 'fwd', 'short rows', 1),
    ('logsumexp', 'float32', 'fwd', 'short rows', 2),
    ('logsumexp', 'float32', 'fwd', 'small', 1),
    ('logsumexp', 'float32', 'fwd', 'small', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'large', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'large', 2),
    ('logsumexp', 'float32', 'fwd+bwd', 'short rows', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'small', 1),
    ('logsumexp', 'float32', 'fwd+bwd', 'small', 2),
    ('logsumexp', 'float64', 'fwd', 'large', 1),
    ('logsumexp', 'float64', 'fwd', 'large', 2),
    ('logsumexp', 'float64', 'fwd', 'one long row', 1),
    ('logsumexp', 'float64', 'fwd', 'one long row', 2),
    ('logsumexp', 'float64', 'fwd', 'one row', 1),
    ('logsumexp', 'float64', 'fwd', 'one row', 2),
    ('logsumexp', 'float64', 'fwd', 'short rows', 1),
    ('logsumexp', 'float64', 'fwd', 'short rows', 2),
    ('logsumexp', 'float64', 'fwd', 'small', 1),
    ('logsumexp', 'float64', 'fwd', 'small', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'large', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'large', 2),
    ('logsumexp', 'float64', 'fwd+bwd', 'short rows', 1),
    ('logsumexp', 'float64', 'fwd+bwd', 'short rows', 2),
    ('softmax', 'float32', 'fwd', 'large', 1),
    ('softmax', 'float32', 'fwd', 'large', 2),
    ('softmax', 'float32', 'fwd', 'one long row', 1),
    ('softmax', 'float32', 'fwd', 'one long row', 2),
    ('softmax', 'float32', 'fwd', 'one row', 1),
    ('softmax', 'float32', 'fwd', 'one row', 2),
    ('softmax', 'float32', 'fwd', 'short rows', 2),
    ('softmax', 'float32', 'fwd', 'small', 1),
    ('softmax', 'float32', 'fwd', 'small', 2),
    ('softmax', 'float32', 'fwd+bwd', 'large', 1),
    ('softmax', 'float32', 'fwd+bwd', 'large', 2),
    ('softmax', 'float32', 'fwd+bwd', 'small', 1),
    ('softmax', 'float32', 'fwd+bwd', 'small', 2),
    ('softmax', 'float64', 'fwd', 'one row', 1),
    ('softmax', 'float64', 'fwd', 'one row', 2),
})
#: The measured tables by (vector instruction set, vendor).
WINS_BY_CPU = {("avx512", "intel"): _WINS_AVX512, ("avx512", "amd"): _WINS_AVX512,
               ("avx2", "amd"): _WINS_AVX2_AMD}


def wins_for_cpu(isa: str, vendor: str) -> frozenset:
    """The crossover table for a CPU with vector instruction set ``isa`` made by ``vendor``:
    its own where measured, else one measured with the same instruction set on the other
    vendor's cores (the closest guess), else none (``auto`` then always calls aten)."""
    own = WINS_BY_CPU.get((isa, vendor))
    if own is not None:
        return own
    return next((table for (i, _), table in WINS_BY_CPU.items() if i == isa), frozenset())


NUMBA_WINS = wins_for_cpu(VECTOR_ISA, CPU_VENDOR)
#: The rule that makes a crossover cell a win (see :data:`NUMBA_WINS`).
WIN_MEDIAN = 0.95
WIN_WORST = 1.10


#: float32 rows from this length go to the numba kernel whatever the table says, for
#: accuracy: aten's float32 softmax sums a row in one running sum (a row of 10**6 entries
#: summed to 1 +- 1.8e-4 on the AVX2 machine), the kernels per block of 2048 (4.6e-7).
LONG_FLOAT32_ROW = 1 << 18


def shape_class(rows: int, n: int) -> str:
    """The class (:data:`SHAPE_CLASSES`) of ``rows`` rows of ``n`` entries."""
    if rows <= 1:
        return "one long row" if n >= ONE_LONG_ROW else "one row"
    if n < SHORT_ROW:
        return "short rows"
    return "small" if rows * n < SMALL_NUMEL else "large"


_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


def _win_classes(table) -> dict:
    """:data:`NUMBA_WINS` as ``(op, dtype, wants grad, threads) -> shape classes``: the
    lookup the per-call check makes before it computes the shape class."""
    by_name = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
    out: dict = {}
    for op, dtype, pass_, cls, threads in table:
        out.setdefault((op, by_name[dtype], pass_ == "fwd+bwd", threads), set()).add(cls)
    return {key: frozenset(classes) for key, classes in out.items()}


_WIN_CLASSES = _win_classes(NUMBA_WINS)
#: Whether any cell of one row is a win, and the ops with a win on one long row: the lane
#: skips the lookup for single rows where there is none
_ONE_ROW_WINS = any(key[3] == "one row" for key in NUMBA_WINS)
_LONG_ROW_OPS = frozenset(key[0] for key in NUMBA_WINS if key[3] == "one long row")
_F32 = torch.float32


def _numba_wins(op, x, threads=None) -> bool:
    """Whether the numba kernel measurably beats aten for ``op`` on ``x`` (:data:`NUMBA_WINS`,
    or a float32 row of :data:`LONG_FLOAT32_ROW` entries or more)."""
    n = x.shape[-1]
    return _wins(op, x.dtype, x.numel() // n if n else 0, n, x.requires_grad and torch.is_grad_enabled(),
                 torch.get_num_threads() if threads is None else threads)


def _wins(op, dtype, rows, n, grad, threads) -> bool:
    """:func:`_numba_wins` on ``rows`` rows of ``n`` entries, ``grad``: a gradient is recorded."""
    if dtype is _F32 and n >= LONG_FLOAT32_ROW:
        return True
    if rows > 1 and rows * n < KERNEL_MIN_NUMEL.get(op, AUTO_MIN_NUMEL):   # the parallel launch costs more than the op
        return False
    if rows == 1 and n < ONE_ROW_MIN:   # not measured; and toy calls never load the kernels
        return False
    classes = _WIN_CLASSES.get((op, dtype, grad, threads))
    return classes is not None and shape_class(rows, n) in classes


# ----------------------------------------------------------------------------------------
# the plan and the run
# ----------------------------------------------------------------------------------------

_ATEN_OPS = ("softmax", "log_softmax", "logsumexp")
_TRITON_OPS = ("softmax", "log_softmax")
_NUMBA_DTYPES = (torch.float32, torch.float64)


def plan(op: str, x, dim=-1, mask=None, **params) -> str:
    """The backend :func:`run` uses for this call: ``"numba"``, ``"triton"``, ``"aten"`` or
    ``"reference"``. Inputs the caller has not validated are fine: anything unusual plans
    the reference, which then raises the proper error."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    if _traced(x):  # traced code runs the reference (dynamo cannot read a ContextVar)
        return "reference"
    backend = _current.get().backend
    if backend == "reference":
        return "reference"
    if backend == "auto" and op in _ATEN_OPS:
        # the common case first, with the fewest checks: aten unless numba measurably wins
        if (type(x) is torch.Tensor and mask is None and type(dim) is int and x.is_cpu
                and x.dtype in _NUMBA_DTYPES and _plain_params(op, params)):
            nd = x.dim()
            if nd and -nd <= dim < nd and x.layout is torch.strided and not x.is_nested:
                if _numba_wins(op, x) and _numba_covers(x, dim, None, backend):
                    return "numba"
                return "aten" if _aten_covers(op, x, dim, None, params) else "reference"
        if (NUMBA_WINS and type(x) is torch.Tensor and x.is_cpu and mask is None and x.dtype in _NUMBA_DTYPES
                and x.dim() and _numba_wins(op, x) and _numba_covers(x, dim, mask, backend)
                and _numba_params(op, x, params)):
            return "numba"
        return "aten" if _aten_covers(op, x, dim, mask, params) else "reference"
    # here backend is "numba" or "triton", or "auto" for an op without an aten equivalent
    if backend in ("numba", "auto") and _numba_covers(x, dim, mask, backend) and _numba_params(op, x, params):
        return "numba"
    if (backend in ("numba", "auto") and op in _SPARSE_OPS and mask is not None and _mask_broadcasts(mask, x)
            and _numba_covers(x, dim, None, backend) and _numba_params(op, x, params)):
        return "numba"   # the mask as -inf scores: hidden entries of the kernel
    if (backend == "triton" and op in _TRITON_OPS and _triton_covers(x, dim, mask)
            and _float_temperature(params)):
        return "triton"
    return "reference"


def run(op: str, reference: Callable, x, dim=-1, mask=None, **params):
    """Compute ``op`` on the backend :func:`plan` picks.

    Args:
        op: one of :data:`OPS`.
        reference: the op's reference, ``reference(x, dim=dim, mask=mask, **params)``;
            it computes the result when no faster path applies, and the rows a kernel
            (or aten) does not compute as the reference defines them.
        x, dim, mask, params: the public function's arguments.
    """
    if mask is None and op in _LANES:
        out = _LANES[op](x, dim, params)
        if out is not None:
            return out
    how = plan(op, x, dim, mask, **params)
    if how == "aten":
        return _run_aten(op, reference, x, dim, mask, params)
    if how == "numba":
        return _run_numba(op, reference, x, params, mask)
    if how == "triton":
        from .gpu import softmax as gpu_softmax
        return getattr(gpu_softmax, op)(x, temperature=float(params.get("temperature", 1.0)))
    return reference(x, dim=dim, mask=mask, **params)


# ----------------------------------------------------------------------------------------
# numba
# ----------------------------------------------------------------------------------------

def _plain_params(op, params) -> bool:
    if op == "logsumexp":
        return type(params.get("keepdim", False)) is bool
    t = params.get("temperature", 1.0)
    return type(t) in (float, int) and t == 1.0


from .gpu import TEMPERATURE_RANGE as _TRITON_TEMPERATURES  # noqa: E402  (no triton import)


def _float_temperature(params) -> bool:
    """A temperature the Triton softmax and aten take (a number whose reciprocal is a normal
    float32; beyond, the reference rounds ``x / T`` once)."""
    t = params.get("temperature", 1.0)
    if not _plain_float(t):
        return False
    return _TRITON_TEMPERATURES[0] <= t <= _TRITON_TEMPERATURES[1]


def _numba_params(op, x, params) -> bool:
    if op in ("softmax", "log_softmax"):
        return _float_temperature(params)
    if op == "logsumexp":
        return isinstance(params.get("keepdim", False), bool)
    if op in ("softmax_topk", "log_softmax_topk"):
        # the fused kernel has no backward; the reference keeps the graph
        return not (torch.is_grad_enabled() and x.requires_grad)
    if op == "entmax":
        return _entmax_alpha(x, params.get("alpha", 1.5)) is not None
    return True


def _run_numba(op, reference, x, params, mask=None):
    algorithm = _current.get().algorithm
    if op in _KERNEL_MODES and x.numel() and x.is_contiguous():
        t = float(params.get("temperature", 1.0))
        out = _kernel_forward(op, x, 1.0 / t, algorithm)
        if out is not None:
            return out.unsqueeze(-1) if params.get("keepdim", False) else out
    if op in ("softmax", "log_softmax"):
        from .cpu import functions
        fn = functions.softmax if op == "softmax" else functions.log_softmax
        out, todo = fn(x, temperature=float(params.get("temperature", 1.0)), algorithm=algorithm)
        out = _splice(out, todo, reference, x, params)
    elif op == "logsumexp":
        from .cpu import functions
        out, todo = functions.logsumexp(x, algorithm=algorithm)
        out = _splice(out, todo, reference, x, dict(params, keepdim=False))
        if params.get("keepdim", False):
            out = out.unsqueeze(-1)
    elif op in ("softmax_topk", "log_softmax_topk"):
        from .cpu import topk
        values, indices, todo = topk.softmax_topk(x, params["k"], log=op == "log_softmax_topk")
        out = _splice((values, indices), todo, reference, x, params)
    else:
        alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(op, params.get("alpha", 1.5))
        from .cpu import sparse_functions
        z = x if mask is None else x.masked_fill(~mask, float("-inf"))
        out, todo = sparse_functions.entmax(z, _entmax_alpha(x, alpha))
        out = _splice(out, todo, reference, x, params, mask)
    return out


def _row_params(params, x, rows):
    """Params restricted to the flagged rows: a per-row tensor (entmax alpha) is expanded
    to ``x.shape[:-1] + (1,)`` and indexed; numbers pass through."""
    out = {}
    for name, value in params.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            full = value.expand(x.shape[:-1] + (1,)) if value.dim() <= x.dim() else value
            value = full.reshape(-1, 1)[rows]
        out[name] = value
    return out


def _splice(out, todo, reference, x, params, mask=None):
    """``out`` (a tensor, or a tuple of tensors, with rows first) with the rows marked in
    ``todo`` recomputed by ``reference`` on the last axis (with their rows of ``mask``)."""
    if not bool(todo.any()):
        return out
    rows = todo.reshape(-1).nonzero().flatten()
    n = x.shape[-1]
    sub = x.reshape(-1, n)[rows]
    sub_mask = None if mask is None else mask.expand(x.shape).reshape(-1, n)[rows]
    ref = reference(sub, dim=-1, mask=sub_mask, **_row_params(params, x, rows))
    if isinstance(out, tuple):
        return tuple(_put_rows(o, r, rows, todo.numel()) for o, r in zip(out, ref))
    return _put_rows(out, ref, rows, todo.numel())


def _put_rows(out, ref, rows, count):
    flat = out.reshape(count, -1)
    flat = flat.index_put((rows,), ref.reshape(rows.numel(), -1).to(flat.dtype))
    return flat.reshape(out.shape)


# ----------------------------------------------------------------------------------------
# aten
# ----------------------------------------------------------------------------------------

_ATEN_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_SPARSE_OPS = ("sparsemax", "entmax15", "entmax")


def _mask_broadcasts(mask, x) -> bool:
    """``mask`` is a bool tensor on ``x``'s device that broadcasts to ``x``'s shape."""
    if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.device != x.device
            or mask.dim() > x.dim()):
        return False
    try:
        return torch.broadcast_shapes(mask.shape, x.shape) == x.shape
    except RuntimeError:
        return False


def _aten_covers(op, x, dim, mask, params) -> bool:
    if not isinstance(x, torch.Tensor) or x.dtype not in _ATEN_DTYPES or x.layout != torch.strided:
        return False
    nd = x.dim()
    if nd == 0 or type(dim) is not int or not -nd <= dim < nd or x.is_nested:
        return False
    if x.dtype == torch.float32 and x.shape[dim] >= LONG_FLOAT32_ROW:
        return False   # aten's one running float32 sum per row (see LONG_FLOAT32_ROW): 10x the reference's error
    if op == "logsumexp":
        if type(params.get("keepdim", False)) is not bool:
            return False
    elif params and not _float_temperature(params):   # a tensor temperature: the reference
        return False
    return mask is None or _mask_broadcasts(mask, x)


_CTYPES = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}


#: Rows from which the numba scan reads the first column (fewer: ctypes reads, no compile
#: for toy calls).
SCAN_MIN_ROWS = 5


def _first_column_has_nan(out, d, inf_too=False) -> bool:
    """Whether ``out`` has a NaN (with ``inf_too``, a NaN or an infinity) at index 0 along
    ``d``, read at the lowest fixed cost."""
    if out.is_cpu and out.dtype in _CTYPES:
        n = out.shape[d]
        rows = out.numel() // n
        last = d == out.dim() - 1 and out.is_contiguous()
        bad = math.isnan if not inf_too else (lambda v: not math.isfinite(v))
        if last and rows < SCAN_MIN_ROWS:   # a few rows: read their first elements in place
            read, size, base = _CTYPES[out.dtype].from_address, out.element_size() * n, out.data_ptr()
            return any(bad(read(base + r * size).value) for r in range(rows))
        if last and numba_available():
            return (_SCANS or _scans())[out.dtype](out, inf_too)
        first = out.detach().numpy()[(slice(None),) * d + (0,)]
        return bool((~np.isfinite(first) if inf_too else np.isnan(first)).any())
    first = out.narrow(d, 0, 1)
    return bool((~torch.isfinite(first) if inf_too else torch.isnan(first)).any())


def all_finite(out) -> bool:
    """Whether every entry of ``out`` is finite: read in place by a numba scan for a contiguous
    CPU float32 / float64 tensor, else from one ``aminmax`` reduction (NaN and infinities reach
    its extremes). ``torch.isfinite(t).all()`` makes four passes and two temporaries: ten to
    seventeen times the time (a 4 x 8 x 1024 x 64 float32 / bfloat16 tensor on the CPU)."""
    if out.is_cpu and out.dtype in _CTYPES:
        if out.numel() == 1:
            return math.isfinite(_CTYPES[out.dtype].from_address(out.data_ptr()).value)
        finite = (_SCANS or _scans()).get("all finite")
        if finite is not None:
            flat = out if out.is_contiguous() else _dense_memory(out)
            if flat is not None:
                return finite(flat)
    if not out.is_floating_point() or out.numel() == 0:
        return bool(torch.isfinite(out).all())
    low, high = torch.aminmax(out.detach())
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _dense_memory(t):
    """``t``'s entries as one contiguous run when they fill their memory with no gap (a
    permutation of a contiguous tensor: a transpose, a ``movedim``), else None."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return None
        expected *= size
    return t.as_strided((t.numel(),), (1,))


def _drop_grad_where(hidden, grad):
    """The incoming gradient with the entries at ``hidden`` dropped: an output that is a
    constant of its row (a ``-inf`` log-probability of a ``-inf`` score) passes no gradient,
    where aten's backward would pass ``g_j`` on and add it to every other entry's sum."""
    if grad is None:   # an undefined gradient (gradcheck's undefined-grad test) stays undefined
        return None
    return grad.masked_fill(hidden, 0)


def _minus_inf_scores(z):
    """Where the scores ``z`` are ``-inf``: the log-softmax entries that pass no gradient. Not
    where the output is ``-inf``: at a finite score whose ``z - max`` overflows (finfo.max
    beside finfo.min) the output is ``-inf`` too, but the reference passes its gradient and
    keeps it in the row's sum, as aten's backward does. Read when the hook is set, so an
    in-place change of ``z`` afterwards cannot move it."""
    return z.detach() == float("-inf")


class _LogSumExpGrad(torch.autograd.Function):
    """``torch.logsumexp`` with the gradient ``softmax(z)``, as the reference's.
    aten's backward is ``exp(z - lse)`` with the *rounded* ``lse``: a relative error of
    about ``|lse| * eps`` (4e-4 at |x| = 1e4 in float32; at a ``-1e9`` or ``finfo.min``
    fill, where ``lse`` rounds to the fill, every entry gets 1 instead of ``1 / n``)."""

    @staticmethod
    def forward(ctx, z, d, keepdim=True):
        ctx.save_for_backward(z)
        ctx.d = d
        ctx.keepdim = keepdim   # (here, not a squeeze after: a view of the output costs 7 us)
        return torch.logsumexp(z, d, keepdim=keepdim)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        if not ctx.keepdim:
            grad = grad.unsqueeze(ctx.d)
        if backward_in_torch_ops(grad):   # create_graph (a graph of the gradient), or batched gradients
            return _probs_times_grad(torch.softmax(z, ctx.d), grad, differentiable=True), None, None
        return _probs_times_grad(torch.softmax(z, ctx.d, out=memory.empty_like(z)), grad), None, None


def _probs_times_grad(p, grad, differentiable=False, finite=None):
    """Log-sum-exp's gradient ``p * grad`` (``p`` the softmax, ``grad`` broadcast along the
    normalised axis): an entry of probability 0 passes no incoming gradient, even an infinite
    or NaN one. In place on ``p`` unless ``differentiable`` (a graph of the gradient);
    ``finite``: whether ``grad`` is known to be finite (None: looked at)."""
    if differentiable or not (all_finite(grad) if finite is None else finite):
        return torch.where(p == 0, 0, p * grad)
    return p.mul_(grad)


def _aten_logsumexp(z, d):
    if z.requires_grad and torch.is_grad_enabled():
        return _LogSumExpGrad.apply(z, d)
    return torch.logsumexp(z, d, keepdim=True)


def _aten_op(op, z, d, scores=None):
    """aten's ``op`` of ``z`` along ``d`` with the reference's gradient; ``scores`` (default
    ``z``) tells log-softmax's ``-inf`` scores."""
    if op == "logsumexp":
        return _aten_logsumexp(z, d)
    if op == "softmax":
        return _reference_softmax_grad(torch.softmax(z, d), d)
    return _reference_log_softmax_grad(torch.log_softmax(z, d), z if scores is None else scores, d)


def _reference_softmax_grad(y, d=-1):
    """``y`` (aten's softmax along ``d``) whose gradient is the reference's where the incoming
    gradient is not finite (see :func:`_recompute_non_finite_rows`; with a finite one aten's
    ``y (g - <y, g>)`` is the reference's, exactly 0 at a probability 0). Up to
    :data:`SERIAL_SCAN_NUMEL` entries a scan looks for zero probabilities while ``y`` is in
    cache and only then hooks ``y``'s node (with none, a non-finite gradient is non-finite
    wherever the reference's is); above, the node is hooked with no scan in the forward: the
    hook looks at every entry of aten's gradient (a parallel scan, while it is in cache)."""
    if not y.requires_grad or not y.numel():
        return y
    if y.numel() > SERIAL_SCAN_NUMEL:
        _recompute_non_finite_rows(y, d % y.dim())
    elif _reaches_floor(y, 0.0):
        _recompute_non_finite_rows(y, d % y.dim(), drop_at_zeros=True)
    return y


def _recompute_non_finite_rows(y, d, drop_at_zeros=False):
    """Hook aten's softmax backward (``y``'s node, normalised along ``d``) so that a row
    whose gradient has a NaN or an infinity is recomputed with the reference's formula
    (:func:`softmax_backward_dropping_zeros`). aten's ``y (g - <y, g>)`` is non-finite in
    its whole row when ``<y, g>`` is (an infinite or NaN incoming gradient anywhere in the
    row, even at a probability 0, where ``0 * inf`` is NaN), so one column tells; the
    reference drops the gradient arriving at a probability 0 and gives those entries exactly 0.
    With ``drop_at_zeros`` (a small ``y`` known to hold zeros) the gradient arriving at a
    probability 0 is also dropped before aten's backward, so that a finite but huge one
    (``g_j - <y, g>`` overflowing, ``0 * inf`` at that entry alone) cannot slip past the column."""
    if drop_at_zeros:
        y.register_hook(functools.partial(_drop_grad_where, y.detach() == 0))
    y.grad_fn.register_hook(functools.partial(_recompute_where_not_finite, y.detach(), d, drop_at_zeros))


def _recompute_where_not_finite(y, d, zeros_dropped, grad_inputs, grad_outputs):
    """The hook of :func:`_recompute_non_finite_rows`. Without ``zeros_dropped`` every entry of
    aten's gradient is looked at, not one column: a huge finite incoming gradient (above
    ``finfo.max / 2``) can overflow ``g_j - <y, g>`` at one entry, and where ``y_j = 0`` that
    entry alone is ``0 * inf = NaN``, where the reference's is 0."""
    dx, (grad,) = grad_inputs[0], grad_outputs
    if dx is None or grad is None:
        return None
    try:
        if zeros_dropped and not _first_column_has_nan(dx, d, inf_too=True):
            return None
        if not zeros_dropped and all_finite(dx):
            return None
    except RuntimeError:   # a batched gradient (vmap): no data-dependent branch, recompute
        pass
    return (softmax_backward_dropping_zeros(y, grad, d),) + tuple(grad_inputs[1:])


def softmax_backward_dropping_zeros(y, grad, d=-1):
    """``y * (g - <g, y>)`` along ``d``, exactly 0 where ``y`` is 0, whose ``g`` is left out of
    the sum there (in torch ops, differentiable)."""
    zero = y == 0
    grad = grad.masked_fill(zero, 0)
    return (y * (grad - (grad * y).sum(d, keepdim=True))).masked_fill(zero, 0)


def log_softmax_backward_hiding(y, grad, hidden, d=-1):
    """``g - e^y sum g`` along ``d`` over the entries not ``hidden``, exactly 0 at those (in
    torch ops, differentiable): the reference's log-softmax gradient, ``hidden`` its ``-inf``
    scores."""
    grad = grad.masked_fill(hidden, 0)
    return (grad - torch.exp(y) * grad.sum(d, keepdim=True)).masked_fill(hidden, 0)


def _reference_log_softmax_grad(y, z, d=-1):
    """``y`` (aten's log-softmax of ``z``), with a hook giving it the reference's gradient
    when it has ``-inf`` entries (:func:`_minus_inf_scores`). Checked once, here, while ``y`` is
    still in cache, so that the common gradient (no ``-inf``) runs aten's backward with no
    hook."""
    if y.requires_grad and y.numel() and _reaches_floor(y, float("-inf")):
        _hide_minus_inf_scores(y, _minus_inf_scores(z), d)
    return y


def _hide_minus_inf_scores(y, hidden, d=-1):
    """Hooks on aten's log-softmax ``y`` (normalised along ``d``) that give the entries at
    ``hidden`` (its ``-inf`` scores) the reference's gradient: the gradient arriving there
    is dropped before aten's backward (which would pass it on and add it to the row's sum),
    and where the row's sum of incoming gradients is not finite (a NaN or an infinity at a
    visible entry: aten's ``g_j - e^{y_j} sum g`` is then non-finite throughout the row,
    ``0 * inf`` at ``e^{y_j} = 0``), those entries are set back to 0."""
    y.register_hook(functools.partial(_drop_grad_where, hidden))
    y.grad_fn.register_hook(functools.partial(_zero_where_not_finite, hidden, d % y.dim()))


def _zero_where_not_finite(hidden, d, grad_inputs, grad_outputs):
    dx = grad_inputs[0]
    if dx is None:
        return None
    try:
        if not _first_column_has_nan(dx, d, inf_too=True):
            return None
    except RuntimeError:   # a batched gradient (vmap): no data-dependent branch
        pass
    return (dx.masked_fill(hidden, 0),) + tuple(grad_inputs[1:])


#: Up to this many entries the look for outputs at the floor (``-inf`` log-probabilities, zero
#: probabilities) runs on one thread in numba (about 2 us at 32000 float32); above, torch's
#: parallel min is faster.
SERIAL_SCAN_NUMEL = 1 << 18


def _reaches_floor(y, floor: float) -> bool:
    """Whether ``y`` (a log-softmax, floor ``-inf``, or a softmax, floor 0) has an entry at
    ``floor``. (A row holding a NaN is NaN throughout, and the hooks leave NaN entries as they
    are.)"""
    if (y.numel() <= SERIAL_SCAN_NUMEL and y.is_cpu and y.dtype in _CTYPES and y.is_contiguous()
            and not is_functorch_wrapped(y)):
        scan = (_SCANS or _scans()).get("floor")
        if scan is not None:
            return scan(y, floor)
    return not float(y.detach().amin()) > floor


_SCANS: dict = {}


def _scans() -> dict:
    """The first-column NaN scan by dtype, and the all-finite check under ``"all finite"`` (none
    without numba), loaded on first use."""
    if numba_available():
        from .cpu.scan import all_finite, first_entries_have_nan, nan_or_floor, overflows_when_scaled, reaches_floor
        _SCANS.update({torch.float32: first_entries_have_nan, torch.float64: first_entries_have_nan,
                       "all finite": all_finite, "floor": reaches_floor, "nan or floor": nan_or_floor,
                       "overflow": overflows_when_scaled})
    else:
        _SCANS[None] = None
    return _SCANS


_READ = {dtype: kind.from_address for dtype, kind in _CTYPES.items()}
_STRIDED = torch.strided
#: (the function itself, which dynamo folds to True while it traces: read through
#: ``torch.compiler`` it costs a microsecond more once a large op has evicted the lookups;
#: dynamo's own, one frame: ``is_compiling`` is two, 2-3 us once evicted. Other tracers
#: (make_fx, export) hand the lanes tensor subclasses, which they refuse.)
_is_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)
#: (bound once: a lookup in torch's namespace per call costs about a microsecond once a large
#: op has evicted it from the caches)
_grad_enabled, _num_threads = torch.is_grad_enabled, torch.get_num_threads


def _lane_shape(x, dim):
    """``(rows, n)`` of ``x`` when the call can take a lane: the auto backend, not traced,
    and ``x`` a plain contiguous, non-empty CPU float32 / float64 tensor normalised along its
    last axis (``rows`` rows of ``n`` entries); else None. Each check is one attribute read, the cheap
    ones first: this runs on every ``sk.softmax`` call that could have been
    ``torch.softmax``. Tensors seen through a functorch transform pass here; the lanes send
    them to the full path. Compiling is asked before the backend: dynamo folds it to True,
    and cannot trace the context variable's ``get`` (``fullgraph=True`` failed)."""
    if (type(x) is not torch.Tensor or type(dim) is not int or _is_compiling()
            or _current.get().backend != "auto" or forward_ad._current_level >= 0 or transforms_active()
            or dispatch_modes()):
        return None   # (forward-mode AD: aten's tangent at -inf scores is not the reference's 0; a
        # torch.func transform wraps what aten returns even from a tensor it does not wrap; a
        # dispatch mode such as make_fx's tracer sees torch ops, not the kernels' work)
    if x.dtype not in _READ or not x.is_cpu or x.layout is not _STRIDED or x.is_nested or not x.is_contiguous():
        return None
    shape = x.shape   # (one read: x.size(-1) costs twice shape[-1])
    nd = len(shape)
    if not nd or (dim != -1 and dim != nd - 1):
        return None
    n = shape[-1]
    rows = x.numel() // n if n else 0
    return (rows, n) if rows else None


def _lane_bad(out, rows: int) -> bool:
    """Whether a row of aten's output ``out`` (``rows`` C-contiguous rows) starts with NaN,
    i.e. needs the reference; also True when the address cannot be read (a tensor seen
    through ``torch.func``: the reference then runs). A few rows are read in place."""
    read = _READ.get(out.dtype)   # None: aten changed the dtype (autocast)
    try:
        base = out.data_ptr()
    except RuntimeError:
        return True
    if read is None:
        return True
    if rows < SCAN_MIN_ROWS:
        if rows == 1:
            return math.isnan(read(base).value)
        size = out.element_size() * (out.numel() // rows)
        return any(math.isnan(read(base + r * size).value) for r in range(rows))
    scan = (_SCANS or _scans()).get(out.dtype)
    if scan is None:
        return bool(torch.isnan(out.narrow(-1, 0, 1)).any())
    return scan(out)


def _softmax_lane(x, dim, params, log=False):
    """:func:`softmax_lane` for :func:`run`'s arguments (temperature 1 only)."""
    t = params.get("temperature", 1.0)
    if (type(t) is not float and type(t) is not int) or t != 1:
        return None
    return softmax_lane(x, dim, log)


def softmax_lane(x, dim, log=False):
    """``softmax(x, dim)`` (or its log with ``log``) for the common call, in the fewest Python
    steps, or None when the call needs :func:`run`'s full path.

    The common call (:func:`_lane_shape`) with no mask and temperature 1 runs the numba
    kernel's forward where that measurably wins (:data:`NUMBA_WINS`), aten otherwise, then
    reads each row's first output entry (:mod:`.cpu.scan`): aten leaves the rows the reference
    defines differently (nothing visible, a NaN, a ``+inf``) all NaN, and None sends those
    calls to the full path, which recomputes them."""
    lane = _lane_shape(x, dim)
    if lane is None or is_functorch_wrapped(x):   # (wrapped: no address to read, the full path's reference)
        return None
    rows, n = lane
    op = "log_softmax" if log else "softmax"
    grad = x.requires_grad and _grad_enabled()
    if (rows > 1 or _ONE_ROW_WINS or n >= (ONE_LONG_ROW if op in _LONG_ROW_OPS else LONG_FLOAT32_ROW)) \
            and _wins(op, x.dtype, rows, n, grad, _num_threads()):
        if not grad:
            return _forward_only(x, LOG_PROBS if log else PROBS)
        return _kernel_softmax(x, log)
    if rows * n * x.element_size() >= memory.MIN_BYTES:
        if grad and log and numba_available():
            return _kernel_softmax(x, log=True)
        out = _huge_page_softmax(x, log)
    elif grad and (log or rows * n <= SERIAL_SCAN_NUMEL) and numba_available():
        return _aten_with_gradient(x, log)
    elif log:
        out = _reference_log_softmax_grad(torch.log_softmax(x, -1), x)
    else:
        out = _reference_softmax_grad(torch.softmax(x, -1))
    if rows == 1:
        return None if math.isnan(_READ[x.dtype](out.data_ptr()).value) else out
    return None if _lane_bad(out, rows) else out


def _aten_with_gradient(x, log):
    """aten's softmax / log-softmax of a lane input that records a gradient (a softmax of at
    most :data:`SERIAL_SCAN_NUMEL` entries: above, a hook on its backward costs less than a
    pass), or None where a row needs the reference. One scan of the output finds both what
    the full path must recompute (a NaN: aten's row where the reference differs) and the
    entries at the floor, which must pass no gradient (only then is the output hooked:
    :func:`_hide_minus_inf_scores`, :func:`_recompute_non_finite_rows`); a log-softmax needs
    that pass at any size, and one scan replaces ``torch.amin`` plus the read of each row's
    first entry."""
    out = (torch.log_softmax if log else torch.softmax)(x, -1)
    floor = float("-inf") if log else 0.0
    found = (_SCANS or _scans())["nan or floor"](out, floor)
    if found & 1:   # scan.NAN_FOUND
        return None
    if found:   # scan.FLOOR_FOUND
        if log:
            _hide_minus_inf_scores(out, _minus_inf_scores(x))
        else:
            _recompute_non_finite_rows(out, out.dim() - 1, drop_at_zeros=True)
    return out


class _AtenSoftmax(torch.autograd.Function):
    """aten's softmax / log-softmax (last axis, contiguous), forward and backward; with ``huge``
    (large inputs) each writes into a fresh output backed by huge pages
    (:mod:`softmaxkit.kernels.memory`): on a large input most of aten's own time is page
    faults on its fresh output. A softmax's backward is the numba kernel's where numba is
    installed (exact in one pass; aten's needs a look at every entry after it, see
    :func:`_recompute_where_not_finite`). A log-softmax gets the reference's gradient at ``-inf``
    scores (see :func:`_minus_inf_scores`) from aten's backward after a pass that looks for
    them (with numba, :class:`_KernelSoftmax` runs instead)."""

    @staticmethod
    def forward(ctx, x, log, huge=True):
        out = memory.empty_like(x) if huge else torch.empty_like(x)
        (torch.log_softmax if log else torch.softmax)(x, -1, out=out)
        ctx.save_for_backward(out)
        ctx.log = log
        # -inf outputs (or NaN rows, which the caller recomputes): hide the -inf scores' gradient
        ctx.hidden = _minus_inf_scores(x) if log and not float(out.amin()) > float("-inf") else None
        return out

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        if ctx.hidden is not None:
            grad = _drop_grad_where(ctx.hidden, grad)
        if backward_in_torch_ops(grad):   # create_graph or batched gradients: the same formula as torch ops
            if ctx.log:
                if ctx.hidden is None:
                    return grad - torch.exp(y) * grad.sum(-1, keepdim=True), None, None
                return log_softmax_backward_hiding(y, grad, ctx.hidden), None, None
            return softmax_backward_dropping_zeros(y, grad), None, None
        if not ctx.log and y.is_cpu and y.dtype in _CTYPES and numba_available():
            # the kernel's one pass: the reference's gradient, where aten's needs a look at every entry
            return (_FUNCTIONS or _cpu_functions()).backward_from_output(y, grad, PROBS), None, None
        grad = grad.contiguous()
        dx = memory.empty_like(y)
        if ctx.log:
            torch.ops.aten._log_softmax_backward_data.out(grad, y, -1, y.dtype, out=dx)
            if ctx.hidden is not None and _first_column_has_nan(dx, y.dim() - 1, inf_too=True):
                dx.masked_fill_(ctx.hidden, 0)   # see _hide_minus_inf_scores
        else:
            torch.ops.aten._softmax_backward_data.out(grad, y, -1, y.dtype, grad_input=dx)
            if not all_finite(dx):   # see _recompute_where_not_finite
                dx = softmax_backward_dropping_zeros(y, grad)
        return dx, None, None


def _huge_page_softmax(x, log):
    if x.requires_grad and torch.is_grad_enabled():
        return _AtenSoftmax.apply(x, log)
    return (torch.log_softmax if log else torch.softmax)(x, -1, out=memory.empty_like(x))


class _RowsLeft(Exception):
    """Raised inside :class:`_KernelSoftmax`'s forward when the kernel left a row to the
    reference, so that no autograd node is recorded; the caller takes the full path."""


class _KernelSoftmax(torch.autograd.Function):
    """The numba kernel's softmax or log-softmax (last axis, contiguous, output on huge pages
    from :data:`memory.MIN_BYTES`; :func:`softmaxkit.kernels.cpu.functions.forward_only`) and
    its one-pass backward, which reads only the output: an entry at the floor (probability 0,
    log-probability ``-inf``) passes no gradient. For a log-softmax that is the reference's
    gradient only because the forward leaves to the reference every row where a finite
    score's output overflows to ``-inf`` (finfo.max beside finfo.min), which aten's forward
    returns silently. A row whose maximum is ``+inf`` goes to the reference too: its output
    is the limit (equal weights on the ``+inf`` entries), whose gradient is zero, and nothing
    in the output tells it from an ordinary row."""

    @staticmethod
    def forward(ctx, x, mode):
        out = _forward_only(x, mode, gradient=True)
        if out is None:
            raise _RowsLeft
        ctx.save_for_backward(out)
        ctx.mode = mode
        return out

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        if backward_in_torch_ops(grad):   # create_graph or batched gradients: the same formula as torch ops
            if ctx.mode == PROBS:
                return softmax_backward_dropping_zeros(y, grad), None
            return log_softmax_backward_hiding(y, grad, y == float("-inf")), None
        return (_FUNCTIONS or _cpu_functions()).backward_from_output(y, grad, ctx.mode), None


def _kernel_softmax(x, log=False):
    """:class:`_KernelSoftmax` of a lane input (log-softmax with ``log``), or None where a row
    needs the reference."""
    try:
        return _KernelSoftmax.apply(x, LOG_PROBS if log else PROBS)
    except _RowsLeft:
        return None


class _KernelLogSumExp(torch.autograd.Function):
    """The numba kernel's log-sum-exp of a lane input (:func:`softmaxkit.kernels.cpu.functions.forward_only`,
    the last axis removed) and its gradient ``softmax(x) g``, the probabilities from the
    kernel again in the backward. Only for inputs whose every row's result is finite (the
    forward raises :class:`_RowsLeft` otherwise): each row then has a finite maximum, the
    reference's gradient is the softmax of the row, and an entry of probability 0 passes
    no incoming gradient, even an infinite or NaN one (:class:`_LogSumExpGrad`)."""

    @staticmethod
    def forward(ctx, x):
        out = _forward_only(x, LSE)
        if out is None or not all_finite(out):
            raise _RowsLeft
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad = grad.unsqueeze(-1)
        if backward_in_torch_ops(grad):   # create_graph or batched gradients: torch ops, differentiable
            return _probs_times_grad(torch.softmax(x, -1), grad, differentiable=True)
        finite = all_finite(grad)
        # an infinite or NaN incoming gradient reaches a subnormal probability, which the
        # kernel's exp flushes to 0 (and 0 passes nothing): aten's softmax keeps it, as the
        # reference does (inf, where the kernel's gave 0)
        p = _forward_only(x, PROBS) if finite else None
        if p is None:   # (with a finite gradient, not met: every row's maximum is finite)
            p = torch.softmax(x, -1)
        return _probs_times_grad(p, grad, finite=finite)


def _kernel_logsumexp(x):
    """:class:`_KernelLogSumExp` of a lane input, or None where a row needs the reference."""
    try:
        return _KernelLogSumExp.apply(x)
    except _RowsLeft:
        return None


def _kernel_forward(op, x, scale=1.0, algorithm=None):
    """The numba kernel's forward result for a lane input (:func:`_lane_shape`) when no
    gradient is recorded, through :func:`softmaxkit.kernels.cpu.functions.forward_only`;
    None (the full path then runs) when a gradient is wanted, the tensor is seen through a
    transform, or a row needs the reference."""
    if (x.requires_grad and torch.is_grad_enabled()) or under_transform() or is_functorch_wrapped(x):
        return None
    from .cpu import functions
    return functions.forward_only(x, _KERNEL_MODES[op], scale, algorithm)


PROBS, LOG_PROBS, LSE = 0, 1, 2   # the kernels' modes (softmax.PROBS, LOG_PROBS, LSE)
_KERNEL_MODES = {"softmax": PROBS, "log_softmax": LOG_PROBS, "logsumexp": LSE}


def _forward_only(x, mode, gradient=False):
    """:func:`softmaxkit.kernels.cpu.functions.forward_only` at scale 1 for a lane input (the
    lane has checked what :func:`_kernel_forward` checks)."""
    return (_FUNCTIONS or _cpu_functions()).forward_only(x, mode, gradient=gradient)


def _cpu_functions():
    """:mod:`softmaxkit.kernels.cpu.functions` (which imports numba), imported on first use and
    kept: an ``import`` statement in a function that runs per call costs 2-5 us once a large
    op has evicted the import machinery from the caches."""
    global _FUNCTIONS
    from .cpu import functions as _FUNCTIONS
    return _FUNCTIONS


_FUNCTIONS = None


def _log_softmax_lane(x, dim, params):
    return _softmax_lane(x, dim, params, log=True)


def _logsumexp_lane(x, dim, params):
    keepdim = params.get("keepdim", False)
    return logsumexp_lane(x, dim, keepdim) if type(keepdim) is bool else None


def logsumexp_lane(x, dim, keepdim=False):
    """As :func:`softmax_lane`, for log-sum-exp (``keepdim`` a bool): None unless every row's
    result is finite (the reference's own rows: nothing visible, a NaN, an ``inf``)."""
    lane = _lane_shape(x, dim)
    if lane is None or is_functorch_wrapped(x):
        return None
    grad = x.requires_grad and _grad_enabled()
    if _wins("logsumexp", x.dtype, lane[0], lane[1], grad, _num_threads()):
        out = _kernel_logsumexp(x) if grad else _forward_only(x, LSE)
        return out if out is None or not keepdim else out.unsqueeze(-1)
    if grad:   # aten's own gradient uses the rounded lse
        out = _LogSumExpGrad.apply(x, -1, keepdim)
    else:
        out = torch.logsumexp(x, -1, keepdim=keepdim)
    return out if all_finite(out) else None


_LANES = {"softmax": _softmax_lane, "log_softmax": _log_softmax_lane, "logsumexp": _logsumexp_lane}


def _run_aten(op, reference, x, dim, mask, params):
    d = dim % x.dim()
    if x.shape[d] == 0:
        return reference(x, dim=dim, mask=mask, **params)
    t = params.get("temperature", 1.0)
    # half precision computes in float32, except aten's own CUDA softmax and log-softmax (which
    # accumulate in float32 and round once: the same values, without two conversion passes)
    half = x.dtype in (torch.float16, torch.bfloat16) and not (
        x.is_cuda and op != "logsumexp" and type(t) in (int, float) and t == 1)
    z = x.float() if half else x
    scores = None
    if op == "logsumexp":
        if mask is not None:
            z = z.masked_fill(~mask, float("-inf"))
        out = _aten_logsumexp(z, d)
        if all_finite(out):
            out = out if params.get("keepdim", False) else out.squeeze(d)
            return out.to(x.dtype) if half else out
        bad = ~torch.isfinite(out)          # NaN rows, and inf rows whose gradient differs
    else:
        temperature = params.get("temperature", 1.0)
        # the -inf scores (log-softmax's entries that pass no gradient) are those of x and the
        # mask: a finite x / T that overflows to -inf is none
        scores = z if mask is None else z.masked_fill(~mask, float("-inf"))
        z = scores if temperature == 1 else times_inverse_temperature(scores, 1.0 / float(temperature))
        out = _aten_op(op, z, d, scores)
        # A finite score whose x / T overflowed (a finfo.min fill over T < 1): the reference
        # takes that row as (x - max) / T, exact where the rounded x / T of the others is
        # not (T = 0.01: a log-probability of -24.6826 came out -24.6875 here)
        overflowed = None
        if temperature < 1 and _overflowed(scores, z, 1.0 / float(temperature)):
            overflowed = (torch.isinf(z) & torch.isfinite(scores)).any(d, keepdim=True)
        # A row aten does not define as the reference (a NaN, a +inf, nothing visible)
        # comes out all NaN; every other row has no NaN. One column tells them apart.
        if overflowed is None and (out.shape[d] == 0 or not _first_column_has_nan(out, d)):
            return out.to(x.dtype) if half else out
        bad = torch.isnan(out.narrow(d, 0, 1))
        if overflowed is not None:
            bad = bad | overflowed
    # rare: recompute without those rows (their NaN would reach the gradient), then put
    # the reference's rows in
    out = _aten_op(op, torch.where(bad, torch.zeros((), dtype=z.dtype), z), d, scores)
    out = _aten_fix_rows(op, reference, x, d, mask, params, out, bad, half)
    if op == "logsumexp" and not params.get("keepdim", False):
        out = out.squeeze(d)
    return out


def _overflowed(scores, z, scale) -> bool:
    """Whether a finite score's ``z = scores * scale`` is infinite: one numba pass over the
    scores where they are a plain CPU tensor (:func:`softmaxkit.kernels.cpu.scan.overflows_when_scaled`),
    torch ops otherwise."""
    if (scores.is_cpu and scores.dtype in _CTYPES and scores.is_contiguous() and numba_available()
            and not is_functorch_wrapped(scores)):
        return (_SCANS or _scans())["overflow"](scores, scale)
    return bool((torch.isinf(z) & torch.isfinite(scores)).any())


def _aten_fix_rows(op, reference, x, d, mask, params, out, bad, half):
    """``out`` (compute dtype; keepdim along ``d`` for logsumexp) with the rows marked in
    ``bad`` recomputed by ``reference``, in ``x``'s dtype."""
    rows = bad.squeeze(d).reshape(-1).nonzero().flatten()
    xr = x.movedim(d, -1)
    n = xr.shape[-1]
    sub = xr.reshape(-1, n)[rows]
    sub_mask = None
    if mask is not None:
        sub_mask = mask.expand(x.shape).movedim(d, -1).reshape(-1, n)[rows]
    ref_params = dict(params, keepdim=False) if op == "logsumexp" else params
    ref = reference(sub, dim=-1, mask=sub_mask, **ref_params)
    if half:
        out = out.to(x.dtype)
    if op == "logsumexp":
        flat = out.reshape(-1).index_put((rows,), ref.to(out.dtype))
        return flat.reshape(out.shape)
    outr = out.movedim(d, -1)
    flat = outr.reshape(-1, n).index_put((rows,), ref.to(out.dtype))
    return flat.reshape(outr.shape).movedim(-1, d)


def _entmax_alpha(x, alpha):
    """A float alpha, or a per-row alpha tensor of shape ``x.shape[:-1]``; ``None`` if not covered."""
    if _plain_float(alpha):
        return float(alpha) if ENTMAX_MIN_ALPHA <= alpha < float("inf") else None
    if not isinstance(alpha, torch.Tensor) or not alpha.is_floating_point() or alpha.device != x.device:
        return None
    if alpha.dim() > x.dim():
        return None
    shape = (1,) * (x.dim() - alpha.dim()) + tuple(alpha.shape)
    if shape[-1] != 1 or any(a not in (1, s) for a, s in zip(shape, x.shape)):
        return None
    with torch.no_grad():
        if not bool((torch.isfinite(alpha) & (alpha >= ENTMAX_MIN_ALPHA)).all()):
            return None
    return alpha.reshape(shape).expand(x.shape[:-1] + (1,)).squeeze(-1)


__all__ = [
    "AUTO_MIN_NUMEL",
    "KERNEL_MIN_NUMEL",
    "BACKENDS",
    "all_finite",
    "NUMBA_WINS",
    "WINS_BY_CPU",
    "wins_for_cpu",
    "OPS",
    "SHAPE_CLASSES",
    "current_backend",
    "plan",
    "run",
    "use_backend",
]
