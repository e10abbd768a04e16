"""Losses built on softmax and its alternatives.

* :func:`linear_cross_entropy`: cross-entropy of ``hidden @ weight.T (+ bias)`` without
  ever holding the ``N x V`` logits (online logsumexp over vocabulary blocks).
* :func:`fenchel_young_loss`: the loss that goes with a normalizer: cross-entropy for
  softmax, the sparsemax loss, the entmax loss; gradient ``p - y``.
* :func:`spherical_z_loss` (de Brébisson & Vincent 2016) and :func:`logit_z_penalty`
  (the PaLM auxiliary ``1e-4 * logsumexp^2``): two different things called "z-loss".
"""

from .fenchel_young import fenchel_young_loss
from .linear_cross_entropy import linear_cross_entropy
from .z_losses import logit_z_penalty, spherical_z_loss

__all__ = ["linear_cross_entropy", "fenchel_young_loss", "spherical_z_loss", "logit_z_penalty"]
