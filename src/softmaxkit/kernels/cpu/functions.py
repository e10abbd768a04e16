"""Autograd-aware entry points to the numba softmax kernels (last axis, CPU).

Each function takes a CPU tensor, float32 or float64, contiguous, normalised along its
last axis, and returns ``(output, todo)``: the output equals the reference definition
within floating-point tolerance on every row except those marked in ``todo`` (bool,
``x.shape[:-1]``), which hold zeros (zero gradient) and are recomputed by the dispatcher
with the reference. Gradients come from the backward kernels
through :class:`torch.autograd.Function` (``gradcheck`` holds in float64); with
``create_graph=True`` the same formulas run as PyTorch ops, so higher derivatives work.
Argument checking and coverage decisions live in :mod:`softmaxkit.kernels.dispatch`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..._checks import backward_in_torch_ops
from .. import memory
from ..dispatch import log_softmax_backward_hiding, softmax_backward_dropping_zeros
from . import FLAG_TODO, call_kernel, entry_point, keep_torch_threads, sync_threads
from . import softmax as _k
from ._intrinsics import VECTOR_ISA
from .parallel import runnable
from .scan import all_finite

#: The algorithm used when none is asked for, per vector instruction set
#: (:data:`._intrinsics.VECTOR_ISA`), on rows longer than one block (:data:`softmax.BLOCK`
#: entries). With AVX-512 (Xeon, Emerald Rapids) ``two_pass`` was the fastest. With AVX2 (AMD
#: EPYC, measured 2026-12-01, 1 and 2 threads, rows of 32000 to 1048576 in float32 and
#: float64) ``online`` and ``three_pass`` were within 5% of each other and ``two_pass`` 5-35%
#: slower. ``three_pass`` sums per block (a float32 row of a million entries sums to 1 within
#: 1e-6, as ``online``) and scales every ``exp(x - max)`` by the same ``1 / sum``, so equal
#: scores get equal probabilities; ``online``'s per-block factors ``e^{m_b - m} / d`` round
#: differently, and equal scores in different blocks came out 1 ulp apart. ``two_pass``
#: rescales by powers of two, which are exact. A row of at most one block stays in L1, where
#: rereading it costs less than the blockwise bookkeeping (and its scratch arrays, allocated
#: per row), so such rows take ``three_pass`` everywhere.
DEFAULT_ALGORITHM = "two_pass" if VECTOR_ISA == "avx512" else "three_pass"


def default_algorithm(n: int) -> str:
    """The algorithm used for rows of ``n`` entries when none is asked for."""
    return "three_pass" if n <= _k.BLOCK else DEFAULT_ALGORITHM


def _algorithm_code(algorithm: str | None, n: int) -> int:
    name = default_algorithm(n) if algorithm is None else algorithm
    if name not in _k.ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(_k.ALGORITHMS)}, got {algorithm!r}")
    return _k.ALGORITHMS[name]


def _rows(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1] if x.dim() else 1
    return x.detach().reshape(-1, n)


def _as_dtype(scale: float, dtype):
    if -1e38 < scale < 1e38:
        return dtype(scale)
    with np.errstate(over="ignore"):   # 1/T beyond the dtype's range: inf, as the reference's x * (1/T)
        return dtype(scale)


def _run_forward(x: torch.Tensor, scale: float, algorithm: int, mode: int):
    sync_threads()
    x2 = _rows(x)
    dtype = x2.numpy().dtype.type
    rows = x2.shape[0]
    lse = torch.empty(rows, dtype=x.dtype)
    special = torch.full((rows,), FLAG_TODO, dtype=torch.uint8)
    out = memory.empty_like(x2) if mode != _k.LSE else torch.empty((1, 0), dtype=x.dtype)
    scale_x = _as_dtype(scale, dtype)
    kernel = _k.normalize_rows if rows > 1 else _k.normalize_rows_serial
    call_kernel(("softmax", "log_softmax", "logsumexp")[mode], kernel, x2.numpy(), out.numpy(),
                lse.numpy(), special.numpy(), scale_x, algorithm, mode)
    todo = special == FLAG_TODO
    if bool(todo.any()):
        if mode != _k.LSE:
            out[todo] = 0
        lse[todo] = 0
        special[todo] = 1   # zero gradient from the kernel's part; the reference supplies it
    return out, lse, special, todo


def _run_backward(y2: torch.Tensor, grad: torch.Tensor, special: torch.Tensor, scale: float, mode: int):
    sync_threads()
    g2 = grad.detach().reshape(y2.shape).contiguous()
    dx = memory.empty_like(y2)
    dtype = y2.numpy().dtype.type
    scale_x = _as_dtype(scale, dtype)
    keep_torch_threads(_k.backward_rows, y2.numpy(), g2.numpy(), dx.numpy(), special.numpy(), scale_x, mode)
    return dx


def _differentiable_backward(y, grad, special, scale, mode):
    """The backward kernel's formula in PyTorch ops, for double backward."""
    keep = (special == 0).reshape(grad.shape[:-1] + (1,))
    if mode == _k.PROBS:   # an entry with y = 0 passes no gradient, as in backward_rows
        dx = softmax_backward_dropping_zeros(y, grad)
    else:
        dx = log_softmax_backward_hiding(y, grad, y == float("-inf"))
    return torch.where(keep, dx * scale, torch.zeros_like(dx))


