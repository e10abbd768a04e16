"""Attention with any normalizer.

:func:`attention` computes ``normalize(q k^T * scale + mask) v`` for every registered
normalizer: softmax through torch SDPA; on the CPU the others by query blocks against
whole visible rows with the closed-form backward of their family (:mod:`.fused`); any
streamable normalizer over key blocks (:mod:`.streaming`, rules in :mod:`.rules`); all in
``O(L)`` extra memory; small inputs and per-query parameters through the dense reference
(:mod:`.dense`). :func:`auto_method` says which ``method="auto"`` takes.
:class:`softmaxkit.nn.Attention` is the module.
"""

from .api import attention, auto_method

__all__ = ["attention", "auto_method"]
