"""``softmaxkit.nn.Attention``: multi-head (and grouped-query) attention with any normalizer."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .. import registry
from .._checks import check_bool, check_head_shape, check_sequence_inputs
from ..attention import attention
from .normalizer import Normalizer


class Attention(nn.Module):
    r"""Multi-head attention whose weights come from any registered normalizer.

    .. math:: \mathrm{head}_h = \mathrm{normalize}\big(Q_h K_{g(h)}^\top / \sqrt{d}\big) V_{g(h)},\quad
              \mathrm{out} = [\mathrm{head}_1, \dots, \mathrm{head}_H] W_o

    with ``kv_heads`` key/value heads shared by groups of query heads (grouped-query
    attention, Ainslie et al. 2023, arXiv 2305.13245; ``kv_heads=1`` is multi-query).
    Where the normalizer's paper learns parameters, each head learns its own: SSMax ``s``
    (Nakanishi 2025), the sigmoid bias offset (Ramapuram et al. 2024), MultiMax ``r`` and
    ``t`` (Zhou et al. 2024), entmax ``alpha`` (Correia et al. 2019), AS-Entmax ``alpha``,
    ``beta``; they live in ``self.normalizer`` (a :class:`softmaxkit.nn.Normalizer`) and are
    saved in the state dict. The attention itself is :func:`softmaxkit.attention`, so
    streamable normalizers never build the ``L x L`` matrix.

    Args:
        dim: model width (input and output features).
        heads: query heads; ``dim`` must be divisible by ``heads`` unless ``head_dim`` is given.
        normalizer: a registered normalizer name.
        kv_heads: key/value heads (default ``heads``); must divide ``heads``.
        head_dim: features per head (default ``dim // heads``).
        bias: use biases in the projections.
        is_causal: default causal masking for :meth:`forward`.
        learnable: learn the normalizer's parameters (False keeps them as buffers).
        **params: the normalizer's parameters (initial values of learnable ones, fixed values
            of the others, e.g. ``k=8`` for sparse_softmax).

    Example:
        >>> layer = Attention(64, heads=4, normalizer="ssmax", kv_heads=2, is_causal=True)
        >>> y = layer(torch.randn(2, 100, 64))
    """

    def __init__(self, dim: int, heads: int, normalizer: str = "softmax", kv_heads: int | None = None,
                 head_dim: int | None = None, bias: bool = True, is_causal: bool = False,
                 learnable: bool = True, **params):
        super().__init__()
        heads, kv_heads, head_dim = check_head_shape(dim, heads, kv_heads, head_dim)
        self.dim, self.heads, self.kv_heads, self.head_dim = dim, heads, kv_heads, head_dim
        self.is_causal = check_bool(is_causal, "is_causal")
        if not isinstance(bias, (bool, np.bool_)):   # (bias=-1.0, meant for sigmoid, became True silently)
            raise TypeError(f"bias must be a bool (biases in the projections), got {type(bias).__name__}"
                            + (f"; normalizer {normalizer!r}'s own bias parameter cannot be set through "
                               "Attention" if "bias" in registry.get(normalizer).params else ""))
        bias = bool(bias)
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(heads * head_dim, dim, bias=bias)
        self.normalizer = Normalizer(normalizer, param_shape=(heads, 1, 1), learnable=learnable, **params)

    def reset_parameters(self) -> None:
        """Initialise the projections (``nn.Linear``'s initialisation) and the normalizer's
        parameters (their initial values) again, in place: after ``to_empty`` of a module built
        on the meta device."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            proj.reset_parameters()
        self.normalizer.reset_parameters()

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, is_causal: bool | None = None) -> torch.Tensor:
        """Attend from ``x`` ``(B, L, dim)`` to ``context`` (default ``x``): ``(B, L, dim)``.

        ``attn_mask`` (bool, True = visible, or additive float) broadcasts to
        ``(B, heads, L, Lcontext)``; ``is_causal`` defaults to the module's setting.
        """
        context = x if context is None else context
        check_sequence_inputs(x, context, self.dim)
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(context), self.kv_heads)
        v = self._split(self.v_proj(context), self.kv_heads)
        params = self.normalizer.spec.params_for_length(
            self.normalizer.call_params(), k.shape[-2])
        out = attention(q, k, v, self.normalizer.name, is_causal=self.is_causal if is_causal is None else is_causal,
                        attn_mask=attn_mask, **params)
        b, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, length, self.heads * self.head_dim))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, heads={self.heads}, kv_heads={self.kv_heads}, head_dim={self.head_dim}, "
                f"is_causal={self.is_causal}")
