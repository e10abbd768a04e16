"""Autograd-aware alpha-entmax on the numba kernels (last axis, CPU, float32 / float64).

Returns what :func:`softmaxkit.functional.entmax` returns within floating-point
tolerance; coverage (alpha range, layout) is decided in :mod:`softmaxkit.kernels.dispatch`.
Rows with a NaN or a ``+inf`` are recomputed by the reference.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import sparse as _k
from . import sync_threads


def _alpha_rows(alpha, rows: int) -> torch.Tensor:
    if isinstance(alpha, torch.Tensor):
        return alpha.detach().reshape(rows).to(torch.float64).contiguous()
    return torch.full((rows,), float(alpha), dtype=torch.float64)


class _EntmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha_tensor, alpha_value):
        sync_threads()
        n = x.shape[-1]
        x2 = x.detach().reshape(-1, n)
        rows = x2.shape[0]
        alpha = _alpha_rows(alpha_tensor if alpha_tensor is not None else alpha_value, rows)
        out = torch.empty_like(x2)
        special = torch.zeros(rows, dtype=torch.uint8)
        _k.entmax_rows(x2.numpy(), out.numpy(), alpha.numpy(), special.numpy())
        bad = special.nonzero().flatten()
        if bad.numel():
            from ...functional.sparse import _entmax_reference
            from ..dispatch import use_backend
            a = alpha[bad].to(x.dtype).unsqueeze(-1) if alpha_tensor is not None else alpha_value
            with use_backend("reference"), torch.no_grad():
                out[bad] = _entmax_reference(x2[bad], -1, None, a)
        ctx.save_for_backward(out, alpha, special)
        ctx.has_alpha_tensor = alpha_tensor is not None
        return out.reshape(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        out, alpha, special = ctx.saved_tensors
        sync_threads()
        g2 = grad.reshape(out.shape).contiguous()
        dx = torch.empty_like(out)
        dalpha = torch.empty(out.shape[0], dtype=torch.float64)
        _k.entmax_backward_rows(out.numpy(), g2.numpy(), alpha.numpy(), dx.numpy(), dalpha.numpy())
        keep = special == 0
        if not bool(keep.all()):
            # +inf rows: the reference's limit is constant (zero gradient); NaN rows give NaN
            dx[~keep] = torch.where(torch.isnan(out[~keep]), out[~keep], torch.zeros_like(out[~keep]))
            dalpha[~keep] = 0
        grad_alpha = None
        if ctx.has_alpha_tensor and ctx.needs_input_grad[1]:
            grad_alpha = dalpha.to(grad.dtype).reshape(grad.shape[:-1])
        return dx.reshape(grad.shape), grad_alpha, None


def entmax(x: torch.Tensor, alpha) -> torch.Tensor:
    """alpha-entmax along the last axis; ``alpha`` a float or a tensor of shape ``x.shape[:-1]``."""
    if isinstance(alpha, torch.Tensor):
        return _EntmaxFunction.apply(x, alpha, None)
    return _EntmaxFunction.apply(x, None, float(alpha))
