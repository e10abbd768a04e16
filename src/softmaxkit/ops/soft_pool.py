"""SoftPool: pooling that weights each activation of a window by its softmax."""

from __future__ import annotations

import math

import numpy as np
import torch

from .._checks import FLOATING_DTYPES, backward_in_torch_ops, check_int_in_range, is_functorch_wrapped, under_transform
from .._rows import compute_dtype
from ..functional import softmax
from ..kernels.dispatch import numba_available


def soft_pool2d(x: torch.Tensor, kernel_size, stride=None) -> torch.Tensor:
    r"""2-d SoftPool over (N, C, H, W) or (C, H, W) inputs.

    .. math:: \tilde a_R = \sum_{i \in R} \frac{e^{a_i}}{\sum_{j \in R} e^{a_j}}\, a_i

    for each window ``R`` of ``kernel_size`` moved by ``stride`` (default
    ``kernel_size``), without padding; the output size follows ``torch.nn.functional.avg_pool2d``
    with ``padding=0, ceil_mode=False``. Stergiou, Poppe & Kalliatakis (2021),
    "Refining activation downsampling with SoftPool", arXiv 2101.00440.

    The window softmax is :func:`softmaxkit.functional.softmax` (max-shifted, so large
    activations do not overflow as ``exp(a)`` would). Windows are strided views of
    ``x``; the one copy made is the (…, kh * kw) window tensor. Differentiable;
    float16/bfloat16 computed in float32.

    A ``-inf`` activation gets weight 0 (it is a masked entry of the window softmax) and
    receives zero gradient. A window of only ``-inf`` gives ``-inf``, as
    ``max_pool2d`` and ``avg_pool2d`` do (and the limit of the formula as every activation
    of the window goes to ``-inf``), with zero gradient. NaN propagates to its window.

    Args:
        x: (N, C, H, W) or (C, H, W), floating point.
        kernel_size: int or (kh, kw), each >= 1 and no larger than the input.
        stride: int or (sh, sw), each >= 1; default ``kernel_size``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOATING_DTYPES:   # (float8: a TypeError from the kernel's conversion)
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() not in (3, 4):
        raise ValueError(f"x must have shape (N, C, H, W) or (C, H, W), got {tuple(x.shape)}")
    kh, kw = _pair(kernel_size, "kernel_size")
    sh, sw = (kh, kw) if stride is None else _pair(stride, "stride")
    height, width = x.shape[-2:]
    if kh > height or kw > width:
        raise ValueError(f"kernel_size ({kh}, {kw}) is larger than the input's (H, W) = ({height}, {width})")
    # a stride past the input leaves the first window only, as one equal to it does (10**29
    # reached the kernel as a Python int past int64)
    sh, sw = min(sh, height), min(sw, width)
    if _kernel_applies(x):
        return _SoftPool2d.apply(x, kh, kw, sh, sw)
    return reference(x, kh, kw, sh, sw)


def reference(x, kh, kw, sh, sw):
    """SoftPool from torch operations on the window tensor (differentiable to any order)."""
    a = x.to(compute_dtype(x.dtype))
    windows = a.unfold(-2, kh, sh).unfold(-2, kw, sw)          # (..., Ho, Wo, kh, kw)
    windows = windows.reshape(*windows.shape[:-2], kh * kw)
    weights = softmax(windows, dim=-1)
    # an activation of weight 0 (-inf, or finfo.max below the window's maximum) adds nothing; as a
    # value it would give 0 * -inf = NaN forward, or backward where a_i - out overflows
    masked = windows == float("-inf")
    pooled = (weights * torch.where(weights == 0, torch.zeros_like(windows), windows)).sum(-1)
    pooled = torch.where(masked.all(-1), torch.full_like(pooled, float("-inf")), pooled)
    return pooled.to(x.dtype)


def _kernel_applies(x) -> bool:
    """The numba kernels run on plain CPU tensors, outside ``torch.compile``, ``torch.func``
    transforms and forward-mode AD (the reference runs there)."""
    return (x.device.type == "cpu" and x.layout == torch.strided and not torch.compiler.is_compiling()
            and not under_transform() and not is_functorch_wrapped(x) and numba_available())


class _SoftPool2d(torch.autograd.Function):
    """SoftPool by the numba kernels (:mod:`._soft_pool_kernel`): one pass over each window
    forward, and the closed-form gradient ``w_i (1 + a_i - out)`` backward. An input with a NaN
    or ``+inf`` in a window takes the reference, forward and backward; so does a second-order
    gradient (the reference's graph, rebuilt from the saved input)."""

    @staticmethod
    def forward(ctx, x, kh, kw, sh, sw):
        from ._soft_pool_kernel import soft_pool_forward

        a = x.detach().to(compute_dtype(x.dtype)).contiguous()
        height, width = a.shape[-2:]
        planes = a.view(math.prod(a.shape[:-2]), height, width)
        shape = (planes.shape[0], (height - kh) // sh + 1, (width - kw) // sw + 1)
        out, shift, total = (a.new_empty(shape) for _ in range(3))
        odd = np.zeros(shape[0], np.uint8)
        if out.numel():
            _run(soft_pool_forward, planes.numpy(), out.numpy(), shift.numpy(), total.numpy(), kh, kw, sh, sw, odd)
        ctx.window = (kh, kw, sh, sw)
        ctx.by_reference = bool(odd.any())
        if ctx.by_reference:
            out = reference(a, kh, kw, sh, sw)
        out = out.view(*a.shape[:-2], *shape[-2:])
        ctx.save_for_backward(x, a, out, shift, total)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        from ._soft_pool_kernel import soft_pool_backward

        x, a, out, shift, total = ctx.saved_tensors
        if ctx.by_reference or backward_in_torch_ops(grad):   # (a batched grad has no data for the kernel)
            create_graph = torch.is_grad_enabled()
            with torch.enable_grad():
                leaf = x if create_graph else x.detach().requires_grad_()
                pooled = reference(leaf, *ctx.window)
                (dx,) = torch.autograd.grad(pooled, leaf, grad, create_graph=create_graph)
            return dx, None, None, None, None
        height, width = a.shape[-2:]
        g = grad.to(a.dtype).contiguous().view(shift.shape)
        dx = torch.zeros_like(a)
        if g.numel():
            _run(soft_pool_backward, a.view(shift.shape[0], height, width).numpy(), out.view(shift.shape).numpy(),
                 shift.numpy(), total.numpy(), g.numpy(), dx.view(shift.shape[0], height, width).numpy(), *ctx.window)
        return dx.to(x.dtype), None, None, None, None


def _run(kernel, *args) -> None:
    from ..kernels.cpu import keep_torch_threads, sync_threads

    sync_threads()
    keep_torch_threads(kernel, *args)


def _pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
        return check_int_in_range(value[0], name, 1), check_int_in_range(value[1], name, 1)
    v = check_int_in_range(value, name, 1)
    return v, v
