"""Softmax and the normalizers built on it: the reference definitions, in plain PyTorch.

Every function here normalises along ``dim`` (default -1), accepts a bool ``mask``
broadcastable to ``x`` (True = visible; masked and ``-inf`` entries get exactly 0),
returns zeros (and zero gradient) for a row with nothing visible, computes float16 and
bfloat16 in float32, and is differentiable (``torch.autograd.gradcheck`` holds in float64).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..kernels import dispatch
from .._rows import (
    Rows,
    check_at_least,
    check_int_in_range,
    check_positive,
    nonzero_or_one,
    prepare_rows,
)

#: Initial SSMax scale: Nakanishi (2025) reports s ~ 0.43 as the value used for SSMax.
SSMAX_S_INIT = 0.43

#: Adaptive-temperature polynomial in the entropy, highest degree first (Velickovic et al. 2024).
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)
ADAPTIVE_ENTROPY_THRESHOLD = 0.5

#: MultiMax modulator parameters. The official code initialises r and t with a truncated
#: normal of std 0.02; the functional default (all zeros) makes MultiMax equal softmax.
MULTIMAX_R_INIT = (0.0, 0.0, 0.0, 0.0)
MULTIMAX_T_INIT = (0.0, 0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------------------
# the softmax core, on rows whose normalised axis is last
# ----------------------------------------------------------------------------------------

def _exp_terms(z: torch.Tensor, visible: torch.Tensor):
    """``exp(z - m)`` over visible entries (0 elsewhere), its row sum, and ``m``.

    ``m`` is the visible row maximum, detached (softmax is shift invariant, so this is
    exact). A row whose maximum is ``+inf`` is returned with ``inf_rows`` True; its
    limit is uniform over its ``+inf`` entries.
    """
    filled = z.detach().masked_fill(~visible, float("-inf"))
    if z.shape[-1] == 0:
        m = filled.new_full(z.shape[:-1] + (1,), float("-inf"))
    else:
        m = filled.amax(-1, keepdim=True)
    finite_m = torch.isfinite(m)
    inf_rows = m == float("inf")
    m = torch.where(finite_m, m, torch.zeros_like(m))
    z_safe = torch.where(visible & ~(z == float("inf")), z, m)
    e = torch.where(visible, torch.exp(z_safe - m), torch.zeros_like(z))
    return e, e.sum(-1, keepdim=True), m, inf_rows


def _infinite_limit(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Uniform weights over the visible ``+inf`` entries of each row."""
    top = (visible & (z == float("inf"))).to(z.dtype)
    return top / top.sum(-1, keepdim=True).clamp_min(1)


def softmax_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax along the last axis over visible entries (building block, no checks)."""
    e, d, _, inf_rows = _exp_terms(z, visible)
    p = e / nonzero_or_one(d)
    return torch.where(inf_rows, _infinite_limit(z.detach(), visible), p)


def log_softmax_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Log-softmax along the last axis; ``-inf`` at invisible entries."""
    e, d, m, inf_rows = _exp_terms(z, visible)
    z_safe = torch.where(visible & ~torch.isinf(z), z, m)
    d_safe = nonzero_or_one(d)
    out = z_safe - m - torch.log(d_safe)
    out = torch.where(inf_rows, torch.log(_infinite_limit(z.detach(), visible)), out)
    # z = -inf at a visible entry (x / T overflowing) of a row without NaN: probability 0, log -inf
    dead = (z == float("-inf")) & ~torch.isnan(d)
    return torch.where(visible & ~dead, out, torch.full_like(out, float("-inf")))


