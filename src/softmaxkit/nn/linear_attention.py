"""``softmaxkit.nn.LinearAttention``: multi-head linear attention as a module."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_head_shape, check_sequence_inputs
from ..linear.api import LinearAttentionState, get, linear_attention
from ..linear.performer import draw_projection


class LinearAttention(nn.Module):
    r"""Multi-head (grouped-query) attention with a softmax-free / linear method.

    .. math:: \mathrm{head}_h = \mathrm{LinAttn}_{\text{method}}(Q_h, K_{g(h)}, V_{g(h)}),\quad
              \mathrm{out} = [\mathrm{head}_1, \dots, \mathrm{head}_H] W_o

    where ``LinAttn`` is :func:`softmaxkit.linear_attention` (``linear``, ``performer``,
    ``cosformer``, ``inline``, ``mala``, ``soft``; papers there) and ``kv_heads`` key/value
    heads are shared by groups of query heads (Ainslie et al. 2023, arXiv 2305.13245).
    Performer's random projection is a buffer drawn at construction (``seed`` or the global
    generator), saved in the state dict; :meth:`redraw_features` draws a new one.

    Args:
        dim: model width; heads: query heads; method: the linear-attention method;
        kv_heads: key/value heads (default ``heads``, must divide it);
        head_dim: features per head (default ``dim // heads``); bias: projection biases;
        is_causal: default for :meth:`forward`; seed (or ``generator=``): fixes performer's
        projection (the other methods draw none);
        **params: the method's parameters (e.g. ``nb_features=128``, ``rank=16``).

    Example:
        >>> layer = LinearAttention(64, heads=4, method="performer", kv_heads=2, is_causal=True)
        >>> x = torch.randn(2, 100, 64)
        >>> y = layer(x)
        >>> state = layer.new_state()
        >>> y0 = layer.step(x[:, :1], state)   # decoding, one token at a time
    """

    def __init__(self, dim: int, heads: int, method: str = "linear", kv_heads: int | None = None,
                 head_dim: int | None = None, bias: bool = True, is_causal: bool = False,
                 seed: int | None = None, **params):
        super().__init__()
        self.spec = get(method)
        unknown = sorted(set(params) - set(self.spec.params))
        if unknown:
            raise TypeError(f"method {method!r} got unexpected parameter(s) {unknown}; "
                            f"accepted: {', '.join(self.spec.params) or 'none'}")
        heads, kv_heads, head_dim = check_head_shape(dim, heads, kv_heads, head_dim)
        if is_causal and not self.spec.causal:
            raise ValueError(f"method {method!r} has no causal form (is_causal=True)")
        self.method, self.dim, self.heads, self.kv_heads, self.head_dim = method, dim, heads, kv_heads, head_dim
        self.is_causal = check_bool(is_causal, "is_causal")
        bias = check_bool(bias, "bias")   # (bias=0.0 or a tensor: truthiness decided silently)
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(heads * head_dim, dim, bias=bias)
        self.params = dict(params)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if "projection" in self.spec.params and params.get("projection") is None:
            generator = self.params.pop("generator", None)
            if generator is not None and seed is not None:
                raise ValueError("pass seed or generator, not both: each fixes performer's projection")
            self.params.pop("projection", None)
            self._seed = seed
            self.register_buffer("projection", self._draw(seed, generator))
        elif "projection" in self.spec.params:   # a projection given: a buffer too (saved, moved with the module)
            given = self.params.pop("projection")
            if not isinstance(given, torch.Tensor):
                raise TypeError(f"projection must be a floating tensor (features, head_dim={head_dim}), got "
                                f"{type(given).__name__}")
            if not given.is_floating_point() or given.dim() != 2 \
                    or given.shape[1] != head_dim:
                raise ValueError(f"projection must be a floating tensor (features, head_dim={head_dim}), got "
                                 f"{tuple(given.shape) if isinstance(given, torch.Tensor) else type(given).__name__}")
            self.params["nb_features"] = given.shape[0]
            self.register_buffer("projection", given.detach().clone())
            self._given_projection = given.detach().clone()   # (reset_parameters; .to() leaves it)
        else:   # (a seed is accepted and unused: one constructor call serves every method)
            self.projection = None

    def _draw(self, seed, generator=None) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed) if seed is not None else generator
        return draw_projection(self.params.get("nb_features", self.spec.params["nb_features"]), self.head_dim,
                               orthogonal=self.params.get("orthogonal", True), generator=gen)

    def redraw_features(self, seed: int | None = None) -> None:
        """Draw a new random projection (performer only)."""
        if self.projection is None:
            raise ValueError(f"method {self.method!r} has no random features to redraw")
        self.projection.copy_(self._draw(seed))

    def reset_parameters(self) -> None:
        """Initialise the projections (``nn.Linear``'s initialisation) again, in place, and
        performer's random projection: the one given, else a draw from ``seed`` (the global
        generator when none was given): after ``to_empty`` of a module built on the meta device."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            proj.reset_parameters()
        if self.projection is None:
            return
        given = getattr(self, "_given_projection", None)
        with torch.no_grad():
            if given is None:
                with torch.device("cpu"):
                    drawn = self._draw(self._seed)
                self.projection.copy_(drawn)
            elif given.is_meta:
                raise ValueError("projection was given on the meta device: it holds no value to reset to")
            else:
                self.projection.copy_(given)

    def _method_params(self) -> dict:
        params = {k: v for k, v in self.params.items() if k not in ("nb_features", "orthogonal")} \
            if self.projection is not None else dict(self.params)
        if self.projection is not None:
            params["projection"] = self.projection
        return params

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, heads, self.head_dim).transpose(1, 2)

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        b, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, length, self.heads * self.head_dim))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, is_causal: bool | None = None) -> torch.Tensor:
        """``x`` ``(B, L, dim)`` attends to ``context`` (default ``x``); ``key_padding_mask``
        bool ``(B, Lcontext)``, True = visible."""
        context = x if context is None else context
        check_sequence_inputs(x, context, self.dim)
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(context), self.kv_heads)
        v = self._split(self.v_proj(context), self.kv_heads)
        mask = None
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool \
                    or key_padding_mask.shape != (context.shape[0], context.shape[1]):
                raise ValueError(f"key_padding_mask must be a bool tensor (B, Lcontext) = "
                                 f"{tuple(context.shape[:2])}")
            mask = key_padding_mask[:, None, None, :]
        out = linear_attention(q, k, v, self.method, is_causal=self.is_causal if is_causal is None else is_causal,
                               attn_mask=mask, **self._method_params())
        return self._merge(out)

    def new_state(self) -> LinearAttentionState:
        """An empty recurrent state for :meth:`step` (causal methods)."""
        return LinearAttentionState(self.method, **self._method_params())

    def step(self, x: torch.Tensor, state: LinearAttentionState) -> torch.Tensor:
        """Decode ``T`` new tokens ``x`` ``(B, T, dim)`` causally after those in ``state``."""
        if not isinstance(state, LinearAttentionState):
            raise TypeError(f"state must be a LinearAttentionState (from new_state()), got {type(state).__name__}")
        if state.spec.name != self.method:
            raise ValueError(f"state decodes method {state.spec.name!r}, this layer {self.method!r}: "
                             "take the state from this layer's new_state()")
        check_sequence_inputs(x, x, self.dim)
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(x), self.kv_heads)
        v = self._split(self.v_proj(x), self.kv_heads)
        return self._merge(state.step(q, k, v))

    def extra_repr(self) -> str:
        parts = [f"method={self.method!r}, dim={self.dim}, heads={self.heads}, kv_heads={self.kv_heads}, "
                 f"head_dim={self.head_dim}, is_causal={self.is_causal}"]
        if self.projection is not None:   # (the method's parameters were left out: nb_features=16 read as 256)
            parts.append(f"nb_features={self.projection.shape[0]}")
        parts += [f"{k}={v!r}" for k, v in self.params.items() if k != "nb_features"]
        return ", ".join(parts)
