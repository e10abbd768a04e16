r"""Two unrelated losses that are both called "z-loss".

* :func:`spherical_z_loss`: the classification loss of de Brébisson & Vincent (2016),
  a softplus of the z-normalised target score; shift and scale invariant.
* :func:`logit_z_penalty`: the auxiliary ``1e-4 * logsumexp(logits)^2`` of PaLM
  (Chowdhery et al. 2022), which keeps the softmax normaliser close to 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import can_branch_on, check_dim, check_finite, check_floating, check_nonnegative, check_positive
from .._rows import compute_dtype
from ..functional import logsumexp
from ._reduce import check_reduction, reduce_loss


def spherical_z_loss(logits: torch.Tensor, target: torch.Tensor, a: float = 1.0, b: float = 1.0,
                     dim: int = -1, reduction: str = "mean") -> torch.Tensor:
    r"""Z-loss of de Brébisson & Vincent (2016), a spherical-family classification loss.

    .. math::
        z_c = \frac{o_c - \mu}{\sigma},\quad \mu = \frac1C \sum_k o_k,\quad
        \sigma^2 = \frac1C \sum_k (o_k - \mu)^2,\qquad
        L = \frac{1}{a} \log\big(1 + e^{a (b - z_c)}\big)

    for the target class ``c``. Invariant to shifting and to (positively) scaling the
    logits; ``a`` (sharpness) and ``b`` (location) are hyperparameters the paper tunes
    per task (the defaults here are neutral starting points, not the paper's values). A
    row with all logits equal has ``z_c = 0`` and zero gradient; a row holding an infinite or
    NaN logit has a NaN loss. Not the PaLM z-penalty:
    see :func:`logit_z_penalty`.

    de Brébisson & Vincent (2016), "The Z-loss: a shift and scale invariant
    classification loss belonging to the Spherical Family", arXiv 1604.08859.

    Args:
        logits: scores ``o``, classes along ``dim``.
        target: integer class indices (the shape of ``logits`` without ``dim``).
        a: ``> 0``, finite. b: any finite real number (NaN and inf raise ``ValueError``).
        dim: the class axis.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    check_floating(logits, "logits")
    check_finite(a, "a", allow_tensor=False)
    check_positive(a, "a", allow_tensor=False)
    check_finite(b, "b", allow_tensor=False)
    reduction = check_reduction(reduction)
    dim = check_dim(logits, dim)
    if logits.dim() == 0:
        raise ValueError("logits must have a class axis, got a 0-d tensor")
    o = logits.to(compute_dtype(logits.dtype)).movedim(dim, -1)
    classes = o.shape[-1]
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        raise TypeError("target must be an integer tensor of class indices")
    if target.shape != o.shape[:-1]:
        raise ValueError(f"target must have the shape of logits without the class axis {tuple(o.shape[:-1])}, "
                         f"got {tuple(target.shape)}")
    target = target.long()   # (uint16 / uint32 / uint64 have no comparisons in torch)
    if can_branch_on(target) and bool(((target < 0) | (target >= classes)).any()):
        raise ValueError(f"target class indices must be in [0, {classes})")
    if o.numel() == 0:   # no row (a row without classes has no valid target): nothing to reduce over
        return reduce_loss(o.sum(-1), reduction).to(logits.dtype)
    # z is scale invariant, so each row is first divided by its largest magnitude (a constant to
    # autograd, which leaves z's gradient exact): mu and sigma^2 then neither overflow nor underflow
    # (1e-30 or 3e19 logits in float32). An inf or NaN logit makes its row's loss NaN.
    largest = o.detach().abs().amax(-1, keepdim=True)
    o = o / torch.where(largest > 0, largest, torch.ones_like(largest))
    mu = o.mean(-1, keepdim=True)
    var = (o - mu).square().mean(-1)
    flat = var == 0
    sigma = torch.sqrt(torch.where(flat, torch.ones_like(var), var))
    centred = (o.gather(-1, target.unsqueeze(-1).long()) - mu).squeeze(-1)
    z = torch.where(flat, torch.zeros_like(centred), centred / sigma)
    loss = F.softplus(a * (b - z)) / a
    return reduce_loss(loss, reduction).to(logits.dtype)


def logit_z_penalty(logits: torch.Tensor, weight: float = 1e-4, dim: int = -1,
                    mask: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    r"""The PaLM auxiliary loss on the softmax normaliser: ``weight * logsumexp(logits)^2``.

    .. math:: L = w \Big(\log \sum_j e^{z_j}\Big)^2,\qquad w = 10^{-4} \text{ in PaLM}

    It pulls ``log Z`` towards 0, which stabilises large-scale training (Chowdhery et al.
    2022, "PaLM: Scaling Language Modeling with Pathways", arXiv 2204.02311, Sec. 5).
    :func:`softmaxkit.losses.linear_cross_entropy` adds it fused (``z_penalty=``). Not
    the spherical z-loss: see :func:`spherical_z_loss`.

    Args:
        logits: scores, classes along ``dim``.
        weight: ``w >= 0``, finite: a number, or a tensor that broadcasts to the rows (one per row).
        dim: the class axis.
        mask: bool, broadcastable to ``logits``, True = visible; a row with nothing
            visible (or all ``-inf``) contributes 0. A NaN logit makes its row NaN.
        reduction: ``"mean"`` (over rows), ``"sum"`` or ``"none"``.
    """
    check_floating(logits, "logits")
    check_finite(weight, "weight")
    check_nonnegative(weight, "weight")
    reduction = check_reduction(reduction)
    lse = logsumexp(logits.to(compute_dtype(logits.dtype)), dim=dim, mask=mask)
    if isinstance(weight, torch.Tensor):   # (one per row: it must broadcast to the rows, not raise in the product)
        try:
            fits = torch.broadcast_shapes(weight.shape, lse.shape) == lse.shape   # ((N, 1) would give (N, N))
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"weight of shape {tuple(weight.shape)} does not broadcast to the rows of logits "
                             f"{tuple(lse.shape)}")
    # A row with nothing visible (lse = -inf) contributes 0; NaN and +inf propagate.
    lse = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)
    return reduce_loss(weight * lse.square(), reduction).to(logits.dtype)