def logsumexp_rows(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """log-sum-exp along the last axis (keepdim); ``-inf`` for an empty row."""
    e, d, m, inf_rows = _exp_terms(z, visible)
    any_visible = visible.any(-1, keepdim=True)
    out = m + torch.log(nonzero_or_one(d))
    out = torch.where(any_visible, out, torch.full_like(out, float("-inf")))
    return torch.where(inf_rows, torch.full_like(out, float("inf")), out)


def _scaled(rows: Rows, scale, name: str) -> torch.Tensor:
    """``x * scale`` in rows layout, keeping invisible entries out of the product."""
    return rows.safe_x * rows.align(scale, name)


def _finish(rows: Rows, p: torch.Tensor) -> torch.Tensor:
    return rows.restore(rows.zero_invisible(p))


# ----------------------------------------------------------------------------------------
# public functions
# ----------------------------------------------------------------------------------------

def softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
            temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Softmax with temperature.

    .. math:: \mathrm{softmax}(x)_i = \frac{e^{x_i/T - m}}{\sum_j e^{x_j/T - m}},
              \quad m = \max_j x_j / T

    A row whose maximum is ``+inf`` gives its limit: equal weights on its ``+inf``
    entries. Shift invariant. Bridle (1990); temperature as in Hinton, Vinyals & Dean
    (2015), "Distilling the knowledge in a neural network", arXiv 1503.02531.

    Args:
        x: scores, any shape.
        dim: the axis normalised.
        mask: bool, broadcastable to ``x``, True = visible.
        temperature: ``T > 0``, a number or a tensor broadcastable to ``x``.
    """
    check_positive(temperature, "temperature")
    return dispatch.run("softmax", _softmax_reference, x, dim, mask, temperature=temperature)


def _softmax_reference(x, dim=-1, mask=None, temperature=1.0):
    rows = prepare_rows(x, dim, mask)
    z = _scaled(rows, 1.0 / temperature if not isinstance(temperature, torch.Tensor)
                else temperature.reciprocal(), "temperature")
    return _finish(rows, softmax_rows(z, rows.visible))


def log_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Logarithm of :func:`softmax`, computed stably.

    .. math:: \log \mathrm{softmax}(x)_i = x_i/T - m - \log \sum_j e^{x_j/T - m}

    Masked entries (and every entry of a row with nothing visible) are ``-inf``, the
    logarithm of their probability 0, with zero gradient.
    """
    check_positive(temperature, "temperature")
    return dispatch.run("log_softmax", _log_softmax_reference, x, dim, mask, temperature=temperature)


def _log_softmax_reference(x, dim=-1, mask=None, temperature=1.0):
    rows = prepare_rows(x, dim, mask)
    z = _scaled(rows, 1.0 / temperature if not isinstance(temperature, torch.Tensor)
                else temperature.reciprocal(), "temperature")
    return rows.restore(log_softmax_rows(z, rows.visible))


def logsumexp(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
              keepdim: bool = False) -> torch.Tensor:
    r"""Log-sum-exp over the visible entries of ``dim``.

    .. math:: \mathrm{LSE}(x) = m + \log \sum_j e^{x_j - m}, \quad m = \max_j x_j

    A row with nothing visible gives ``-inf`` (the log of an empty sum), with zero gradient.
    """
    return dispatch.run("logsumexp", _logsumexp_reference, x, dim, mask, keepdim=keepdim)


def _logsumexp_reference(x, dim=-1, mask=None, keepdim=False):
    rows = prepare_rows(x, dim, mask)
    z = torch.where(rows.visible, rows.x, rows.safe_x)
    return rows.restore(logsumexp_rows(z, rows.visible), reduced=True, keepdim=keepdim)


def _polyval(coefficients: Sequence[float], t: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(t)
    for c in coefficients:
        out = out * t + c
    return out


def adaptive_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                     detach_beta: bool = False) -> torch.Tensor:
    r"""Adaptive-temperature softmax (Veličković et al. 2024).

    .. math::
        p = \mathrm{softmax}(x),\; H = -\sum_i p_i \log p_i,\;
        \beta = \begin{cases}\max(\mathrm{poly}(H), 1) & H > 0.5\\ 1 & \text{otherwise}\end{cases},\;
        \text{return } \mathrm{softmax}(\beta x)

    with ``poly`` the degree-4 fit ``[-0.037, 0.481, -2.3, 4.917, -1.791]`` (highest degree
    first). Sharpens rows whose softmax is too dispersed; equals softmax when ``H <= 0.5``.
    The entropy is computed exactly (no ``+1e-9`` inside the log).

    Veličković, Perivolaropoulos, Barbero & Pascanu (2024), "softmax is not enough (for
    sharp out-of-distribution)", arXiv 2410.01104.

    Args:
        detach_beta: treat β as a constant in the backward pass (the gradient then is
            that of ``softmax(β x)`` at fixed β). By default the gradient flows through β.
    """
    if not isinstance(detach_beta, bool):
        raise TypeError(f"detach_beta must be a bool, got {type(detach_beta).__name__}")
    rows = prepare_rows(x, dim, mask)
    z = torch.where(rows.visible, rows.x, rows.safe_x)
    logp = log_softmax_rows(z, rows.visible)
    p = torch.exp(logp)
    safe_logp = torch.where(rows.visible & torch.isfinite(logp), logp, torch.zeros_like(logp))
    entropy = -(p * safe_logp).sum(-1, keepdim=True)
    beta = torch.where(entropy > ADAPTIVE_ENTROPY_THRESHOLD,
                       _polyval(ADAPTIVE_POLY, entropy).clamp_min(1.0), torch.ones_like(entropy))
    if detach_beta:
        beta = beta.detach()
    scaled = torch.where(rows.visible & ~torch.isinf(z), z * beta, z)
    return _finish(rows, softmax_rows(scaled, rows.visible))


def ssmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
          s: float | torch.Tensor = SSMAX_S_INIT, n: int | torch.Tensor | None = None) -> torch.Tensor:
    r"""Scalable-Softmax (Nakanishi 2025).

    .. math:: \mathrm{SSMax}(x)_i = \frac{n^{s x_i}}{\sum_j n^{s x_j}} = \mathrm{softmax}(s \log(n)\, x)_i

    ``n`` is the number of visible entries of the row by default (for causal attention,
    query ``i`` sees ``n = i + 1`` keys); pass ``n`` to override it. With ``n = 1`` the
    single visible entry gets weight 1. ``s`` is learnable (a number or a tensor
    broadcastable to ``x``, e.g. one per head); the paper reports ``s ≈ 0.43``.

    Nakanishi (2025), "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399.
    """
    rows = prepare_rows(x, dim, mask)
    count = rows.count if n is None else _check_n(rows, n)
    log_n = torch.log(count.clamp_min(1.0))
    scale = log_n * rows.align(s, "s") if isinstance(s, torch.Tensor) else log_n * float(s)
    z = torch.where(rows.visible & ~torch.isinf(rows.x), rows.safe_x * scale, rows.x)
    return _finish(rows, softmax_rows(z, rows.visible))


