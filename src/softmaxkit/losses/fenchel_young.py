r"""Fenchel-Young losses: the loss that belongs to each normalizer.

For a regulariser :math:`\Omega` on the simplex whose regularised argmax is the
normalizer :math:`\hat p(\theta) = \nabla \Omega^*(\theta)`,

.. math::
    L_\Omega(\theta; y) = \Omega^*(\theta) + \Omega(y) - \langle \theta, y \rangle
                        = \langle \theta, \hat p - y \rangle + \Omega(y) - \Omega(\hat p),
    \qquad \nabla_\theta L_\Omega = \hat p - y,

non-negative and zero iff :math:`\hat p = y` (Blondel, Martins & Niculae 2020, "Learning
with Fenchel-Young Losses", JMLR, arXiv 1901.02324). The regularisers are negative
Tsallis entropies (Peters, Niculae & Martins 2019, arXiv 1905.05702):

.. math::
    \Omega_\alpha(p) = \frac{\sum_j p_j^\alpha - 1}{\alpha(\alpha - 1)}\ (\alpha > 1),
    \qquad \Omega_1(p) = \sum_j p_j \log p_j,

softmax (alpha = 1: the loss is cross-entropy / KL), 1.5-entmax, sparsemax (alpha = 2:
the sparsemax loss of Martins & Astudillo 2016, arXiv 1602.02068) and alpha-entmax.
"""

from __future__ import annotations

import torch

from .. import registry
from .._autograd import without_forward_mode
from .._checks import (
    backward_in_torch_ops,
    can_branch_on,
    check_dim,
    check_floating,
    check_number,
    is_functorch_wrapped,
)
from .._rows import compute_dtype
from ..functional import logsumexp
from ._reduce import check_reduction, reduce_loss


def fenchel_young_normalizers() -> list[str]:
    """The registered normalizers with a Fenchel-Young loss here: those that are alpha-entmax of
    the raw scores (``NormalizerSpec.entmax_alpha``), softmax (alpha = 1) included."""
    return [spec.name for spec in registry.normalizers() if spec.entmax_alpha({}) is not None]


def tsallis_regularizer(p: torch.Tensor, alpha: float) -> torch.Tensor:
    r"""Negative Tsallis alpha-entropy of each row (last axis) of ``p``:
    :math:`(\sum_j p_j^\alpha - 1) / (\alpha(\alpha-1))`, and :math:`\sum_j p_j \log p_j` at alpha = 1.
    Each row of ``p`` must sum to 1 (it is computed as
    :math:`\sum_j p_j\,\mathrm{expm1}((\alpha-1)\log p_j) / (\alpha(\alpha-1))`, which tends to the
    alpha = 1 value continuously)."""
    if alpha == 1.0:
        return torch.xlogy(p, p).sum(-1)
    # written as sum_j p_j (p_j^(alpha-1) - 1) (p sums to 1) with expm1: sum_j p_j^alpha - 1
    # cancelled catastrophically in float32 near alpha = 1 (a loss of -120 at alpha = 1 + 1e-9)
    logs = torch.log(torch.where(p > 0, p, torch.ones((), dtype=p.dtype, device=p.device)))
    return (p * torch.expm1((alpha - 1) * logs)).sum(-1) / (alpha * (alpha - 1))


def _resolve_alpha(normalizer, alpha) -> tuple[float, dict]:
    """Tsallis alpha of ``normalizer`` and the parameters to call it with."""
    if not isinstance(normalizer, str):   # (the registry's own message named its argument "name")
        raise TypeError(f"normalizer must be a str, one of {', '.join(map(repr, fenchel_young_normalizers()))}, "
                        f"got {type(normalizer).__name__}")
    spec = registry.get(normalizer)
    params = {}
    if alpha is not None:
        if "alpha" not in spec.params:
            raise ValueError(f"alpha is only accepted with a normalizer that takes it, got alpha={alpha!r} "
                             f"with normalizer={normalizer!r}")
        check_number(alpha, "alpha", allow_tensor=False)
        if not alpha >= 1:
            raise ValueError(f"alpha must be >= 1, got {alpha}")
        params["alpha"] = float(alpha)
    resolved = spec.entmax_alpha(params)
    if resolved is None or isinstance(resolved, torch.Tensor):
        raise ValueError(f"normalizer must be one of {', '.join(map(repr, fenchel_young_normalizers()))} "
                         f"(alpha-entmax of the scores), got {normalizer!r}")
    return float(resolved), params


