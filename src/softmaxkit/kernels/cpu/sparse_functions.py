"""Autograd-aware alpha-entmax on the numba kernels (last axis, CPU, float32 / float64).

Returns ``(p, todo)``: ``p`` equals the alpha-entmax reference definition within
floating-point tolerance on every row not marked in ``todo`` (rows with a NaN or a
``+inf``, or that the kernel did not finish); those hold zeros (zero gradient) and the
dispatcher recomputes them with the reference. Coverage (alpha range, layout) is decided
in :mod:`softmaxkit.kernels.dispatch`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..._checks import backward_in_torch_ops
from .. import memory
from ..entmax_grad import centered, dp_dalpha, entmax_weights
from . import FLAG_TODO, call_kernel, keep_torch_threads, sync_threads
from . import sparse as _k


def _alpha_rows(alpha, rows: int) -> torch.Tensor:
    if isinstance(alpha, torch.Tensor):
        return alpha.detach().reshape(rows).to(torch.float64).contiguous()
    return torch.full((rows,), float(alpha), dtype=torch.float64)


def _differentiable_backward(p, grad, alpha, special):
    """The reference's closed-form gradients (:mod:`..entmax_grad`) in torch ops, for a graph of
    the gradient (double backward); in float64 as the reference computes them. ``alpha`` is a
    number or a tensor of shape ``p.shape[:-1] + (1,)``."""
    wide = p.double()
    u = (alpha - 1).double() if isinstance(alpha, torch.Tensor) else torch.tensor(alpha - 1, dtype=torch.float64)
    g, g_sum, on, log_p = entmax_weights(wide, u)
    dx = centered(g, grad.double(), g_sum, dominant=True)
    terms = torch.where(on, grad.double() * dp_dalpha(wide, u, g, g_sum, on, log_p), torch.zeros_like(wide))
    keep = special == 0
    dx = torch.where(keep, dx, torch.zeros_like(dx)).to(p.dtype)
    dalpha = torch.where(keep, terms.sum(-1, keepdim=True), torch.zeros_like(g_sum)).squeeze(-1)
    return dx, dalpha


class _EntmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha_tensor, alpha_value):
        threads = sync_threads()
        n = x.shape[-1]
        x2 = x.detach().reshape(-1, n)
        rows = x2.shape[0]
        alpha = _alpha_rows(alpha_tensor if alpha_tensor is not None else alpha_value, rows)
        out = memory.empty_like(x2)
        special = torch.full((rows,), FLAG_TODO, dtype=torch.uint8)
        stop = np.full(rows, n, dtype=np.int64)
        tau = np.empty(rows, dtype=np.float64)
        shift = np.empty(rows, dtype=np.float64)
        call_kernel("entmax", _k.entmax_rows, x2.numpy(), out.numpy(), alpha.numpy(), stop, tau, shift,
                    special.numpy(), _k.GROUPS_PER_THREAD * threads)
        todo = special != 0
        if bool(todo.any()):
            out[todo] = 0
            special[todo] = 1
        y = out.reshape(x.shape).detach()   # (not a view made inside the Function: a user's in-place op then works)
        ctx.save_for_backward(y, alpha, special, alpha_tensor)
        ctx.has_alpha_tensor = alpha_tensor is not None
        ctx.alpha_value = alpha_value
        todo = todo.reshape(x.shape[:-1])
        ctx.mark_non_differentiable(todo)
        return y, todo

    @staticmethod
    def backward(ctx, grad, _grad_todo):
        y, alpha, special, alpha_tensor = ctx.saved_tensors
        if backward_in_torch_ops(grad):   # create_graph=True or batched gradients: the same formulas, differentiable
            a = alpha_tensor.unsqueeze(-1) if ctx.has_alpha_tensor else ctx.alpha_value
            dx, dalpha = _differentiable_backward(y, grad, a, special.reshape(y.shape[:-1] + (1,)))
            return dx, (dalpha.to(alpha_tensor.dtype) if ctx.has_alpha_tensor else None), None
        out = y.detach().reshape(-1, y.shape[-1])
        sync_threads()
        g2 = grad.reshape(out.shape).contiguous()
        dx = memory.empty_like(out)
        dalpha = torch.empty(out.shape[0], dtype=torch.float64)
        want_alpha = bool(ctx.has_alpha_tensor and ctx.needs_input_grad[1])
        keep_torch_threads(_k.entmax_backward_rows, out.numpy(), g2.numpy(), alpha.numpy(), dx.numpy(),
                           dalpha.numpy(), want_alpha)
        keep = special == 0
        if not bool(keep.all()):   # rows recomputed by the reference: their gradient comes from it
            dx[~keep] = 0
            dalpha[~keep] = 0
        grad_alpha = None
        if want_alpha:
            grad_alpha = dalpha.to(alpha_tensor.dtype).reshape(grad.shape[:-1])   # (float64 for a float64 alpha)
        return (dx if dx.shape == grad.shape else dx.reshape(grad.shape)), grad_alpha, None


def entmax(x: torch.Tensor, alpha):
    """``(alpha-entmax, todo)`` along the last axis; ``alpha`` a float or a tensor of shape ``x.shape[:-1]``."""
    if isinstance(alpha, torch.Tensor):
        return _EntmaxFunction.apply(x, alpha, None)
    return _EntmaxFunction.apply(x, None, float(alpha))


def entmax_in_place(x: torch.Tensor, alpha: float, stop: torch.Tensor | None = None):
    """alpha-entmax of the rows of ``x`` (CPU, C-contiguous, float32 / float64, last axis)
    written over ``x``, without autograd (the fused attention path).

    ``stop``: int64 per row (``x.shape[:-1]``), the visible prefix of each row; entries at or
    after it are hidden (set to 0) whatever they hold. ``-inf`` entries are hidden too.
    Returns ``(tau, shift, todo)``: each row's threshold and maximum (float64,
    ``x.shape[:-1]``) with ``p = [(alpha - 1) (x - shift) - tau]_+^{1/(alpha - 1)}`` (both 0 for
    a row with nothing visible), and the rows the kernel left to the reference (a NaN or a
    ``+inf``), which still hold their input.
    """
    threads = sync_threads()
    n = x.shape[-1]
    x2 = x.view(-1, n)
    rows = x2.shape[0]
    stops = np.full(rows, n, dtype=np.int64) if stop is None else stop.reshape(rows).to(torch.int64).numpy()
    alphas = np.full(rows, float(alpha), dtype=np.float64)
    tau = np.zeros(rows, dtype=np.float64)
    shift = np.zeros(rows, dtype=np.float64)
    special = np.full(rows, FLAG_TODO, dtype=np.uint8)
    a = x2.detach().numpy()
    call_kernel("entmax", _k.entmax_rows, a, a, alphas, stops, tau, shift, special, _k.GROUPS_PER_THREAD * threads)
    shape = x.shape[:-1]
    return (torch.from_numpy(tau).reshape(shape), torch.from_numpy(shift).reshape(shape),
            torch.from_numpy(special != 0).reshape(shape))


def entmax_attend(x: torch.Tensor, v: torch.Tensor, alpha: float, stop: torch.Tensor | None = None):
    """``alpha-entmax(x) @ v`` from each row's support, without the weight matrix and without
    autograd (the fused attention path). ``x``: ``(heads, rows, n)`` scores (CPU, C-contiguous,
    float32 / float64; ``-inf`` hidden); ``v``: ``(heads, n, d)``, same dtype; ``stop``: int64
    per row (``(heads, rows)``), the visible prefix. Returns ``(out, tau, shift, todo)``: ``out``
    ``(heads, rows, d)``, the thresholds and maxima as in :func:`entmax_in_place`, and the rows
    left to the reference (a NaN or a ``+inf``), whose ``out`` is zero."""
    threads = sync_threads()
    heads, m, n = x.shape
    rows = heads * m
    stops = np.full(rows, n, dtype=np.int64) if stop is None else stop.reshape(rows).to(torch.int64).numpy()
    alphas = np.full(rows, float(alpha), dtype=np.float64)
    tau = np.zeros(rows, dtype=np.float64)
    shift = np.zeros(rows, dtype=np.float64)
    special = np.full(rows, FLAG_TODO, dtype=np.uint8)
    out = x.new_zeros(heads, m, v.shape[-1])
    call_kernel("entmax", _k.entmax_attend, x.detach().view(rows, n).numpy(), v.detach().numpy(), m, alphas, stops,
                out.view(rows, -1).numpy(), tau, shift, special, _k.GROUPS_PER_THREAD * threads)
    shape = (heads, m)
    return (out, torch.from_numpy(tau).reshape(shape), torch.from_numpy(shift).reshape(shape),
            torch.from_numpy(special != 0).reshape(shape))


def entmax_tile_grad(z: torch.Tensor, dp: torch.Tensor, alpha: float, tau: torch.Tensor, shift: torch.Tensor,
                     stop: torch.Tensor | None = None) -> None:
    """The closed-form alpha-entmax backward on a tile, in place (the fused attention path):
    ``z`` (scores, C-contiguous, CPU, float32 / float64) becomes
    ``p = [u (z - shift) - tau]_+^{1/u}`` and ``dp`` (same shape and dtype, the gradient of
    ``p``) the gradient of the scores. ``tau``, ``shift``: one threshold and maximum per row
    (``z.shape[:-1]``, trailing 1 allowed), as :func:`entmax_in_place` returns them; ``stop``:
    int64 per row, the visible prefix (entries after it are hidden). See
    :func:`.sparse.entmax_tile_grad`."""
    threads = sync_threads()
    n = z.shape[-1]
    rows = z.numel() // max(n, 1)
    stops = np.full(rows, n, dtype=np.int64) if stop is None else stop.reshape(rows).to(torch.int64).numpy()
    taus = tau.reshape(rows).to(torch.float64).numpy()
    shifts = shift.reshape(rows).to(torch.float64).numpy()
    keep_torch_threads(_k.entmax_tile_grad, z.view(rows, n).numpy(), dp.view(rows, n).numpy(), float(alpha), taus,
                       shifts, stops, _k.GROUPS_PER_THREAD * threads)
