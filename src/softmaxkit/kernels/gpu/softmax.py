r"""Triton softmax along the last axis (forward kernel; backward in PyTorch).

One program per row. The row is read in tiles of ``BLOCK`` entries with the online
normaliser (Milakov & Gimelshein 2018, arXiv 1805.02867): pass 1 keeps the running
maximum ``m`` and sum ``d``, merging each tile with
``(m, d) (+) (m', d') = (M, d e^{m-M} + d' e^{m'-M})``; pass 2 writes
``exp(x/T - m) / d``. Computation is in float32 whatever the input dtype.

The temperature applies after the shift, ``exp((x - m) / T)``, so ``x / T`` never overflows.
Reference semantics kept: a row of ``-inf`` gives zeros, a row whose maximum is
``+inf`` gives equal weights on its ``+inf`` entries (and a zero gradient: the kernel flags
such rows). The backward is ``dx = y (g - <y, g>) / T`` in PyTorch, an entry of probability
0 passing no gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._checks import check_floating, check_positive
from . import TEMPERATURE_RANGE

MAX_BLOCK = 4096


@triton.jit
def _scaled_exp(x, m, scale):
    """``exp((x - m) scale)`` with ``m`` the (finite) row maximum: the scale applies after the
    shift, so that ``x scale`` cannot overflow (3e38 at T = 0.5 read as +inf), and ``x = m`` gives
    1 even at a scale of ``inf`` (a temperature below ``1 / finfo.max``), a ``-inf`` score 0 even
    at a scale of 0 (a temperature above ``finfo.max``)."""
    d = x - m
    z = tl.where(d == 0, 0.0, d * scale)
    # x - m overflowed (finfo.min beside finfo.max): x scale - m scale, exact enough where it matters,
    # at a scale below 1; -inf (weight 0) otherwise, and for a -inf score (-inf times a scale of 0: NaN)
    z = tl.where((d == float("-inf")) & (x > float("-inf")), x * scale - m * scale, z)
    return tl.exp(tl.where(x == float("-inf"), float("-inf"), z))


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, limit_ptr, n, stride, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
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
        e = tl.where(new_m == float("inf"), (x == float("inf")).to(tl.float32), _scaled_exp(x, safe_m, scale))
        old = tl.where(m == new_m, 1.0, _scaled_exp(m, safe_m, scale))
        old = tl.where(new_m == float("inf"), tl.where(m == float("inf"), 1.0, 0.0), old)
        d = d * old + tl.sum(e, axis=0)
        m = new_m
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    safe_m = tl.where(m == float("inf"), 0.0, safe_m)
    # d is 0 only on a row of -inf (zeros); a NaN entry makes the whole row NaN (counted apart:
    # next to a +inf the weights are the +inf indicator, which reads NaN as 0)
    inv = tl.where(d == 0, 0.0, 1.0 / d)
    inv = tl.where(nans > 0, float("nan"), inv)
    tl.store(limit_ptr + row, (m == float("inf")).to(tl.int8))
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        e = tl.where(m == float("inf"), (x == float("inf")).to(tl.float32), _scaled_exp(x, safe_m, scale))
        tl.store(y_row + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=offs < n)


def _forward(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax, and a bool per row: whether its maximum is ``+inf`` (its output is the limit)."""
    n = x.shape[-1]
    # the kernel reads and writes rows at one stride with unit steps: a strided view (a
    # column slice, a transpose, every other row) is copied first, or it would read the
    # wrong entries and write past the output
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    limit = torch.zeros(x2.shape[0], dtype=torch.int8, device=x.device)
    if x2.shape[0] and n:
        block = min(triton.next_power_of_2(n), MAX_BLOCK)
        _softmax_kernel[(x2.shape[0],)](x2, y, limit, n, x2.stride(0), scale, BLOCK=block)
    return y.reshape(x.shape), limit.reshape(x.shape[:-1]).bool()


class _TritonSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        y, limit = _forward(x.detach(), scale)
        ctx.save_for_backward(y, limit)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        (y, limit) = ctx.saved_tensors
        g = grad.to(torch.float32)
        yf = y.to(torch.float32)
        # an entry of probability 0 passes no gradient, even an infinite one (the reference's)
        kept = yf != 0
        yg = torch.where(kept, yf * g, 0.0)
        inner = torch.where(kept, yf * g - yf * yg.sum(-1, keepdim=True), 0.0)
        dx = torch.where(inner == 0, 0.0, inner * ctx.scale)   # (a one-hot row at a scale of inf)
        # a row whose maximum is +inf: its output is the limit, whose gradient is 0
        dx = dx.masked_fill(limit.unsqueeze(-1), 0.0)
        return dx.to(y.dtype), None


def softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``softmax(x / temperature)`` along the last axis of a CUDA tensor (a strided one is copied
    first); ``temperature`` a number in :data:`TEMPERATURE_RANGE` (its reciprocal a normal float32).
    A row holding NaN gives NaN, as ``torch.softmax``."""
    check_floating(x, "x")
    check_positive(temperature, "temperature", allow_tensor=False, finite=True)
    low, high = TEMPERATURE_RANGE
    if not low <= temperature <= high:
        raise ValueError(f"temperature must lie in [{low:.3g}, {high:.3g}] for the Triton softmax (its reciprocal "
                         f"a normal float32), got {temperature}; sk.softmax takes any T > 0")
    return _TritonSoftmax.apply(x, 1.0 / temperature)
