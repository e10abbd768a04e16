"""Attention with any normalizer.

:func:`attention` computes ``normalize(q k^T * scale + mask) v`` for every registered
normalizer: softmax through torch SDPA, the streamable normalizers over key blocks in
``O(L)`` extra memory (:mod:`.streaming`, rules in :mod:`.rules`), the rest through the
dense reference (:mod:`.dense`). :class:`softmaxkit.nn.Attention` is the module.
"""

from .api import attention, auto_method

__all__ = ["attention", "auto_method"]