def _check_n(rows: Rows, n) -> torch.Tensor:
    if isinstance(n, torch.Tensor):
        if bool((n < 1).any()):
            raise ValueError("n must be >= 1 everywhere")
        return rows.align(n.to(rows.x.dtype), "n")
    check_at_least(n, 1, "n", allow_tensor=False)
    return torch.full_like(rows.x[..., :1], float(n))


def sa_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
               normalized: bool = False, eps: float = 1e-6) -> torch.Tensor:
    r"""Self-Adjust Softmax (SA-Softmax).

    .. math::
        \text{plain: } x \odot \mathrm{softmax}(x) \qquad
        \text{normalized: } \frac{x - \min(x_{\min}, 0)}{\max(0, x_{\max}) - \min(x_{\min}, 0) + \varepsilon}
        \odot \mathrm{softmax}(x)

    with ``x_min``, ``x_max`` over the visible entries of the row. The output does not
    sum to one (plain SA-Softmax can be negative). Zheng et al. (2025), "Self-Adjust
    Softmax", arXiv 2502.18277.
    """
    if not isinstance(normalized, bool):
        raise TypeError(f"normalized must be a bool, got {type(normalized).__name__}")
    check_positive(eps, "eps", allow_tensor=False)
    rows = prepare_rows(x, dim, mask)
    xs = rows.safe_x
    p = softmax_rows(torch.where(rows.visible, rows.x, xs), rows.visible)
    if not normalized:
        return _finish(rows, xs * p)
    low = rows.masked_min().clamp_max(0.0)
    high = rows.masked_max().clamp_min(0.0)
    return _finish(rows, (xs - low) / (high - low + eps) * p)


def _multimax_coefficients(rows: Rows, value, name: str) -> list:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != 4:
            raise ValueError(f"{name} must have 4 entries along its first axis, got shape {tuple(value.shape)}")
        return [rows.align(value[i], f"{name}[{i}]") for i in range(4)]
    values = list(value)
    if len(values) != 4:
        raise ValueError(f"{name} must have 4 entries, got {len(values)}")
    return [float(v) for v in values]


def multimax_modulator(x: torch.Tensor, r, t) -> torch.Tensor:
    r"""The MultiMax modulator σ (the official code's "SeLU"), elementwise.

    .. math:: \sigma(x) = x + t_1 [r_1 - x]_+ + t_2 [x - r_2]_+ + t_3 [r_3 - x]_+^2 + t_4 [x - r_4]_+^2
    """
    relu = torch.relu
    return (x + t[0] * relu(r[0] - x) + t[1] * relu(x - r[1])
            + t[2] * relu(r[2] - x) ** 2 + t[3] * relu(x - r[3]) ** 2)


def multimax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
             r=MULTIMAX_R_INIT, t=MULTIMAX_T_INIT) -> torch.Tensor:
    r"""MultiMax (Zhou, Fritz & Keuper, ICML 2024): softmax of a learnable piecewise modulator.

    .. math::
        \mathrm{MultiMax}(x) = \mathrm{softmax}(\sigma(x)),\quad
        \sigma(x) = x + t_1 [r_1 - x]_+ + t_2 [x - r_2]_+ + t_3 [r_3 - x]_+^2 + t_4 [x - r_4]_+^2

    ``r`` and ``t`` each hold 4 values: numbers, or a tensor whose first axis has 4 entries
    and whose remaining axes broadcast to ``x`` (per-head parameters). The defaults (all
    zeros) give plain softmax; :class:`softmaxkit.nn.Normalizer` initialises them as the
    official code does (truncated normal, std 0.02). Zhou, Fritz & Keuper (2024),
    "MultiMax: Sparse and Multi-Modal Attention Learning", arXiv 2406.01189.
    """
    rows = prepare_rows(x, dim, mask)
    rr = _multimax_coefficients(rows, r, "r")
    tt = _multimax_coefficients(rows, t, "t")
    finite = rows.visible & ~torch.isinf(rows.x)
    z = torch.where(finite, multimax_modulator(rows.safe_x, rr, tt), rows.x)
    return _finish(rows, softmax_rows(z, rows.visible))


