"""Hugging Face ``transformers`` integration: every normalizer as an ``attn_implementation``.

>>> import softmaxkit as sk
>>> sk.hf.register()                                   # once per process
>>> model = AutoModelForCausalLM.from_config(cfg, attn_implementation="softmaxkit_softpick")
>>> sk.hf.swap(model, "ssmax")                         # switch a built model; s per head is learned

:func:`register` adds ``softmaxkit_<name>`` for every registered normalizer to
``transformers``' ``AttentionInterface`` (the attention function) and
``AttentionMaskInterface`` (the boolean masks of ``sdpa``: True = visible, so padding
and causal masks hide keys from the normalizer instead of adding a large negative
number, which would be wrong for sigmoid, ReLU or SSMax's key count). The attention
itself is :func:`softmaxkit.attention`: streaming for the streamable normalizers, torch
SDPA for ``softmaxkit_softmax``.

Parameters: a model switched with :func:`swap` carries a :class:`softmaxkit.nn.Normalizer`
per attention layer (``<layer>.softmaxkit_normalizer``, learnable parameters per head, in
the state dict). Without it the registry defaults apply, except ``sparse_softmax``,
whose ``k`` has no default: its spec's fallback applies (8 keys, or every key of a
shorter row). Attention dropout is not applied (a warning says so once).

``transformers`` is imported only inside these functions: ``import softmaxkit`` never
imports it. Written against transformers 5 (``AttentionInterface.register``).
"""

from __future__ import annotations

import warnings

import torch

from . import registry

__all__ = ["register", "swap", "implementation_name", "PREFIX"]

PREFIX = "softmaxkit_"
_dropout_warned = False


def implementation_name(normalizer: str) -> str:
    """``"softmaxkit_<normalizer>"``, the ``attn_implementation`` of a registered normalizer."""
    registry.get(normalizer)
    return PREFIX + normalizer


def _layer_params(module, name: str, key_length: int) -> dict:
    norm = getattr(module, "softmaxkit_normalizer", None)
    if norm is not None and norm.name == name:
        params = norm.call_params()
    else:
        params = {}
    return registry.get(name).params_for_length(params, key_length)


def _with_position_bias(attention_mask, position_bias):
    """The additive mask of T5-style relative position biases (``position_bias``, added to the
    scores before the normalizer, as the models' eager attention adds it) combined with the
    model's mask: hidden where a bool mask is False, the sum with a float one."""
    if position_bias is None:
        return attention_mask
    if attention_mask is None:
        return position_bias
    if attention_mask.dtype == torch.bool:
        return position_bias.masked_fill(~attention_mask, float("-inf"))
    return position_bias + attention_mask


def _attention_function(name: str):
    from .attention import attention

    def softmaxkit_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                     scaling: float | None = None, is_causal: bool | None = None, **kwargs):
        global _dropout_warned
        if kwargs.get("softcap") is not None:
            raise ValueError(f"{PREFIX}{name} does not support softcap")
        if dropout and getattr(module, "training", False) and not _dropout_warned:
            warnings.warn(f"{PREFIX}{name}: attention dropout ({dropout}) is not applied", stacklevel=2)
            _dropout_warned = True
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        causal = bool(causal) and attention_mask is None and query.shape[2] > 1
        params = _layer_params(module, name, key.shape[2])
        if kwargs.get("s_aux") is not None:   # gpt-oss's per-head sink logits
            if name != "softmax_sink":
                raise ValueError(f"{PREFIX}{name} does not support attention sinks (s_aux); "
                                 f"use {PREFIX}softmax_sink")
            params["sink"] = kwargs["s_aux"].reshape(1, -1, 1, 1).to(query.dtype)
        mask = _with_position_bias(attention_mask, kwargs.get("position_bias"))
        out = attention(query, key, value, name, is_causal=causal, attn_mask=mask, scale=scaling, **params)
        return out.transpose(1, 2).contiguous(), None

    softmaxkit_attention_forward.__name__ = f"{PREFIX}{name}_attention_forward"
    return softmaxkit_attention_forward