def _target_terms(z: torch.Tensor, target: torch.Tensor, alpha: float):
    """``<theta, y>`` and ``Omega(y)`` per row, for class indices or distributions, and
    whether the target puts mass on a ``-inf`` (masked) logit.

    ``z`` has its ``-inf`` entries replaced by 0 (they are masked); ``impossible`` says
    where that replacement touched the target, whose loss is then ``+inf``.
    """
    classes = z.shape[-1]
    masked = z == float("-inf")
    z = torch.where(masked, torch.zeros((), dtype=z.dtype, device=z.device), z)
    if target.is_floating_point():
        if target.shape != z.shape:
            raise ValueError(f"a distribution target must have the shape of logits {tuple(z.shape)} "
                             f"(classes last), got {tuple(target.shape)}")
        y = target.to(z.dtype)
        # Rounding each y_i to the target's dtype moves the sum by at most eps / 2 (relative
        # errors of entries that sum to 1): a float16 / bfloat16 target is held to its own eps.
        tol = max(1e-5, torch.finfo(target.dtype).eps)
        total = y.sum(-1, keepdim=True, dtype=torch.float64)
        if can_branch_on(y) and (not bool(torch.isfinite(y).all()) or bool((y < 0).any())
                                 or bool(((total - 1).abs() > tol).any())):
            raise ValueError("target must be finite, non-negative and sum to 1 along the class axis when it "
                             f"is a distribution (within {tol:.3g} for {target.dtype})")
        y = y / total.to(y.dtype)   # on the simplex, so that the loss is >= 0 (up to rounding)
        impossible = ((y > 0) & masked).any(-1)
        return (z * y).sum(-1), tsallis_regularizer(y, alpha), impossible
    if target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"target must be integer class indices or a floating distribution, got {target.dtype}")
    if target.shape != z.shape[:-1]:
        raise ValueError(f"class-index target must have the shape of logits without the class axis "
                         f"{tuple(z.shape[:-1])}, got {tuple(target.shape)}")
    target = target.long()   # (uint16 / uint32 / uint64 have no comparisons in torch)
    if can_branch_on(target) and bool(((target < 0) | (target >= classes)).any()):
        raise ValueError(f"target class indices must be in [0, {classes}), got min {int(target.min())}, "
                         f"max {int(target.max())}")
    index = target.unsqueeze(-1).long()
    picked = z.gather(-1, index).squeeze(-1)
    return picked, torch.zeros_like(picked), masked.gather(-1, index).squeeze(-1)


