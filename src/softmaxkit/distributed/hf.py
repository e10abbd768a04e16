"""Context-parallel Hugging Face attention: ``softmaxkit_cp_<name>`` implementations.

>>> import softmaxkit.distributed.hf as cp_hf
>>> cp_hf.register(layout="contiguous")          # once per process, after init_process_group
>>> model.set_attn_implementation("softmaxkit_cp_softpick")
>>> out = model(input_ids=local_ids, position_ids=local_positions)   # this rank's shard

Every rank feeds the model its shard of the sequence with the *global* ``position_ids``
of its tokens (for rotary embeddings); each attention layer then runs
:func:`softmaxkit.distributed.context_parallel_attention` (the ring; the threshold family
and non-streamable normalizers through :func:`~softmaxkit.distributed.ulysses_attention`)
with causal masking over global positions. The shard-local masks that ``transformers``
would build are not used (the mask function registered for these names returns None), so
padding masks are not supported here: pass unpadded sequences. Per-layer parameters set by
:func:`softmaxkit.hf.swap` are used as in :mod:`softmaxkit.hf`.
"""

from __future__ import annotations

from .. import registry
from ..hf import _layer_params
from ._comm import resolve

__all__ = ["PREFIX", "register"]

PREFIX = "softmaxkit_cp_"


def _no_mask(*args, **kwargs):
    """The mask function of the context-parallel names: no shard-local mask (causal is global)."""


def _attention_function(name: str, group, layout: str):
    from ..attention.rules import rule_for
    from .ring import context_parallel_attention
    from .ulysses import ulysses_attention

    spec = registry.get(name)

    def softmaxkit_cp_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                        scaling: float | None = None, is_causal: bool | None = None, **kwargs):
        if attention_mask is not None:
            raise ValueError(f"{PREFIX}{name} takes no attention mask (padding is not supported context-parallel)")
        causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        length = key.shape[2]
        if any(p.for_length is not None for p in spec.param_specs):
            # a parameter fitted to the row length (sparse_softmax's k) sees the whole sequence's
            # keys, not this rank's shard (k = min(8, 6) on 6 of 12 keys gave other logits)
            length = sum(n for (n,) in resolve(group).all_gather_ints([length]))
        params = _layer_params(module, name, length)
        if rule_for(name, {**spec.params, **params}) is not None:
            out = context_parallel_attention(query, key, value, name, group=group, is_causal=causal, layout=layout,
                                             scale=scaling, **params)
        else:
            out = ulysses_attention(query, key, value, name, group=group, is_causal=causal, layout=layout,
                                    scale=scaling, **params)
        return out.transpose(1, 2).contiguous(), None

    softmaxkit_cp_attention_forward.__name__ = f"{PREFIX}{name}_attention_forward"
    return softmaxkit_cp_attention_forward


def register(group=None, layout: str = "contiguous") -> list[str]:
    """Register ``softmaxkit_cp_<name>`` for every normalizer with ``transformers``; returns the names.

    ``group`` (default: the default process group) and ``layout`` (how the ranks hold the
    sequence, see :func:`softmaxkit.distributed.shard_sequence`) apply to all of them."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from ._comm import check_layout

    check_layout(layout)
    names = []
    for name in registry.names():
        impl = PREFIX + name
        AttentionInterface.register(impl, _attention_function(name, group, layout))
        AttentionMaskInterface.register(impl, _no_mask)
        names.append(impl)
    return names