def backward_from_output(y: torch.Tensor, grad: torch.Tensor, mode: int) -> torch.Tensor:
    """The reference's softmax (``mode`` PROBS) or log-softmax (LOG_PROBS) gradient from the
    output ``y`` (last axis, every row with a finite maximum), in one pass per row: softmax
    ``dx = y (g - <y, g>)`` with 0 (and ``g`` left out of the sum) where ``y = 0``;
    log-softmax ``dx = g - e^y sum g`` over the entries with ``y > -inf``, 0 at the others
    (aten's backward gives a ``-inf`` entry ``g_j`` and adds it to the row's sum, so it needs
    a separate pass to find them). The kernel reads and writes the tensors at their
    addresses, as :func:`forward_only` does."""
    if not y.numel():
        return torch.zeros_like(y)
    # (the kernel reads addresses: no detach; each conversion only where needed, 1.6 us a call)
    if not y.is_contiguous():
        y = y.contiguous()
    g = grad if grad.dtype is y.dtype else grad.to(y.dtype)
    if not g.is_contiguous():
        g = g.contiguous()
    n = y.shape[-1]
    rows = y.numel() // n
    dx = memory.empty_like(y) if rows * n * y.element_size() >= memory.MIN_BYTES else torch.empty_like(y)
    dtype = _NP_DTYPES[y.dtype]
    _call_at(_k.backward_rows_at, _k.backward_rows_at_serial, rows, dtype,
             (y.data_ptr(), g.data_ptr(), dx.data_ptr(), rows, n, _ONE[dtype], mode))
    return dx


_ENTRIES_AT: dict = {}
_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}
_ONE = {np.float32: np.float32(1.0), np.float64: np.float64(1.0)}
#: The serial forward kernel's entry point and the scale 1, by torch dtype (set by the first
#: single-row call).
_ONE_ROW_ENTRIES: dict = {}
_SHORT_ROW_CODE, _LONG_ROW_CODE = _algorithm_code(None, 1), _algorithm_code(None, _k.BLOCK + 1)


