"""``torch.nn`` modules: a normalizer with its learnable parameters, and attention layers.

:class:`Normalizer` owns a normalizer's learnable parameters, declared in its spec
(``softmaxkit/normalizers/<name>.py``) with the papers' initialisations;
:class:`Attention` is multi-head (grouped-query) attention with any normalizer;
:class:`LinearAttention` the softmax-free and linear methods of :mod:`softmaxkit.linear`.
"""

from .attention import Attention
from .linear_attention import LinearAttention
from .normalizer import Normalizer

__all__ = ["Normalizer", "Attention", "LinearAttention"]
