"""softmaxkit: the softmax function and every serious alternative to it.

One API for every normalizer (:func:`normalize`, :func:`normalizers`), exact reference
definitions in :mod:`softmaxkit.normalizers` (one module each), fast kernels picked by
:mod:`softmaxkit.kernels.dispatch`, attention that streams with any normalizer, the
losses and samplers built on softmax, confidence/OOD scores, neighbouring ops, and a
benchmark and arena that measure the published claims side by side.
"""

from importlib.metadata import PackageNotFoundError, version

from . import algorithms, distributed, functional, hf, losses, nn, ops, sampling, scores
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
from .linear import linear_attention
from .registry import (
    NormalizerSpec,
    normalize,
    normalizers,  # type: ignore[no-redef]
    register_normalizer,
    unregister_normalizer,
)
from .sampling import soften
from .topk import log_softmax_topk, softmax_topk

try:  # the version lives in pyproject.toml only
    __version__ = version("softmaxkit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "normalize", "normalizers", "NormalizerSpec", "register_normalizer", "unregister_normalizer",
    "OnlineSoftmaxState", "attention", "use_backend",
    "softmax", "log_softmax", "logsumexp", "adaptive_softmax", "ssmax", "sa_softmax", "multimax",
    "sparse_softmax", "sparsemax", "entmax15", "entmax", "as_entmax", "softpick", "stablemax",
    "clipped_softmax", "sigmoid", "relu", "relu_l1", "softplus_l1", "softmax_topk", "log_softmax_topk",
    "soften", "linear_attention", "algorithms", "distributed", "functional", "hf", "losses", "nn", "ops",
    "sampling", "scores",
]

for _name in functional.__all__:  # normalizer modules added after the list above
    if _name not in globals():
        globals()[_name] = getattr(functional, _name)
        __all__.append(_name)