def forward_only(x: torch.Tensor, mode: int, scale: float = 1.0, algorithm: str | None = None,
                 gradient: bool = False):
    """The forward kernel's result for ``x`` in the fewest Python steps, with no autograd
    record: the probabilities (``mode`` PROBS), log-probabilities (LOG_PROBS) or the row
    log-sum-exps (LSE, shape ``x.shape[:-1]``) along the last axis. None when a row was left
    to the reference (the caller then takes the full path, which recomputes it); with
    ``gradient`` (the caller's backward reads only the output) also when a row took its
    ``+inf`` limit, whose gradient is zero.

    ``x`` is a C-contiguous CPU float32 / float64 tensor with at least one row of at least
    one entry, not seen through a ``torch.func`` transform. The kernel reads and writes the
    tensors at their addresses (:func:`softmax.normalize_rows_at`); one row runs the serial
    kernel (no parallel launch); the entry point of the kernel's specialisation is looked up
    once per (kernel, dtype), not typed per call."""
    n = x.shape[-1]
    rows = x.numel() // n
    if rows == 1 and scale == 1.0 and algorithm is None:
        # one row (a decoding step's logits): the serial entry point by torch dtype, no
        # _call_at (about 1 us of 12.6 on a row of 32000 float32 entries)
        one_row = _ONE_ROW_ENTRIES.get(x.dtype)
        if one_row is not None:
            entry, one = one_row
            address = x.data_ptr()
            if mode == _k.LSE:
                result = torch.from_numpy(np.empty(x.shape[:-1], one.dtype))
                out_address, lse_address = address, result.data_ptr()
            else:
                result = memory.empty_like(x) if n * x.element_size() >= memory.MIN_BYTES else torch.empty_like(x)
                out_address, lse_address = result.data_ptr(), address
            try:
                status = entry(address, out_address, lse_address, 1, n, one,
                               _SHORT_ROW_CODE if n <= _k.BLOCK else _LONG_ROW_CODE, mode)
            except Exception:
                return None
            return None if status >> 1 or (gradient and status & 1) else result
    dtype = _NP_DTYPES[x.dtype]
    address = x.data_ptr()
    if mode == _k.LSE:
        result = torch.from_numpy(np.empty(x.shape[:-1], dtype))   # (torch.empty: 4.5 us, this 1.9)
        out_address, lse_address = address, result.data_ptr()
    else:
        result = memory.empty_like(x) if rows * n * x.element_size() >= memory.MIN_BYTES else torch.empty_like(x)
        out_address, lse_address = result.data_ptr(), address
    args = (address, out_address, lse_address, rows, n,
            _ONE[dtype] if scale == 1.0 else _as_dtype(scale, dtype),
            (_SHORT_ROW_CODE if n <= _k.BLOCK else _LONG_ROW_CODE) if algorithm is None
            else _algorithm_code(algorithm, n), mode)
    try:
        status = _call_at(_k.normalize_rows_at, _k.normalize_rows_at_serial, rows, dtype, args)
    except Exception:
        return None   # the full path reruns the kernel and reports the error
    if rows == 1 and x.dtype not in _ONE_ROW_ENTRIES:
        entry = _ENTRIES_AT.get((_k.normalize_rows_at_serial, dtype))
        if entry is not None:
            _ONE_ROW_ENTRIES[x.dtype] = (entry, _ONE[dtype])
    rows_left, took_limit = status >> 1, status & 1   # (softmax._rows_status)
    return None if rows_left or (gradient and took_limit) else result


def _call_at(parallel, serial, rows: int, dtype, args):
    """``kernel(*args)`` for a kernel that takes tensors by address: ``serial`` for one row (no
    parallel launch), else ``parallel`` on torch's thread count (given back to torch after).
    The entry point of the kernel's specialisation is looked up once per (kernel, dtype), not
    typed per call; the arguments other than the addresses keep their types."""
    if rows == 1:
        kernel = serial
    else:
        kernel = runnable(parallel)
        sync_threads()
    entry = _ENTRIES_AT.get((kernel, dtype))
    threads = torch.get_num_threads()
    try:
        if entry is None:
            result = kernel(*args)   # compiles on first use
            _ENTRIES_AT[(kernel, dtype)] = entry_point(kernel, *args) or kernel
            return result
        return entry(*args)
    finally:
        if rows > 1 and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, algorithm, mode):
        out, _, special, todo = _run_forward(x, scale, algorithm, mode)
        y = out.reshape(x.shape).detach()   # (not a view made inside the Function: a user's in-place op then works)
        ctx.save_for_backward(y, special)
        ctx.scale, ctx.mode = scale, mode
        todo = todo.reshape(x.shape[:-1])
        ctx.mark_non_differentiable(todo)
        return y, todo

    @staticmethod
    def backward(ctx, grad, _grad_todo):
        y, special = ctx.saved_tensors
        if backward_in_torch_ops(grad):   # create_graph=True or batched gradients: the same formula, differentiable
            return _differentiable_backward(y, grad, special, ctx.scale, ctx.mode), None, None, None
        dx = _run_backward(_rows(y), grad, special, ctx.scale, ctx.mode)
        return (dx if dx.shape == grad.shape else dx.reshape(grad.shape)), None, None, None


