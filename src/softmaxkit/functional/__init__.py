"""The reference definitions of every normalizer, in plain differentiable PyTorch.

Kernels in :mod:`softmaxkit.kernels` are faster implementations of these same
definitions and are tested against them.
"""

from .rectified import relu, relu_l1, sigmoid, softpick, softplus_l1
from .softmax import (
    ADAPTIVE_POLY,
    MULTIMAX_R_INIT,
    MULTIMAX_T_INIT,
    SSMAX_S_INIT,
    adaptive_softmax,
    clipped_softmax,
    log_softmax,
    logsumexp,
    multimax,
    multimax_modulator,
    sa_softmax,
    softmax,
    sparse_softmax,
    ssmax,
    stablemax,
)
from .sparse import as_entmax, entmax, entmax15, sparsemax

__all__ = [
    "softmax", "log_softmax", "logsumexp", "adaptive_softmax", "ssmax", "sa_softmax", "multimax",
    "multimax_modulator", "sparse_softmax", "stablemax", "clipped_softmax", "sparsemax", "entmax15",
    "entmax", "as_entmax", "softpick", "sigmoid", "relu", "relu_l1", "softplus_l1",
    "SSMAX_S_INIT", "MULTIMAX_R_INIT", "MULTIMAX_T_INIT", "ADAPTIVE_POLY",
]
