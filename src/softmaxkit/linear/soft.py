r"""``"soft"``: the softmax-free transformer, SOFT (Lu et al. 2021).

SOFT replaces ``softmax(q k^T)`` by a Gaussian kernel and approximates the ``Lq x Lk``
kernel matrix by a Nystrom decomposition through ``r`` landmarks:

.. math:: \kappa(a, b) = \exp\!\Big(-\frac{\mathrm{scale}}{2}\lVert a - b\rVert^2\Big),\qquad
          A \approx \kappa(Q, \tilde K)\, \kappa(\tilde Q, \tilde K)^{+}\, \kappa(\tilde Q, K),\qquad
          \mathrm{out} = A V

(``scale = 1/sqrt(D)`` by default, the paper's ``exp(-|q - k|^2 / (2 sqrt(d)))``). The
landmarks ``Q~``, ``K~`` are the means of ``r`` contiguous segments of the queries and of
the visible keys (the paper's average pooling). The Moore-Penrose inverse ``M^+`` of the
``r x r`` landmark matrix is computed by Newton-Schulz iterations
``X_{t+1} = 2 X_t - X_t M X_t`` from ``X_0 = M^T / (|M|_1 |M|_inf)`` (until converged unless
``newton_iters`` fixes their number) in the forward pass only,
without autograd tracking; its gradient is taken once, in closed form
(:class:`NewtonPinv`). ``normalize="symmetric"`` applies SOFT++'s symmetric normalisation
``D_q^{-1/2} A D_k^{-1/2}`` with ``D_q = A 1`` and ``D_k = A^T 1`` (clamped at ``eps``), for dense
prediction. Cost ``O((Lq + Lk) r D + r^3)``; non-causal only (the landmarks pool over the
whole sequence, so a query would see future keys). With a key-padding mask and
``Lq == Lk`` (self-attention), padded positions are left out of the query landmarks too, so
padding changes no visible output.

Lu, Yao, Zhang, Zhu, Xu, Gao, Xiang, Xiang, Zhang 2021, "SOFT: Softmax-free Transformer
with Linear Complexity", NeurIPS 2021, arXiv 2110.11945; symmetric normalisation: Lu et al.
2022, "Softmax-free Linear Transformers", arXiv 2207.03341.
"""

from __future__ import annotations

import torch

from .._checks import check_floating, is_functorch_wrapped
from ._spec import LinearMethod, check_count, check_eps

NORMALIZE = (None, "symmetric")
#: Landmarks when ``rank`` is not given (fewer for sequences shorter than this).
DEFAULT_RANK = 32


class NewtonPinv(torch.autograd.Function):
    """``M^+`` by Newton-Schulz iterations (no autograd graph), gradient in closed form.

    Uses the derivative of the Moore-Penrose inverse (Golub & Pereyra 1973):
    ``dX = -X dM X + X X^T dM^T (I - M X) + (I - X M) dM^T X^T X`` (forward mode), so with
    ``G = dL/dX``, ``dL/dM = -X^T G X^T + (I - M X) G^T X X^T + X^T X G^T (I - X M)`` (backward),
    evaluated at the iterate ``X`` (exact once the iterations have converged). Works under
    ``torch.func`` transforms (``grad``, ``vmap``, ``jvp``): the iterations, which test for
    convergence, run on the unwrapped (vmap: batched) matrices.
    """

    @staticmethod
    def forward(m: torch.Tensor, iters: int | None):
        with torch.no_grad():
            return newton_pinv(m, iters)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output)
        ctx.save_for_forward(inputs[0], output)

    @staticmethod
    def backward(ctx, g):
        m, x = ctx.saved_tensors
        xt, gt = x.transpose(-2, -1), g.transpose(-2, -1)
        grad = (-xt @ g @ xt
                + (_eye(m, -2) - m @ x) @ gt @ x @ xt
                + xt @ x @ gt @ (_eye(m, -1) - x @ m))
        return grad, None

    @staticmethod
    def jvp(ctx, dm, _):
        m, x = ctx.saved_tensors
        xt, dmt = x.transpose(-2, -1), dm.transpose(-2, -1)
        return (-x @ dm @ x
                + x @ xt @ dmt @ (_eye(m, -2) - m @ x)
                + (_eye(m, -1) - x @ m) @ dmt @ xt @ x)

    @staticmethod
    def vmap(info, in_dims, m, iters):
        return NewtonPinv.apply(m.movedim(in_dims[0], 0), iters), 0


