r"""Triton softmax and log-softmax along the last axis, forward and backward kernels.

One program per row. The row is read in tiles of ``BLOCK`` entries with the online
normaliser (Milakov & Gimelshein 2018, arXiv 1805.02867): pass 1 keeps the running
maximum ``m`` and sum ``d``, merging each tile with
``(m, d) (+) (m', d') = (M, d e^{m-M} + d' e^{m'-M})``; pass 2 writes
``exp(x/T - m) / d`` (log-softmax: ``(x - m) / T - log d``). Computation is in float32
whatever the input dtype.

The temperature applies after the shift, ``exp((x - m) / T)``, so ``x / T`` never overflows.
Reference semantics kept: a row of ``-inf`` gives zeros (log: ``-inf``), a row whose maximum
is ``+inf`` gives equal weights on its ``+inf`` entries (and a zero gradient: the kernel flags
such rows), a row holding NaN is NaN.

The backward kernel reads the output and the incoming gradient twice (the row's inner
product, then the write): softmax ``dx = (y g - y <y, g>) / T``, log-softmax
``dx = (g - e^y sum(g)) / T``, an entry of probability 0 (log: of ``-inf``) passing no
gradient and taking no part in the sum, even an infinite one (the reference's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..._checks import check_floating, check_positive
from . import TEMPERATURE_RANGE

MAX_BLOCK = 4096


def _num_warps(block: int) -> int:
    """Warps per program for a tile of ``block`` entries (Triton's fused-softmax tutorial's rule)."""
    return 16 if block >= 4096 else 8 if block >= 2048 else 4


@triton.jit
def _shifted(x, m, scale):
    """``(x - m) scale`` with ``m`` the (finite) row maximum: the scale applies after the
    shift, so that ``x scale`` cannot overflow (3e38 at T = 0.5 read as +inf), and ``x = m`` gives
    0 even at a scale of ``inf`` (a temperature below ``1 / finfo.max``), a ``-inf`` score ``-inf``
    even at a scale of 0 (a temperature above ``finfo.max``)."""
    d = x - m
    z = tl.where(d == 0, 0.0, d * scale)
    # x - m overflowed (finfo.min beside finfo.max): x scale - m scale, exact enough where it matters,
    # at a scale below 1; -inf (weight 0) otherwise, and for a -inf score (-inf times a scale of 0: NaN)
    z = tl.where((d == float("-inf")) & (x > float("-inf")), x * scale - m * scale, z)
    return tl.where(x == float("-inf"), float("-inf"), z)


@triton.jit
def _exp(z, PRECISE: tl.constexpr):
    """``exp(z)``: CUDA's ``expf`` (within an ulp or two) when ``PRECISE``; else Triton's
    ``exp2(z log2 e)``, whose relative error grows with ``|z|`` (2e-7 at the top of a row: the
    float32 forward's error was 5x torch's; kept for the interpreter, which has no libdevice)."""
    if PRECISE:
        return libdevice.exp(z)
    else:
        return tl.exp(z)


@triton.jit
def _log(d, PRECISE: tl.constexpr):
    """``log(d)``: CUDA's ``logf`` when ``PRECISE``, else Triton's ``log2(d) ln 2`` (an absolute
    error of about 1e-7 that the log-softmax's gradient multiplies by the row's sum of
    incoming gradients: 8x torch's error at 9000 entries, on an H200)."""
    if PRECISE:
        return libdevice.log(d)
    else:
        return tl.log(d)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, limit_ptr, n, stride, scale, BLOCK: tl.constexpr, LOG: tl.constexpr,
                    PRECISE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    m = tl.full((), float("-inf"), tl.float32)
    d = tl.zeros((), tl.float32)
    nans = tl.zeros((), tl.int32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        nans += tl.sum((x != x).to(tl.int32), axis=0)
        mb = tl.max(x, axis=0)
        new_m = tl.maximum(m, mb)
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        safe_m = tl.where(new_m == float("inf"), 0.0, safe_m)
        e = tl.where(new_m == float("inf"), (x == float("inf")).to(tl.float32),
                     _exp(_shifted(x, safe_m, scale), PRECISE))
        old = tl.where(m == new_m, 1.0, _exp(_shifted(m, safe_m, scale), PRECISE))
        old = tl.where(new_m == float("inf"), tl.where(m == float("inf"), 1.0, 0.0), old)
        d = d * old + tl.sum(e, axis=0)
        m = new_m
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    safe_m = tl.where(m == float("inf"), 0.0, safe_m)
    # d is 0 only on a row of -inf (zeros); a NaN entry makes the whole row NaN (counted apart:
    # next to a +inf the weights are the +inf indicator, which reads NaN as 0)
    inv = tl.where(d == 0, 0.0, 1.0 / d)
    inv = tl.where(nans > 0, float("nan"), inv)
    log_d = tl.where(nans > 0, float("nan"), _log(d, PRECISE))
    tl.store(limit_ptr + row, (m == float("inf")).to(tl.int8))
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        if LOG:
            z = tl.where(m == float("inf"), tl.where(x == float("inf"), 0.0, float("-inf")),
                         _shifted(x, safe_m, scale))
            out = tl.where(d == 0, float("-inf"), z - log_d)
        else:
            e = tl.where(m == float("inf"), (x == float("inf")).to(tl.float32),
                         _exp(_shifted(x, safe_m, scale), PRECISE))
            out = e * inv
        tl.store(y_row + offs, out.to(y_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _log_kept(x_row, offs, n, y):
    """The entries of a log-softmax row that pass a gradient: those of a score above ``-inf``
    (an output of ``-inf`` from a finite score, ``(x - m) / T`` past ``finfo.max``, passes ``g``).
    The input is read only where the output is ``-inf``."""
    minus_inf = y == float("-inf")
    x = tl.load(x_row + offs, mask=(offs < n) & minus_inf, other=0.0).to(tl.float32)
    return ~minus_inf | (x > float("-inf"))


@triton.jit
def _backward_tile(y_row, g_row, x_row, offs, n, LOG: tl.constexpr):
    """A tile's output and incoming gradient (float32), and the entries that pass a gradient
    (nonzero probability; log-softmax: :func:`_log_kept`)."""
    y = tl.load(y_row + offs, mask=offs < n, other=float("-inf") if LOG else 0.0).to(tl.float32)
    g = tl.load(g_row + offs, mask=offs < n, other=0.0).to(tl.float32)
    if LOG:
        kept = _log_kept(x_row, offs, n, y)
    else:
        kept = y != 0
    return y, g, kept


@triton.jit
def _softmax_backward_kernel(y_ptr, g_ptr, x_ptr, dx_ptr, limit_ptr, n, scale, BLOCK: tl.constexpr,
                             LOG: tl.constexpr, PRECISE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * n
    x_row = x_ptr + row * n
    g_row = g_ptr + row * n
    dx_row = dx_ptr + row * n
    # the row's sum in float64: summed in float32 over 9000 entries, its rounding (times a
    # probability) made the log-softmax gradient's error 8x torch's on an H200
    acc = tl.zeros((), tl.float64)
    for start in range(0, n, BLOCK):
        y, g, kept = _backward_tile(y_row, g_row, x_row, start + tl.arange(0, BLOCK), n, LOG)
        acc += tl.sum(tl.where(kept, g if LOG else y * g, 0.0).to(tl.float64), axis=0)
    total = acc.to(tl.float32)
    limit = tl.load(limit_ptr + row)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        y, g, kept = _backward_tile(y_row, g_row, x_row, offs, n, LOG)
        if LOG:
            inner = tl.where(kept, g - _exp(y, PRECISE) * total, 0.0)
        else:
            inner = tl.where(kept, y * g - y * total, 0.0)
        dx = tl.where(inner == 0, 0.0, inner * scale)   # (a one-hot row at a scale of inf)
        # a row whose maximum is +inf: its output is the limit, whose gradient is 0
        dx = tl.where(limit != 0, 0.0, dx)
        tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=offs < n)


def _grid(rows: int, n: int) -> tuple[tuple[int], int, int]:
    block = min(triton.next_power_of_2(n), MAX_BLOCK)
    return (rows,), block, _num_warps(block)


def _forward(x: torch.Tensor, scale: float, log: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The softmax (log-softmax), an int8 per row: whether its maximum is ``+inf`` (its
    output is the limit), and the contiguous input rows the kernel read."""
    n = x.shape[-1]
    # the kernel reads and writes rows at one stride with unit steps: a strided view (a
    # column slice, a transpose, every other row) is copied first, or it would read the
    # wrong entries and write past the output
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    limit = torch.zeros(x2.shape[0], dtype=torch.int8, device=x.device)
    if x2.shape[0] and n:
        grid, block, warps = _grid(x2.shape[0], n)
        _softmax_kernel[grid](x2, y, limit, n, x2.stride(0), scale, BLOCK=block, LOG=log,
                              PRECISE=not triton.knobs.runtime.interpret, num_warps=warps)
    return y.reshape(x.shape), limit, x2


def _backward(y, grad, x, limit, scale: float, log: bool) -> torch.Tensor:
    """``dx`` from the output ``y``, the incoming gradient and, for the log-softmax, the
    contiguous input ``x`` (read where ``y`` is ``-inf``; for the softmax ``x`` is unused)."""
    n = y.shape[-1]
    g = grad.reshape(-1, n).contiguous()
    dx = torch.empty(g.shape, dtype=y.dtype, device=y.device)
    if g.shape[0] and n:
        grid, block, warps = _grid(g.shape[0], n)
        _softmax_backward_kernel[grid](y, g, x, dx, limit, n, scale, BLOCK=block, LOG=log,
                                       PRECISE=not triton.knobs.runtime.interpret, num_warps=warps)
    return dx.reshape(y.shape)


class _TritonSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, log):
        y, limit, rows = _forward(x.detach(), scale, log)
        # the log-softmax's backward reads its input where the output is -inf (kept alive: the
        # memory of one more tensor of x's size, where torch keeps only the output)
        ctx.save_for_backward(y, limit, rows if log else limit)
        ctx.scale, ctx.log = scale, log
        return y

    @staticmethod
    def backward(ctx, grad):
        y, limit, rows = ctx.saved_tensors
        return _backward(y, grad, rows if ctx.log else y, limit, ctx.scale, ctx.log), None, None


def _apply(x, temperature, log):
    check_floating(x, "x")
    check_positive(temperature, "temperature", allow_tensor=False, finite=True)
    low, high = TEMPERATURE_RANGE
    if not low <= temperature <= high:
        raise ValueError(f"temperature must lie in [{low:.3g}, {high:.3g}] for the Triton softmax (its reciprocal "
                         f"a normal float32), got {temperature}; sk.softmax takes any T > 0")
    return _TritonSoftmax.apply(x, 1.0 / temperature, log)


def softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``softmax(x / temperature)`` along the last axis of a CUDA tensor (a strided one is copied
    first); ``temperature`` a number in :data:`TEMPERATURE_RANGE` (its reciprocal a normal float32).
    A row holding NaN gives NaN, as ``torch.softmax``."""
    return _apply(x, temperature, False)


def log_softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(x / temperature)`` along the last axis of a CUDA tensor, as :func:`softmax`
    (a row of ``-inf`` gives ``-inf``; one whose maximum is ``+inf``, ``-log`` of its count of
    ``+inf`` entries there and ``-inf`` elsewhere)."""
    return _apply(x, temperature, True)
