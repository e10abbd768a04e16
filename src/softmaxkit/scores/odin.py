r"""ODIN: temperature scaling plus a small input perturbation (Liang, Li & Srikant 2018).

Liang, Li & Srikant (2018), "Enhancing the reliability of out-of-distribution image
detection in neural networks", ICLR, arXiv 1706.02690.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from .._checks import FLOATING_DTYPES, check_finite, check_floating, check_nonnegative, check_positive
from .._rows import compute_dtype


def odin(model: nn.Module, x: torch.Tensor, temperature: float = 1000.0,
         epsilon: float = 0.0014) -> torch.Tensor:
    r"""ODIN score of each input: the temperature-scaled MSP after an input perturbation.

    .. math::
        \tilde x = x - \varepsilon \,\mathrm{sign}\!\left(-\nabla_x \log S_{\hat y}(x; T)\right),
        \qquad \mathrm{score}(x) = \max_i S_i(\tilde x; T),
        \qquad S(x; T) = \mathrm{softmax}(f(x) / T)

    with :math:`\hat y = \arg\max_i f(x)_i`: each input is nudged in the direction that
    raises its own top softmax probability, which raises it more for in-distribution
    inputs than for OOD ones. Higher = more in-distribution. ``epsilon = 0`` gives the
    temperature-scaled MSP alone (one forward pass, no gradient).

    ``model`` is any classifier ``nn.Module`` mapping a batch ``x`` (batch axis first) to
    logits of shape (N, C). ``epsilon`` is in the units of ``x`` as given to the model:
    the paper's 0.0014 was for images scaled to [0, 1] before per-channel normalisation
    (their code divides the gradient sign by the channel std); rescale it for other input
    scales. Only the gradient with respect to ``x`` is computed: the model's parameter
    ``.grad`` fields are left untouched, and the call works inside ``torch.no_grad()``.

    The model must be in eval mode: in training mode dropout makes the two forward
    passes disagree and batch norm would both mix samples in a batch and overwrite its
    running statistics, so a model in training mode raises ``ValueError`` (call
    ``model.eval()`` first) rather than returning a silently different score. In eval
    mode the samples of a batch are independent, so the summed loss gives each input its
    own gradient.

    Args:
        model: the classifier, in eval mode.
        x: floating input batch.
        temperature: ``T > 0``, finite (paper: 1000).
        epsilon: perturbation size, finite and ``>= 0`` (paper: 0.0014 on CIFAR); a tensor must
            broadcast to ``x`` without changing its shape (one per input: shape (N, 1, ...)).

    Returns:
        Tensor of shape (N,), in ``x``'s dtype.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        raise ValueError(
            "model must be in eval mode for odin (call model.eval()): in training mode dropout and "
            "batch norm would change the scores and batch norm's running statistics"
        )
    check_floating(x, "x")
    if x.dim() == 0 or x.shape[0] == 0:
        raise ValueError(f"x must be a non-empty batch with the batch axis first, got shape {tuple(x.shape)}")
    check_positive(temperature, "temperature", allow_tensor=False, finite=True)
    check_nonnegative(epsilon, "epsilon")
    check_finite(epsilon, "epsilon")
    if isinstance(epsilon, torch.Tensor):   # (the perturbation's product raised a bare size mismatch)
        try:
            fits = torch.broadcast_shapes(epsilon.shape, x.shape) == x.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"epsilon of shape {tuple(epsilon.shape)} does not broadcast to x of shape "
                             f"{tuple(x.shape)}")

    if not bool(torch.as_tensor(epsilon).ne(0).any()):
        # x~ = x: no gradient needed (and none taken: a NaN gradient times 0 made the score NaN)
        with torch.no_grad():
            return F.softmax(_logits(model, x.detach()), temperature=temperature).amax(-1).to(x.dtype)
    x_in = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = _logits(model, x_in)
        if not logits.requires_grad:
            raise ValueError(
                "model's logits do not depend differentiably on x (a detached or integer path, or a call "
                "under torch.inference_mode()): the perturbation needs their gradient; pass epsilon=0 for "
                "the temperature-scaled MSP alone")
        log_probs = F.log_softmax(logits, temperature=temperature)
        top = logits.detach().argmax(-1, keepdim=True)
        loss = -log_probs.gather(-1, top).sum()
        (grad,) = torch.autograd.grad(loss, x_in)
    x_tilde = x.detach() - epsilon * grad.sign()
    with torch.no_grad():
        return F.softmax(_logits(model, x_tilde), temperature=temperature).amax(-1).to(x.dtype)


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's logits, checked to be (N, C), in float32 at least (T = 1000 needs the precision)."""
    out = model(x)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != x.shape[0] or out.shape[1] == 0:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model must return logits of shape (N, C), C >= 1, for a batch of N inputs, got {shape}")
    if out.dtype not in FLOATING_DTYPES:
        raise TypeError(f"model must return floating-point logits, got dtype {out.dtype}")
    return out.to(compute_dtype(out.dtype))