def _eye(m: torch.Tensor, dim: int) -> torch.Tensor:
    """The identity matrix of the size of ``m``'s dimension ``dim``."""
    return torch.eye(m.shape[dim], dtype=m.dtype, device=m.device)


#: The most Newton-Schulz iterations ``newton_iters=None`` runs: from ``X_0`` the iterate
#: needs about ``log2(cond(M)^2)`` steps to reach the quadratic phase (cond 1e6: 40), then a few.
MAX_NEWTON_ITERS = 100


def newton_pinv(m: torch.Tensor, iters: int | None = None) -> torch.Tensor:
    r"""Moore-Penrose inverse of the last two dims of ``m`` by Newton-Schulz iterations.

    .. math:: X_0 = \frac{M^\top}{\lVert M\rVert_1 \lVert M\rVert_\infty},\qquad
              X_{t+1} = 2X_t - X_t M X_t

    converges (quadratically near the end) to ``M^+`` since ``X_0`` has
    ``|I - M X_0| < 1`` on the range of ``M`` (Ben-Israel & Cohen 1966); used by SOFT
    (Lu et al. 2021, arXiv 2110.11945). ``iters=None`` iterates until converged: until the
    step changes no matrix by more than ``eps^(3/4)`` of its size (``eps`` of the dtype),
    one step more, at most :data:`MAX_NEWTON_ITERS` steps; an int runs exactly that many
    (SOFT's code runs 20, not converged once ``cond(M)`` passes about 1e3). Not
    differentiable by itself: use :class:`NewtonPinv` for a gradient (``iters=None`` under a
    ``torch.func`` transform runs as :class:`NewtonPinv`, whose ``vmap`` rule can test convergence).
    """
    iters = check_count(iters, "newton_iters", minimum=0, allow_none=True)
    check_floating(m, "m")
    if m.dim() < 2:
        raise ValueError(f"m must be a matrix or a batch of matrices (..., r, c), got shape {tuple(m.shape)}")
    if m.shape[-1] == 0 or m.shape[-2] == 0:   # (an empty matrix: its pseudo-inverse is the empty transpose)
        return m.transpose(-2, -1).clone()
    if iters is None and is_functorch_wrapped(m):   # the convergence test reads values: on the unwrapped ones
        return NewtonPinv.apply(m, None)
    norm1 = m.abs().sum(-2).amax(-1)
    norm_inf = m.abs().sum(-1).amax(-1)
    denom = (norm1 * norm_inf)[..., None, None]
    x = m.transpose(-2, -1) / torch.where(denom > 0, denom, torch.ones_like(denom))
    if iters is not None:
        for _ in range(iters):
            x = 2 * x - x @ m @ x
        return x
    if m.is_meta:   # shapes only: no values to test for convergence
        return x
    tol = torch.finfo(m.dtype).eps ** 0.75
    for _ in range(MAX_NEWTON_ITERS):
        step = x - x @ m @ x
        x = x + step
        size = x.abs().amax((-2, -1))
        change = step.abs().amax((-2, -1))
        if not bool((change > tol * size).any()):   # NaN (a NaN input) stops too
            return 2 * x - x @ m @ x
    return x


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``exp(-scale/2 |a_i - b_j|^2)`` for every pair of rows, ``(..., La, Lb)``."""
    sq = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1)[..., None, :] - 2 * a @ b.transpose(-2, -1)
    return torch.exp(-0.5 * scale * sq.clamp_min(0))


def landmarks(x: torch.Tensor, rank: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Means of ``rank`` contiguous segments of the rows of ``x`` ``(B, H, L, D)``: segment ``s``
    holds rows ``floor(s n / r) .. ceil((s + 1) n / r) - 1`` (adaptive average pooling). With
    ``weights`` ``(B, H|1, L)`` (1 = visible) the segments split the ``n`` visible rows only,
    so the landmarks never depend on masked rows; when ``n < rank`` an empty segment takes
    the mean of all visible rows."""
    length = x.shape[-2]
    dtype, device = x.dtype, x.device
    s_idx = torch.arange(rank, device=device)
    if weights is None:
        pos = torch.arange(length, device=device, dtype=dtype)
        n = torch.tensor(float(length), dtype=dtype, device=device)
        w = torch.ones(length, dtype=dtype, device=device)
    else:
        w = weights
        pos = w.cumsum(-1) - 1                                            # rank among the visible rows
        n = w.sum(-1, keepdim=True)
    start = torch.floor(s_idx.to(dtype)[:, None] * n[..., None] / rank) if weights is not None else \
        ((s_idx * length) // rank).to(dtype)[:, None]
    end = torch.ceil((s_idx.to(dtype)[:, None] + 1) * n[..., None] / rank) if weights is not None else \
        (-((-(s_idx + 1) * length) // rank)).to(dtype)[:, None]
    seg = ((pos[..., None, :] >= start) & (pos[..., None, :] < end)).to(dtype) * w[..., None, :]  # (.., r, L)
    total = seg.sum(-1, keepdim=True)
    means = (seg @ x) / torch.where(total > 0, total, torch.ones_like(total))
    if weights is None:
        return means
    visible_mean = (w[..., None, :] @ x) / torch.where(n > 0, n, torch.ones_like(n))[..., None]
    return torch.where(total > 0, means, visible_mean)


def _check(params, head_dim, dtype, device):
    rank = check_count(params["rank"], "rank", allow_none=True, what=" (the number of landmarks)")
    iters = check_count(params["newton_iters"], "newton_iters", minimum=0, allow_none=True)
    if params["normalize"] not in NORMALIZE:
        raise ValueError(f"normalize must be one of None, 'symmetric', got {params['normalize']!r}")
    return {"rank": rank, "newton_iters": iters, "normalize": params["normalize"],
            "eps": check_eps(params["eps"])}


def soft_attention(q, k, v, visible, ctx):
    """SOFT on checked inputs ``(B, H, L, D)``; ``visible`` ``(B, H|1, Lk)`` bool or None."""
    scale = ctx["scale"]
    lq, lk = q.shape[-2], k.shape[-2]
    rank = min(DEFAULT_RANK, lq, lk) if ctx["rank"] is None else ctx["rank"]
    if rank > min(lq, lk):
        raise ValueError(f"rank={rank} must be at most the sequence length (Lq={lq}, Lk={lk})")
    weights = None if visible is None else visible.to(v.dtype)
    q_land = landmarks(q, rank, weights if lq == lk else None)
    k_land = landmarks(k, rank, weights)
    left = gaussian_kernel(q, k_land, scale)                                 # (B, H, Lq, r)
    core = NewtonPinv.apply(gaussian_kernel(q_land, k_land, scale), ctx["newton_iters"])
    right = gaussian_kernel(q_land, k, scale)                                # (B, H, r, Lk)
    if weights is not None:
        right = right * weights[..., None, :]
    if ctx["normalize"] == "symmetric":
        row = left @ (core @ (right.sum(-1, keepdim=True)))                  # A 1, (B, H, Lq, 1)
        col = (left.sum(-2, keepdim=True) @ core @ right).transpose(-2, -1)  # A^T 1, (B, H, Lk, 1)
        eps = ctx["eps"]
        vk = v / col.clamp_min(eps).sqrt()
        return (left @ (core @ (right @ vk))) / row.clamp_min(eps).sqrt()
    return left @ (core @ (right @ v))


METHOD = LinearMethod(
    name="soft",
    feature_map="Gaussian kernel exp(-scale |q - k|^2 / 2), Nystrom rank r",
    formula="[K(Q, K~) K(Q~, K~)^+ K(Q~, K)]_ij (Newton-Schulz pinv)",
    paper="Lu et al. 2021, arXiv 2110.11945",
    causal=False, decoding=False,
    params={"rank": None, "newton_iters": None, "normalize": None, "eps": 1e-6},
    check=_check, kernelised=False, compute=soft_attention,
)
