"""Autograd-aware entry points to the numba softmax kernels (last axis, CPU).

Each function takes a CPU tensor, float32 or float64, contiguous, normalised along its
last axis, and returns what the reference in :mod:`softmaxkit.normalizers.softmax`
returns, within floating-point tolerance. Gradients come from the backward kernels
through :class:`torch.autograd.Function` (``gradcheck`` holds in float64); with
``create_graph=True`` the same formulas run as PyTorch ops, so higher derivatives work.
Argument checking and coverage decisions live in :mod:`softmaxkit.kernels.dispatch`.
"""

from __future__ import annotations

import torch

from . import softmax as _k
from . import sync_threads

#: The algorithm used when none is asked for: the fastest in the kernel benchmark.
DEFAULT_ALGORITHM = "two_pass"


def _algorithm_code(algorithm: str | None) -> int:
    name = DEFAULT_ALGORITHM if algorithm is None else algorithm
    if name not in _k.ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(_k.ALGORITHMS)}, got {algorithm!r}")
    return _k.ALGORITHMS[name]


def _rows(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1] if x.dim() else 1
    return x.detach().reshape(-1, n)


def _run_forward(x: torch.Tensor, scale: float, algorithm: int, mode: int):
    sync_threads()
    x2 = _rows(x)
    dtype = x2.numpy().dtype.type
    rows = x2.shape[0]
    lse = torch.empty(rows, dtype=x.dtype)
    special = torch.zeros(rows, dtype=torch.uint8)
    out = torch.empty_like(x2) if mode != _k.LSE else torch.empty((1, 0), dtype=x.dtype)
    _k.normalize_rows(x2.numpy(), out.numpy(), lse.numpy(), special.numpy(), dtype(scale), algorithm, mode)
    return out, lse, special


def _run_backward(y2: torch.Tensor, grad: torch.Tensor, special: torch.Tensor, scale: float, mode: int):
    sync_threads()
    g2 = grad.detach().reshape(y2.shape).contiguous()
    dx = torch.empty_like(y2)
    dtype = y2.numpy().dtype.type
    _k.backward_rows(y2.numpy(), g2.numpy(), dx.numpy(), special.numpy(), dtype(scale), mode)
    return dx


def _differentiable_backward(y, grad, special, scale, mode):
    """The backward kernel's formula in PyTorch ops, for double backward."""
    keep = (special == 0).reshape(grad.shape[:-1] + (1,))
    if mode == _k.PROBS:
        dx = y * (grad - (y * grad).sum(-1, keepdim=True))
    else:
        visible = y != float("-inf")
        total = torch.where(visible, grad, torch.zeros_like(grad)).sum(-1, keepdim=True)
        dx = torch.where(visible, grad - torch.exp(y) * total, torch.zeros_like(grad))
    return torch.where(keep, dx * scale, torch.zeros_like(dx))


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, algorithm, mode):
        out, _, special = _run_forward(x, scale, algorithm, mode)
        y = out.reshape(x.shape)
        ctx.save_for_backward(y, special)
        ctx.scale, ctx.mode = scale, mode
        return y

    @staticmethod
    def backward(ctx, grad):
        y, special = ctx.saved_tensors
        if torch.is_grad_enabled():   # create_graph=True: the same formula, differentiable
            return _differentiable_backward(y, grad, special, ctx.scale, ctx.mode), None, None, None
        dx = _run_backward(_rows(y), grad, special, ctx.scale, ctx.mode)
        return (dx if dx.shape == grad.shape else dx.reshape(grad.shape)), None, None, None


class _LogSumExpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, algorithm):
        _, lse, _ = _run_forward(x, 1.0, algorithm, _k.LSE)
        lse = lse.reshape(x.shape[:-1])
        ctx.save_for_backward(x, lse)
        ctx.algorithm = algorithm
        return lse

    @staticmethod
    def backward(ctx, grad):
        x, lse = ctx.saved_tensors
        if torch.is_grad_enabled():   # create_graph=True: differentiable through lse
            finite = torch.isfinite(lse).unsqueeze(-1)
            safe = torch.where(finite, lse.unsqueeze(-1), torch.zeros_like(lse.unsqueeze(-1)))
            p = torch.where(finite, torch.exp(x - safe), torch.zeros_like(x))
            return p * grad.unsqueeze(-1), None
        # d lse / dx = softmax(x); rows whose reference gradient is 0 (+inf rows) are flagged
        p, _, special = _run_forward(x, 1.0, ctx.algorithm, _k.PROBS)
        keep = (special == 0).to(x.dtype).unsqueeze(-1)
        dx = p * (grad.reshape(-1, 1) * keep)
        return dx.reshape(x.shape), None


def softmax(x: torch.Tensor, temperature: float = 1.0, algorithm: str | None = None) -> torch.Tensor:
    """``softmax(x / temperature)`` along the last axis."""
    return _SoftmaxFunction.apply(x, 1.0 / temperature, _algorithm_code(algorithm), _k.PROBS)


def log_softmax(x: torch.Tensor, temperature: float = 1.0, algorithm: str | None = None) -> torch.Tensor:
    """``log_softmax(x / temperature)`` along the last axis (two-pass runs as online)."""
    return _SoftmaxFunction.apply(x, 1.0 / temperature, _algorithm_code(algorithm), _k.LOG_PROBS)


def logsumexp(x: torch.Tensor, algorithm: str | None = None) -> torch.Tensor:
    """``log sum exp`` over the last axis (the axis removed)."""
    return _LogSumExpFunction.apply(x, _algorithm_code(algorithm))