def register() -> list[str]:
    """Register ``softmaxkit_<name>`` for every normalizer with ``transformers``; returns the names."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    names = []
    for name in registry.names():
        impl = PREFIX + name
        AttentionInterface.register(impl, _attention_function(name))
        AttentionMaskInterface.register(impl, sdpa_mask)
        names.append(impl)
    return names + _register_linear(AttentionInterface, AttentionMaskInterface, sdpa_mask)


def _attention_layers(model):
    """The modules that call the attention interface (``...Attention`` layers with a config)."""
    for module in model.modules():
        if (type(module).__name__.endswith("Attention") and hasattr(module, "config")
                and (hasattr(module, "head_dim") or hasattr(module, "attention_head_size"))):   # (BERT's name)
            yield module


def swap(model, normalizer: str, learnable: bool = True, **params):
    """Switch an already built ``transformers`` model to ``normalizer``; returns the model.

    Registers the implementations if needed, sets ``attn_implementation`` to
    ``softmaxkit_<normalizer>`` and gives every attention layer a
    :class:`softmaxkit.nn.Normalizer` (``layer.softmaxkit_normalizer``) with one value per
    head of each learnable parameter: they become model parameters (buffers when
    ``learnable=False``) and are saved in ``model.state_dict()``. ``params`` are initial or
    fixed normalizer parameters (e.g. ``k=8`` for sparse_softmax).
    """
    from .nn import Normalizer

    impl = implementation_name(normalizer)
    register()
    layers = list(_attention_layers(model))
    if not layers:
        raise ValueError("swap found no attention layer (a module named '...Attention' with config and head_dim "
                         "or attention_head_size) "
                         f"in {type(model).__name__}")
    for layer in layers:
        heads = getattr(layer, "num_heads", None) or layer.config.num_attention_heads
        reference = next(layer.parameters(), None)
        norm = Normalizer(normalizer, param_shape=(heads, 1, 1), learnable=learnable, **params)
        if reference is not None:
            norm = norm.to(device=reference.device, dtype=reference.dtype)
        layer.softmaxkit_normalizer = norm
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl
    return model


# --- softmax-free / linear attention: softmaxkit_linear_<method> for the causal methods ---

#: ``attn_implementation`` prefix of the linear-attention methods.
LINEAR_PREFIX = PREFIX + registry.RESERVED_PREFIX   # (register_normalizer refuses such names)
#: Performer's random projection in layer ``i`` is drawn from seed ``PERFORMER_SEED + i``.
PERFORMER_SEED = 0


def _linear_params(module, method, query) -> dict:
    from .linear import draw_projection, get

    spec = get(method)
    params = {}
    if "projection" in spec.params:
        proj = getattr(module, "softmaxkit_linear_projection", None)
        if proj is None or proj.shape[-1] != query.shape[-1]:
            seed = PERFORMER_SEED + int(getattr(module, "layer_idx", 0) or 0)
            proj = draw_projection(spec.params["nb_features"], query.shape[-1],
                                   generator=_generator(seed)).to(query.device)
            module.softmaxkit_linear_projection = proj
        params["projection"] = proj
    if "max_len" in spec.params:
        params["max_len"] = int(module.config.max_position_embeddings)
    return params


def _generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def _linear_function(method: str):
    """The attention function of ``softmaxkit_linear_<method>``.

    Causal layers run :func:`softmaxkit.linear_attention` with the key-padding mask read
    from the boolean mask (a key is visible when some query sees it). Without autograd
    (generation), each layer keeps a :class:`softmaxkit.linear.LinearAttentionState` in
    ``layer._softmaxkit_linear_state``: a call that continues the sequence it has seen (the
    cache holds exactly its keys plus the new ones: the same count, and the same float64 sum
    of the keys it saw) costs ``O(new tokens)`` of compute plus one read of the cached keys,
    whatever the cache length; any other call starts a new state. (The last key alone was
    not enough: two prompts of one length ending in the same token, in a first layer with
    rotary positions, have the same last key.)
    """
    from .linear import LinearAttentionState, linear_attention

    def softmaxkit_linear_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                            scaling: float | None = None, is_causal: bool | None = None,
                                            **kwargs):
        import torch

        causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        params = _linear_params(module, method, query)
        key_mask = None
        if attention_mask is not None:
            if attention_mask.dtype != torch.bool:
                attention_mask = attention_mask == 0 if attention_mask.is_floating_point() else attention_mask.bool()
            key_mask = attention_mask.any(-2, keepdim=True)
        lq, lk = query.shape[2], key.shape[2]
        if not causal or torch.is_grad_enabled():
            out = linear_attention(query, key, value, method, is_causal=causal, attn_mask=key_mask,
                                   scale=scaling, **params)
            return out.transpose(1, 2).contiguous(), None
        held = getattr(module, "_softmaxkit_linear_state", None)
        new_mask = None if key_mask is None else key_mask[..., lk - lq:]
        if held is not None:
            state, seen_keys = held
            seen = state.position
            if seen == lk - lq and seen > 0 and _same_keys(seen_keys, key[:, :, :seen]):
                out = state.step(query, key[:, :, seen:], value[:, :, seen:], key_mask=new_mask)
                module._softmaxkit_linear_state = (state, _key_sum(key))
                return out.transpose(1, 2).contiguous(), None
        if lq != lk:   # a cache this layer did not see being filled: recompute, keep no state
            out = linear_attention(query, key, value, method, is_causal=True, attn_mask=key_mask,
                                   scale=scaling, **params)
            return out.transpose(1, 2).contiguous(), None
        state = LinearAttentionState(method, scale=scaling, **params)
        out = state.step(query, key, value, key_mask=new_mask)
        module._softmaxkit_linear_state = (state, _key_sum(key))
        return out.transpose(1, 2).contiguous(), None

    softmaxkit_linear_attention_forward.__name__ = f"{LINEAR_PREFIX}{method}_attention_forward"
    return softmaxkit_linear_attention_forward


def _key_sum(key):
    """The keys' sum over positions in float64, ``(B, Hkv, D)``: what a layer remembers of the
    keys its linear-attention state has seen."""
    return key.double().sum(-2)


def _same_keys(seen_sum, keys) -> bool:
    """Whether ``keys`` (the cache's first positions) are the ones summed in ``seen_sum``: the
    same shape and float64 sum, to float64 rounding (the sums of one float32 cache, read
    through views of other strides, may round differently)."""
    if seen_sum.shape != keys.shape[:2] + keys.shape[3:]:
        return False
    now = _key_sum(keys)
    return bool(((now - seen_sum).abs() <= 1e-12 * (now.abs() + seen_sum.abs()) + 1e-300).all())


def _register_linear(attention_interface, mask_interface, sdpa_mask) -> list[str]:
    """Register ``softmaxkit_linear_<method>`` for every causal linear-attention method."""
    from .linear import methods

    names = []
    for spec in methods():
        if spec.causal:
            impl = LINEAR_PREFIX + spec.name
            attention_interface.register(impl, _linear_function(spec.name))
            mask_interface.register(impl, sdpa_mask)
            names.append(impl)
    return names
