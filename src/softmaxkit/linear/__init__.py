"""softmaxkit.linear: softmax-free and linear attention.

:func:`linear_attention` computes ``linear`` (elu + 1), ``performer`` (FAVOR+),
``cosformer``, ``inline``, ``mala`` and ``soft`` attention; :class:`LinearAttentionState`
decodes causally one token at a time with a constant-size state;
:func:`methods` lists the declarations (``softmaxkit list`` prints them).
"""

from .api import (
           LinearAttentionState,
           attention_weights,
           get,
           linear_attention,
           methods,
           table,
)
from .performer import draw_projection
from .soft import NewtonPinv, newton_pinv

__all__ = ["LinearAttentionState", "NewtonPinv", "attention_weights", "draw_projection", "get",
           "linear_attention", "methods", "newton_pinv", "table"]
