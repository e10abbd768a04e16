"""softmaxkit: the softmax function and every serious alternative to it.

One API for every normalizer (:func:`normalize`, :func:`normalizers`), exact reference
definitions in :mod:`softmaxkit.functional`, fast kernels picked by
:mod:`softmaxkit.kernels.dispatch`, attention that streams with any normalizer, the
losses and samplers built on softmax, confidence/OOD scores, neighbouring ops, and a
benchmark and arena that measure the published claims side by side.
"""

from . import algorithms, functional, hf, losses, nn, ops, sampling, scores
from .algorithms import OnlineSoftmaxState
from .attention import attention
from .functional import (
    adaptive_softmax,
    as_entmax,
    clipped_softmax,
    entmax,
    entmax15,
    log_softmax,
    logsumexp,
    multimax,
    relu,
    relu_l1,
    sa_softmax,
    sigmoid,
    softmax,
    softpick,
    softplus_l1,
    sparse_softmax,
    sparsemax,
    ssmax,
    stablemax,
)
from .kernels.dispatch import use_backend
from .topk import log_softmax_topk, softmax_topk
from .registry import NormalizerSpec, normalize, normalizers
from .sampling import soften

__version__ = "0.1.0"

__all__ = [
    "normalize", "normalizers", "NormalizerSpec", "OnlineSoftmaxState", "attention", "use_backend",
    "softmax", "log_softmax", "logsumexp", "adaptive_softmax", "ssmax", "sa_softmax", "multimax",
    "sparse_softmax", "sparsemax", "entmax15", "entmax", "as_entmax", "softpick", "stablemax",
    "clipped_softmax", "sigmoid", "relu", "relu_l1", "softplus_l1", "softmax_topk", "log_softmax_topk",
    "soften", "algorithms", "functional", "hf", "losses", "nn", "ops", "sampling", "scores",
]