def sparse_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                   k: int | None = None) -> torch.Tensor:
    r"""Sparse-softmax: softmax over the ``k`` largest visible entries, 0 elsewhere.

    .. math:: p_i = \frac{e^{x_i}}{\sum_{j \in \mathrm{top}_k(x)} e^{x_j}}\ (i \in \mathrm{top}_k(x)),\ 0 \text{ otherwise}

    A row with fewer than ``k`` visible entries keeps them all. Ties at the ``k``-th value
    are broken as ``torch.topk`` breaks them. Sun, Zhang, Li & Guo (2021), "Sparse-softmax:
    a simpler and faster alternative softmax transformation", arXiv 2112.12433.

    Args:
        k: the number of entries kept, ``1 <= k <= x.shape[dim]`` (required).
    """
    if k is None:
        raise ValueError("sparse_softmax needs k, the number of entries kept (1 <= k <= row length)")
    rows = prepare_rows(x, dim, mask)
    length = rows.x.shape[-1]
    k = check_int_in_range(k, "k", 1, max(length, 1))
    if length == 0:
        return rows.restore(rows.x.clone())
    filled = rows.x.detach().masked_fill(~rows.visible, float("-inf"))
    top = filled.topk(k, dim=-1).indices
    keep = torch.zeros_like(rows.visible).scatter(-1, top, True) & rows.visible
    z = torch.where(keep, rows.x, rows.safe_x)
    return _finish(rows, softmax_rows(z, keep))


def stablemax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""StableMax (Prieto et al. 2025): a softmax whose exponential is replaced by a rational map.

    .. math:: \mathrm{StableMax}(x)_i = \frac{s(x_i)}{\sum_j s(x_j)},\quad
              s(x) = \begin{cases} x + 1 & x \ge 0 \\ \frac{1}{1 - x} & x < 0 \end{cases}

    ``s`` grows linearly, so the weights never underflow (the paper's cure for softmax
    collapse). Not shift invariant. A ``-inf`` entry has ``s = 0``; a row with ``+inf``
    entries gives its limit, equal weights on them. Prieto, Barsbey, Mediano & Birdal
    (2025), "Grokking at the Edge of Numerical Stability", arXiv 2501.04697.
    """
    rows = prepare_rows(x, dim, mask)
    finite = rows.visible & ~torch.isinf(rows.x)  # a NaN stays and makes its row NaN
    xs = torch.where(finite, rows.x, torch.zeros_like(rows.x))
    s = torch.where(xs >= 0, xs.clamp_min(0) + 1.0, 1.0 / (1.0 - xs.clamp_max(0)))
    s = torch.where(finite, s, torch.zeros_like(s))
    total = s.sum(-1, keepdim=True)
    p = s / nonzero_or_one(total)
    inf_rows = (rows.visible & (rows.x == float("inf"))).any(-1, keepdim=True)
    p = torch.where(inf_rows, _infinite_limit(rows.x.detach(), rows.visible), p)
    return _finish(rows, p)


def clipped_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                    gamma: float = -0.03, zeta: float = 1.0) -> torch.Tensor:
    r"""Clipped softmax (Bondarenko, Nagel & Blankevoort 2023).

    .. math:: \mathrm{clip}\big((\zeta - \gamma)\,\mathrm{softmax}(x) + \gamma,\ 0,\ 1\big)

    With ``gamma < 0`` small weights become exact zeros (the head can "do nothing"
    without pushing scores to extremes); with ``zeta > 1`` weights can reach exactly 1.
    ``gamma = 0, zeta = 1`` is softmax. Masked entries are 0 whatever ``gamma`` is.
    Bondarenko, Nagel & Blankevoort (2023), "Quantizable Transformers: Removing Outliers by
    Helping Attention Heads Do Nothing", arXiv 2306.12929.

    Args:
        gamma: lower stretch, ``gamma < zeta`` (the paper uses small negative values).
        zeta: upper stretch, ``zeta >= 1`` in the paper.
    """
    for name, value in (("gamma", gamma), ("zeta", zeta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise TypeError(f"{name} must be a number, got {value!r}")
    if not zeta > gamma:
        raise ValueError(f"zeta must be > gamma, got zeta={zeta}, gamma={gamma}")
    rows = prepare_rows(x, dim, mask)
    p = softmax_rows(torch.where(rows.visible, rows.x, rows.safe_x), rows.visible)
    return _finish(rows, ((zeta - gamma) * p + gamma).clamp(0.0, 1.0))