class _Conjugate(torch.autograd.Function):
    r"""Per row (last axis), :math:`\Omega^*(\theta) = \langle \theta, \hat p \rangle - \Omega(\hat p)`
    with :math:`\hat p = \mathrm{normalizer}(\theta)` (``-inf`` scores masked), and ``p_hat``.

    Its gradient is ``p_hat``: the forward's, or, when a graph of the gradient is wanted
    (``create_graph=True``, batched gradients, ``torch.func``), ``p_hat`` computed again with the
    differentiable normalizer, whose Jacobian is then the Hessian of the loss; also while
    ``torch.compile`` traces (which cannot ask those questions, and may build such a graph).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z, normalizer, params, alpha):
        p = registry.normalize(z, normalizer, dim=-1, **params)
        # -inf logits are masked: p = 0 there, and they must not enter <theta, p> as -inf * 0
        safe_z = torch.where(z != float("-inf"), z, torch.zeros((), dtype=z.dtype, device=z.device))
        return (safe_z * p).sum(-1) - tsallis_regularizer(p, alpha), p

    @staticmethod
    def setup_context(ctx, inputs, output):   # separate from forward: torch.func transforms need it
        z, ctx.normalizer, ctx.params, _ = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(z, output[1])
        ctx.save_for_forward(z, output[1])

    @staticmethod
    def backward(ctx, grad, _grad_p):
        z, p = ctx.saved_tensors
        if torch.compiler.is_compiling() or backward_in_torch_ops(grad) or is_functorch_wrapped(z):
            p = registry.normalize(z, ctx.normalizer, dim=-1, **ctx.params)
        return grad.unsqueeze(-1) * p, None, None, None

    @staticmethod
    def jvp(ctx, dz, _dnormalizer, _dparams, _dalpha):
        _, p = ctx.saved_tensors
        return (p * dz).sum(-1), None


_ConjugateTraced = without_forward_mode(_Conjugate)   # while torch.compile traces


def fenchel_young_loss(logits: torch.Tensor, target: torch.Tensor, normalizer: str = "softmax",
                       alpha: float | None = None, dim: int = -1, reduction: str = "mean") -> torch.Tensor:
    r"""The Fenchel-Young loss of ``normalizer`` (see the module docstring).

    .. math:: L(\theta; y) = \langle \theta, \hat p - y \rangle + \Omega(y) - \Omega(\hat p),
              \quad \hat p = \mathrm{normalizer}(\theta),\quad \nabla_\theta L = \hat p - y

    ``normalizer="softmax"`` is ``F.cross_entropy`` (with a distribution target: the KL
    divergence ``KL(y || softmax(theta))``); ``"sparsemax"`` the sparsemax loss
    (Martins & Astudillo 2016, arXiv 1602.02068); ``"entmax15"`` / ``"entmax"`` the
    entmax loss (Peters, Niculae & Martins 2019, arXiv 1905.05702). The normalizer is
    called through :mod:`softmaxkit.registry`. Blondel, Martins & Niculae (2020),
    arXiv 1901.02324.

    Args:
        logits: scores ``theta``, classes along ``dim``.
        target: integer class indices (the shape of ``logits`` without ``dim``) or a
            distribution (the shape of ``logits``, finite, non-negative, summing to 1 within
            the larger of 1e-5 and its dtype's eps; it is divided by its sum).
        normalizer: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"``, or any
            registered normalizer that is alpha-entmax of the scores
            (:func:`fenchel_young_normalizers`).
        alpha: the entmax alpha (a number ``>= 1``), only with a normalizer that takes it
            (default: the registry's 1.5).
        dim: the class axis.
        reduction: ``"mean"`` (over rows), ``"sum"`` or ``"none"``.

    ``-inf`` logits are masked classes, for every normalizer: they get ``p_hat = 0`` and
    add nothing to the loss. A target that puts mass on a ``-inf`` logit (a class index
    pointing at one, a distribution with ``y_j > 0`` there, or any target on a row of all
    ``-inf``) has loss ``+inf``, as ``F.cross_entropy`` gives for softmax. The gradient
    stays finite: ``p_hat - y`` on the visible classes and 0 on the ``-inf`` logits, as for
    every masked entry in softmaxkit (``F.cross_entropy`` gives ``-y`` there). A NaN logit
    gives NaN. The Hessian in the logits (``create_graph=True``, ``torch.func.hessian``) is the
    normalizer's Jacobian ``d p_hat / d theta``.
    """
    check_floating(logits, "logits")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    alpha, params = _resolve_alpha(normalizer, alpha)
    reduction = check_reduction(reduction)
    dim = check_dim(logits, dim)
    if logits.dim() == 0:
        raise ValueError("logits must have a class axis, got a 0-d tensor")
    z = logits.to(compute_dtype(logits.dtype)).movedim(dim, -1)
    if z.shape[-1]:
        # The loss is shift invariant (p_hat and y both sum to 1): computed with the visible
        # row maximum at 0, <theta, p_hat> and <theta, y> do not cancel catastrophically
        # (a row of finfo.min or -1e9 logits gave losses of 1e31 in float32).
        top = z.detach().amax(-1, keepdim=True)
        z = z - torch.where(torch.isfinite(top), top, torch.zeros((), dtype=z.dtype, device=z.device))
    if target.is_floating_point() and target.dim() == logits.dim():   # (other shapes: _target_terms says why)
        target = target.movedim(dim, -1)
    theta_y, omega_y, impossible = _target_terms(z, target, alpha)
    visible = z != float("-inf")
    if alpha == 1.0:
        conjugate = logsumexp(z, dim=-1)
        # a row of all -inf has Omega*(theta) = -inf; its loss is +inf through `impossible`
        conjugate = torch.where(visible.any(-1), conjugate, torch.zeros_like(conjugate))
    else:
        conjugate, _ = (_ConjugateTraced if torch.compiler.is_compiling() else _Conjugate).apply(
            z, normalizer, params, alpha)
    infinite = torch.where(impossible, torch.full((), float("inf"), dtype=z.dtype, device=z.device),
                           torch.zeros((), dtype=z.dtype, device=z.device))
    loss = conjugate - theta_y + omega_y + infinite
    return reduce_loss(loss, reduction).to(logits.dtype)
