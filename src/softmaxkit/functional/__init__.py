"""Every normalizer as a function, in the style of ``torch.nn.functional``.

The definitions live one per module in :mod:`softmaxkit.normalizers`; this namespace gathers
the public functions (they are also ``softmaxkit.<name>``).
"""

from ..normalizers.adaptive_softmax import adaptive_softmax
from ..normalizers.as_entmax import as_entmax
from ..normalizers.clipped_softmax import clipped_softmax
from ..normalizers.entmax import entmax
from ..normalizers.entmax15 import entmax15
from ..normalizers.multimax import modulator as multimax_modulator
from ..normalizers.multimax import multimax
from ..normalizers.relu import relu
from ..normalizers.relu_l1 import relu_l1
from ..normalizers.sa_softmax import sa_softmax
from ..normalizers.sigmoid import sigmoid
from ..normalizers.softmax import log_softmax, logsumexp, softmax
from ..normalizers.softpick import softpick
from ..normalizers.softplus_l1 import softplus_l1
from ..normalizers.sparse_softmax import sparse_softmax
from ..normalizers.sparsemax import sparsemax
from ..normalizers.ssmax import ssmax
from ..normalizers.stablemax import stablemax

__all__ = [
    "softmax", "log_softmax", "logsumexp", "adaptive_softmax", "ssmax", "sa_softmax", "multimax",
    "sparse_softmax", "sparsemax", "entmax15", "entmax", "as_entmax", "softpick", "stablemax",
    "clipped_softmax", "sigmoid", "relu", "relu_l1", "softplus_l1", "multimax_modulator",
]

# A normalizer module added to softmaxkit/normalizers/ is public here without another edit.
from ..registry import normalizers as _normalizers

for _spec in _normalizers():
    if _spec.name not in globals():
        globals()[_spec.name] = _spec.fn
        __all__.append(_spec.name)