class _LogSumExpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, algorithm):
        _, lse, _, todo = _run_forward(x, 1.0, algorithm, _k.LSE)
        lse = lse.reshape(x.shape[:-1]).detach()   # (not a view made inside the Function, as above)
        todo = todo.reshape(x.shape[:-1])
        ctx.save_for_backward(x, lse, todo)
        ctx.algorithm = algorithm
        ctx.mark_non_differentiable(todo)
        return lse, todo

    @staticmethod
    def backward(ctx, grad, _grad_todo):
        x, lse, todo = ctx.saved_tensors
        if backward_in_torch_ops(grad):   # create_graph=True or batched: d lse / dx = softmax(x), differentiable
            # (not exp(x - lse): the rounded lse of a row of finfo.min fills gave each entry 1, not 1/n)
            finite = (torch.isfinite(lse) & ~todo).unsqueeze(-1)
            # the branch not taken must stay finite: a NaN there would reach x's gradient as 0 * NaN
            p = torch.softmax(torch.where(finite, x, torch.zeros_like(x)), -1)
            other = torch.where(torch.isnan(lse).unsqueeze(-1), torch.full_like(x, float("nan")), torch.zeros_like(x))
            factor = torch.where(finite, p, other)
            return torch.where(factor == 0, 0, factor * grad.unsqueeze(-1)), None
        # d lse / dx = softmax(x); rows whose reference gradient is 0 (+inf rows) are flagged
        p, _, special, again = _run_forward(x, 1.0, ctx.algorithm, _k.PROBS)
        redo = again & ~todo.reshape(-1)
        if bool(redo.any()):   # the forward row was fine: d lse / dx = exp(x - lse)
            x2, lse2 = x.reshape(p.shape), lse.reshape(-1, 1)
            p[redo] = torch.exp(x2[redo] - lse2[redo])
            special[redo] = 0
        # a row whose gradient is 0, and an entry of probability 0, pass no incoming gradient,
        # even an infinite or NaN one (the reference's: they are constants there)
        keep = (special == 0) & ~todo.reshape(-1)
        row_grad = torch.where(keep, grad.reshape(-1), 0).unsqueeze(-1)
        if all_finite(row_grad):
            return p.mul_(row_grad).reshape(x.shape), None
        # an infinite or NaN gradient reaches a subnormal probability, which the kernel's exp
        # flushes to 0: those rows take aten's softmax, which keeps it, as the reference does
        # (not a row with nothing visible, whose probabilities are all 0)
        hit = ~torch.isfinite(row_grad.squeeze(-1)) & torch.isfinite(lse.reshape(-1))
        p[hit] = torch.softmax(x.reshape(p.shape)[hit], -1)
        return torch.where(p == 0, 0, p * row_grad).reshape(x.shape), None


def softmax(x: torch.Tensor, temperature: float = 1.0, algorithm: str | None = None):
    """``(softmax(x / temperature), todo)`` along the last axis."""
    return _SoftmaxFunction.apply(x, 1.0 / temperature, _algorithm_code(algorithm, x.shape[-1]), _k.PROBS)


def log_softmax(x: torch.Tensor, temperature: float = 1.0, algorithm: str | None = None):
    """``(log_softmax(x / temperature), todo)`` along the last axis (two-pass runs as online)."""
    return _SoftmaxFunction.apply(x, 1.0 / temperature, _algorithm_code(algorithm, x.shape[-1]), _k.LOG_PROBS)


def logsumexp(x: torch.Tensor, algorithm: str | None = None):
    """``(log sum exp, todo)`` over the last axis (the axis removed)."""
    return _LogSumExpFunction.apply(x, _algorithm_code(algorithm, x.shape[-1]))
