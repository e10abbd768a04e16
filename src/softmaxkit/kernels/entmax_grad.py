r"""The closed-form alpha-entmax gradients in torch ops (differentiable: a graph of the gradient
can be built), shared by the reference (:mod:`softmaxkit.normalizers._entmax`) and the numba
kernels' backward when a graph of the gradient is wanted.

With ``u = alpha - 1``, ``p = alpha-entmax(z)`` and the weights ``g = p^{2 - alpha}`` on the
support (Peters, Niculae & Martins 2019, Prop. 1):

.. math::
    \frac{\partial p}{\partial z} v = g \odot \Big(v - \frac{\langle g, v\rangle}{\sum_j g_j}\Big),
    \qquad
    \frac{\partial p}{\partial \alpha} = h - g \frac{\sum_j h_j}{\sum_j g_j},
    \quad h_i = p_i d_i^2 M(u d_i),\ d_i = \frac{p_i^u - 1}{u}.
"""

from __future__ import annotations

import torch

#: |t| below which M(t) (see :func:`alpha_weight`) is summed as a power series.
SERIES_CUTOFF = 0.05
SERIES_TERMS = 16


def m_series(t: torch.Tensor) -> torch.Tensor:
    r"""``M(t) = sum_{k>=1} (-1)^k k/(k+1) t^{k-1} = -1/2 + 2t/3 - 3t^2/4 + ...`` (Horner)."""
    out = torch.zeros_like(t)
    for k in range(SERIES_TERMS, 0, -1):
        out = out * t + (-1) ** k * k / (k + 1)
    return out


def alpha_weight(p, g, d, u, log_p):
    r"""``p_i d_i^2 M(t_i)`` with ``t = u d`` and ``M(t) = (1/(1+t) - log1p(t)/t) / t``.

    Uses ``g = p^{1-u} = p/(1+t)`` and ``log1p(t) = u log p`` (``1 + t = p^u``; ``t`` itself
    rounds to -1 at a small ``p``): directly ``d^2 (g - p u log p / t) / t`` for
    ``|t| >= 0.05``, the power series of ``M`` below that (where the direct form cancels).
    """
    t = u * d
    small = t.abs() < SERIES_CUTOFF
    safe_t = torch.where(small, torch.ones_like(t), t)
    direct = d * d * (g - p * (u * log_p) / safe_t) / safe_t
    return torch.where(small, p * d * d * m_series(torch.where(small, t, torch.zeros_like(t))), direct)


def entmax_weights(p, u):
    """``g = p^{2-alpha}`` on the support (0 elsewhere), its row sum (1 for an empty row),
    the support and ``log p`` (0 off it)."""
    on = p > 0
    log_p = torch.log(torch.where(on, p, torch.ones_like(p)))
    g = torch.where(on, torch.exp((1 - u) * log_p), torch.zeros_like(p))
    g_sum = g.sum(-1, keepdim=True)
    return g, torch.where(g_sum > 0, g_sum, torch.ones_like(g_sum)), on, log_p


def dp_dalpha(p, u, g, g_sum, on, log_p):
    """``dp/dalpha = h - g sum h / sum g`` (module docstring) from :func:`entmax_weights`'s
    ``g, g_sum, on, log_p``; ``u = alpha - 1`` a tensor that broadcasts against ``p``."""
    safe_u = torch.where(u > 0, u, torch.ones_like(u))
    d = torch.where(u > 0, torch.expm1(u * log_p) / safe_u, log_p)
    h = torch.where(on, alpha_weight(p, g, d, u, log_p), torch.zeros_like(p))
    return h - g * h.sum(-1, keepdim=True) / g_sum


def centered(g: torch.Tensor, v: torch.Tensor, g_sum: torch.Tensor, dominant: bool = True) -> torch.Tensor:
    r"""``g (v - sum_j g_j v_j / sum_j g_j)`` along the last axis, the entmax Jacobian applied to ``v``.

    Past alpha = 2 the weights ``g = p^{2-alpha}`` grow without bound as ``p -> 0``; where one
    entry holds nearly all of ``sum g``, its ``v_k - mean`` is a difference of nearly equal
    numbers, multiplied by the huge ``g_k`` (float32 at alpha = 5 lost 4.4 of 41). With
    ``dominant`` (the caller's alpha may exceed 2) the entry of the largest ``g`` takes the
    leave-one-out form ``g_k sum_{j != k} g_j (v_k - v_j) / sum g``, with no cancellation.
    Off the support (``g = 0``) ``v`` is not read and the result is exactly 0: a NaN there (an
    incoming gradient at a weight that is exactly 0) leaves the row finite, and a NaN on the
    support makes only the support NaN, as the kernels and softmax's reference give it."""
    on = g != 0
    v = torch.where(on, v, torch.zeros_like(v))
    out = torch.where(on, g * (v - (g * v).sum(-1, keepdim=True) / g_sum), torch.zeros_like(g))
    if not dominant or g.shape[-1] < 2:
        return out
    k = g.argmax(-1, keepdim=True)
    others = torch.ones_like(g, dtype=torch.bool).scatter(-1, k, False)
    g_others = torch.where(others, g, torch.zeros_like(g))
    g_k, v_k = g.gather(-1, k), v.gather(-1, k)
    spread = (g_others * (v_k - v)).sum(-1, keepdim=True)
    return out.scatter(-1, k, g_k * spread / g_sum)
