r"""Triton softmax along the last axis (forward kernel; backward in PyTorch).

One program per row. The row is read in tiles of ``BLOCK`` entries with the online
normaliser (Milakov & Gimelshein 2018, arXiv 1805.02867): pass 1 keeps the running
maximum ``m`` and sum ``d``, merging each tile with
``(m, d) (+) (m', d') = (M, d e^{m-M} + d' e^{m'-M})``; pass 2 writes
``exp(x/T - m) / d``. Computation is in float32 whatever the input dtype.

Reference semantics kept: a row of ``-inf`` gives zeros, a row whose maximum is
``+inf`` gives equal weights on its ``+inf`` entries. The backward is
``dx = y (g - <y, g>) / T`` in PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._checks import check_floating, check_positive

MAX_BLOCK = 4096


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n, stride, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    m = tl.full((), float("-inf"), tl.float32)
    d = tl.zeros((), tl.float32)
    nans = tl.zeros((), tl.int32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < n, other=float("-inf")).to(tl.float32) * scale
        nans += tl.sum((x != x).to(tl.int32), axis=0)
        mb = tl.max(x, axis=0)
        new_m = tl.maximum(m, mb)
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        safe_m = tl.where(new_m == float("inf"), 0.0, safe_m)
        e = tl.where(new_m == float("inf"), (x == float("inf")).to(tl.float32), tl.exp(x - safe_m))
        old = tl.where(m == new_m, 1.0, tl.exp(m - safe_m))
        old = tl.where(new_m == float("inf"), tl.where(m == float("inf"), 1.0, 0.0), old)
        d = d * old + tl.sum(e, axis=0)
        m = new_m
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    safe_m = tl.where(m == float("inf"), 0.0, safe_m)
    # d is 0 only on a row of -inf (zeros); a NaN entry makes the whole row NaN (counted apart:
    # next to a +inf the weights are the +inf indicator, which reads NaN as 0)
    inv = tl.where(d == 0, 0.0, 1.0 / d)
    inv = tl.where(nans > 0, float("nan"), inv)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < n, other=float("-inf")).to(tl.float32) * scale
        e = tl.where(m == float("inf"), (x == float("inf")).to(tl.float32), tl.exp(x - safe_m))
        tl.store(y_row + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=offs < n)


def _forward(x: torch.Tensor, scale: float) -> torch.Tensor:
    n = x.shape[-1]
    # the kernel reads and writes rows at one stride with unit steps: a strided view (a
    # column slice, a transpose, every other row) is copied first, or it would read the
    # wrong entries and write past the output
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    if x2.shape[0] and n:
        block = min(triton.next_power_of_2(n), MAX_BLOCK)
        _softmax_kernel[(x2.shape[0],)](x2, y, n, x2.stride(0), scale, BLOCK=block)
    return y.reshape(x.shape)


class _TritonSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        y = _forward(x.detach(), scale)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        g = grad.to(torch.float32)
        yf = y.to(torch.float32)
        dx = yf * (g - (yf * g).sum(-1, keepdim=True)) * ctx.scale
        return dx.to(y.dtype), None


def softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``softmax(x / temperature)`` along the last axis of a CUDA tensor (a strided one is copied
    first); ``temperature`` a finite number > 0. A row holding NaN gives NaN, as ``torch.softmax``."""
    check_floating(x, "x")
    check_positive(temperature, "temperature", allow_tensor=False, finite=True)
    return _TritonSoftmax.apply(x, 1.0 / temperature)
