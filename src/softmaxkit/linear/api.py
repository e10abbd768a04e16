"""``linear_attention(q, k, v, method)`` and ``LinearAttentionState`` (recurrent decoding)."""

from __future__ import annotations

import math

import torch

from .._checks import check_floating
from ..attention.inputs import prepare
from . import cosformer, elu, inline, mala, performer, soft
from ._spec import LinearMethod, check_count
from .chunked import DEFAULT_CHUNK, Sums, causal_chunked, causal_chunked_shifted, common_shift, dense, one_pass

_METHODS: dict[str, LinearMethod] = {m.name: m for m in (
    elu.METHOD, performer.METHOD, cosformer.METHOD, inline.METHOD, mala.METHOD, soft.METHOD)}


def methods() -> list[LinearMethod]:
    """Every linear-attention method's declaration, in a fixed order."""
    return list(_METHODS.values())


def table():
    """The linear-attention methods as a :class:`softmaxkit._table.Table` (``softmaxkit list``),
    built from each method's declaration."""
    from .._table import Table

    out = Table(title="Linear and softmax-free attention (softmaxkit.linear_attention)",
                columns=["method", "feature map / formula", "causal", "decoding", "paper"])
    for spec in methods():
        out.add(spec.name, f"{spec.feature_map}; a_ij = {spec.formula}", "yes" if spec.causal else "no",
                "O(1)/token" if spec.decoding else "no", spec.paper)
    return out


def get(method) -> LinearMethod:
    """The declaration of ``method``; ``ValueError`` listing the accepted names otherwise."""
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(f"unknown linear attention method {method!r}; accepted: {', '.join(_METHODS)}")
    return _METHODS[method]


def _params(spec: LinearMethod, params: dict) -> dict:
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise TypeError(f"linear attention method {spec.name!r} got unexpected parameter(s) {unknown}; "
                        f"accepted: {', '.join(spec.params) or 'none'}")
    return {**spec.params, **params}


def _chunk(chunk_size) -> int:
    chunk_size = check_count(chunk_size, "chunk_size", allow_none=True)
    return DEFAULT_CHUNK if chunk_size is None else chunk_size


def _key_visibility(attn_mask, inp):
    """``(visible (B, H|1, Lk) or None, query_varying (B, H, Lq, Lk) or None)``."""
    if inp.additive_mask is not None:
        raise TypeError("linear attention takes a bool attn_mask (True = visible): there are no scores "
                        "to add a float mask to")
    if inp.bool_mask is None or inp.bool_mask.shape[-2] == 0:   # (no query: nothing to mask)
        return None, None
    if attn_mask.dim() < 2 or attn_mask.shape[-2] == 1:
        return inp.bool_mask[..., 0, :], None
    return None, inp.bool_mask


def _features(spec, ctx, x, positions, is_query, visible):
    """``(phi, shift)``: features (zero on invisible keys) and their per-vector log scales
    ``(B, H, L, 1)`` (the feature is ``phi * e^shift``), or None when unscaled."""
    feats = spec.features(x, positions, ctx, is_query, visible)
    if feats.shift is not None and not spec.shift_invariant:
        raise RuntimeError(f"{spec.name}: scaled features need a shift-invariant combine")
    phi = feats.phi
    if not is_query and visible is not None:
        phi = torch.where(visible[..., None], phi, torch.zeros((), dtype=phi.dtype, device=phi.device))
    return phi, feats.shift


def _combine(spec, ctx, parts, den_shift):
    """The method's combine; where the sums were divided by ``e^den_shift`` (scaled features),
    ``eps`` is divided by it too, so that it floors the denominator in the kernel's own units."""
    if den_shift is not None:
        tiny = torch.finfo(parts[1].dtype).tiny
        floor = (torch.exp(math.log(ctx["eps"]) - den_shift).clamp_min(tiny) if ctx["eps"] > 0
                 else torch.tensor(tiny, dtype=parts[1].dtype, device=parts[1].device))
        ctx = {**ctx, "eps": floor}
    assert spec.combine is not None  # kernelised methods provide combine
    return spec.combine(*parts, ctx)


def _empty_output(inp, lq: int, dv: int) -> torch.Tensor:
    """Zeros ``(B, H, Lq, Dv)`` for a call with no query or no key, still attached to ``q``, ``k``
    and ``v`` (sums over their empty slices: exact zeros, gradients of zero even where they hold
    NaN), so that a backward through it runs as through any other output."""
    q, k, v = inp.given_q, inp.given_k, inp.given_v
    zero = (q[..., :0].sum(-1, keepdim=True).to(inp.q.dtype)              # (B, H, Lq, 1)
            + k[..., :0, :0].sum((-2, -1), keepdim=True).to(inp.q.dtype)   # (B, Hkv, 1, 1)
            .repeat_interleave(inp.kv_groups, dim=1)
            + v[..., :0, :].sum(-2, keepdim=True).to(inp.q.dtype)         # (B, Hkv, 1, Dv)
            .repeat_interleave(inp.kv_groups, dim=1))
    b, h = q.shape[:2]
    return zero.expand(b, h, lq, dv).to(inp.out_dtype)


def _plus(a, b):
    """``a + b`` for log scales, None when ``a`` is (unscaled features)."""
    return None if a is None else a + b


def _run_causal(spec, ctx, q, k, v, visible, qpos, kpos, sums0, chunk):
    """Causal pass for end-aligned ``q`` (``Lq``) against ``k`` (``Lk``) after ``sums0``:
    ``(parts, Sums after the last key, den_shift or None)``."""
    lq, lk = q.shape[-2], k.shape[-2]
    offset = lk - lq
    fk, kshift = _features(spec, ctx, k, kpos, False, visible)
    m = None if visible is None else visible.to(v.dtype)
    fq, qshift = _features(spec, ctx, q, qpos, True, None)
    skip = max(0, -offset)  # queries before the first key see nothing
    if kshift is not None:
        # keys before the first query are seen by every query: queries of zeros stand in for them
        fq_all = torch.nn.functional.pad(fq[..., skip:, :], (0, 0, max(0, offset), 0))
        parts, last, run = causal_chunked_shifted(fq_all, fk, kshift, v, m, sums0, chunk)
        parts = tuple(None if p is None else p[..., max(0, offset):, :] for p in parts)
        den_shift = run[..., max(0, offset):, :]
    else:
        if offset > 0:   # keys before the first query: seen by every query
            _, sums0 = one_pass(fq[..., :0, :], fk[..., :offset, :], v[..., :offset, :],
                                None if m is None else m[..., :offset], sums0)
            fk, v, m = fk[..., offset:, :], v[..., offset:, :], None if m is None else m[..., offset:]
        parts, last = causal_chunked(fq[..., skip:, :], fk, v, m, sums0, chunk, spec.uses_vsum)
        den_shift = None
    if skip:
        b, h = q.shape[:2]
        parts = tuple(None if p is None else
                      torch.cat([p.new_zeros(b, h, skip, p.shape[-1]), p], dim=-2) for p in parts)
        if den_shift is not None:
            den_shift = torch.cat([den_shift.new_zeros(b, h, skip, 1), den_shift], dim=-2)
    return parts, last, _plus(den_shift, qshift)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str = "linear", *,
                     is_causal: bool = False, attn_mask: torch.Tensor | None = None, scale: float | None = None,
                     chunk_size: int | None = None, **params) -> torch.Tensor:
    r"""Softmax-free and linear attention: ``method`` in ``linear``, ``performer``, ``cosformer``,
    ``inline``, ``mala``, ``soft``.

    The kernelised methods compute ``out_i = sum_j a_ij v_j`` with weights built from a
    feature map ``phi`` without ever forming the ``Lq x Lk`` matrix:

    ============  =============================================================  ===========================
    method        weights ``a_ij`` over the visible keys ``j``                   paper
    ============  =============================================================  ===========================
    linear        ``phi(q_i).phi(k_j) / sum_s phi(q_i).phi(k_s)``, elu + 1       Katharopoulos+ 2020, 2006.16236
    performer     same ratio, FAVOR+ positive random features                    Choromanski+ 2020, 2009.14794
    cosformer     ``relu(q_i).relu(k_j) cos(pi (p_i - p_j) / 2M)``, normalised   Qin+ 2022, 2202.08791
    inline        ``1/n + scale/n (phi(q_i).phi(k_j) - mean_s phi(q_i).phi(k_s))``  Han+ 2024, 2412.06590
    mala          ``(1 + 1/z_i) scale/n phi(q_i).phi(k_j) - z_i / n``             Fan+ 2025, 2507.00698
    soft          Nystrom-approximated Gaussian kernel, ``A V`` (non-causal)     Lu+ 2021, 2110.11945
    ============  =============================================================  ===========================

    (details and exact definitions in :mod:`softmaxkit.linear.<method>`). Non-causal
    attention is one pass over the keys; causal attention (``is_causal=True``, aligned to
    the end of the keys as in :func:`softmaxkit.attention`: query ``i`` sees keys
    ``j <= i + Lk - Lq``) is computed in chunks of ``chunk_size`` tokens (default 64), exact
    (not an approximation of the quadratic form) with ``O(L)`` memory.

    Shapes and grouped-query heads as in :func:`softmaxkit.attention`: ``q`` ``(B, H, Lq, D)``,
    ``k``, ``v`` ``(B, Hkv, Lk, D)``, ``(B, Hkv, Lk, Dv)``. ``attn_mask`` is bool (True =
    visible) broadcastable to ``(B, H, Lq, Lk)``; a key-padding mask (size 1 over the
    queries, e.g. ``(B, 1, 1, Lk)``) keeps the linear cost, a mask that varies over the
    queries is applied to the quadratic form (``O(Lq Lk)`` memory; not for SOFT). A query
    with no visible key outputs 0. float16/bfloat16 compute in float32.

    Args:
        method: one of the names above (``softmaxkit list`` prints them).
        scale: ``1/sqrt(D)`` by default; performer's kernel is ``exp(scale q.k)``, SOFT's
            ``exp(-scale |q - k|^2 / 2)``, inline's and mala's factor as in their code;
            linear and cosformer do not use it.
        chunk_size: chunk length of the causal path.
        **params: the method's parameters (``performer``: ``nb_features``, ``orthogonal``,
            ``generator``, ``projection``; ``cosformer``: ``max_len``; ``inline``: ``kernel``;
            ``soft``: ``rank``, ``newton_iters``, ``normalize``; ``eps`` where a method divides).

    Example:
        >>> q = k = v = torch.randn(1, 4, 4096, 64)
        >>> out = linear_attention(q, k, v, "linear", is_causal=True)
    """
    spec = get(method)
    merged = _params(spec, params)
    chunk = _chunk(chunk_size)
    if is_causal is True and not spec.causal:
        raise ValueError(f"method {method!r} has no causal form (is_causal=True): its landmarks pool over the "
                         "whole sequence, so every query would see future keys")
    inp = prepare(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)
    visible, per_query = _key_visibility(attn_mask, inp)
    b, h, lq, lk = inp.shape
    dv = inp.v.shape[-1]
    assert spec.check is not None  # every registered method has one
    ctx = spec.check(merged, inp.q.shape[-1], inp.q.dtype, inp.q.device)
    ctx["scale"] = inp.scale
    if lq == 0 or lk == 0:
        return _empty_output(inp, lq, dv)
    if not spec.kernelised:
        if per_query is not None:
            raise ValueError(f"method {method!r} takes only key-padding masks (attn_mask of size 1 over the "
                             "queries, e.g. (B, 1, 1, Lk))")
        assert spec.compute is not None  # methods that are not kernelised provide compute
        return spec.compute(inp.q, inp.k, inp.v, visible, ctx).to(inp.out_dtype)
    if spec.positional:
        ctx["M"] = ctx["max_len"] if ctx["max_len"] is not None else max(lq, lk)
    device, dtype = inp.q.device, inp.q.dtype
    kpos = torch.arange(lk, device=device, dtype=dtype)
    qpos = torch.arange(lq, device=device, dtype=dtype) + (lk - lq if is_causal else 0)
    if per_query is not None:
        vis = per_query
        if is_causal:
            vis = vis & (kpos[None, :] <= qpos[:, None])
        fq, qshift = _features(spec, ctx, inp.q, qpos, True, None)
        fk, kshift = _features(spec, ctx, inp.k, kpos, False, vis.any(-2))
        parts, kshift = dense(fq, fk, inp.v, vis, kshift)
        den_shift = _plus(qshift, kshift)
    elif is_causal:
        parts, _, den_shift = _run_causal(spec, ctx, inp.q, inp.k, inp.v, visible, qpos, kpos, None, chunk)
    else:
        fq, qshift = _features(spec, ctx, inp.q, qpos, True, None)
        fk, kshift = _features(spec, ctx, inp.k, kpos, False, visible)
        if kshift is not None:
            fk, kshift = common_shift(fk, kshift, visible)
        parts, _ = one_pass(fq, fk, inp.v, None if visible is None else visible.to(inp.v.dtype))
        den_shift = _plus(qshift, kshift)
    return _combine(spec, ctx, parts, den_shift).to(inp.out_dtype)


def attention_weights(q: torch.Tensor, k: torch.Tensor, method: str = "linear", *, is_causal: bool = False,
                      attn_mask: torch.Tensor | None = None, scale: float | None = None, **params) -> torch.Tensor:
    """The ``(B, H, Lq, Lk)`` attention weights ``a_ij`` that :func:`linear_attention` applies to the
    values, for inspection (``O(Lq Lk)`` memory): the output with the identity matrix as
    values, so it is exactly the same computation. Zero on invisible keys."""
    check_floating(k, "k")
    if k.dim() != 4:   # (checked before the identity is built from its shape)
        raise ValueError(f"k must have shape (B, H, L, D), got {tuple(k.shape)}")
    lk = k.shape[-2]
    eye = torch.eye(lk, dtype=k.dtype, device=k.device).expand(k.shape[0], k.shape[1], lk, lk)
    return linear_attention(q, k, eye, method, is_causal=is_causal, attn_mask=attn_mask, scale=scale, **params)


class LinearAttentionState:
    """Recurrent decoding state of a causal linear-attention method: ``O(F Dv)`` per head.

    Holds the running sums ``(sum phi(k) v^T, sum phi(k), sum v, n)`` per (batch, head) and
    the position reached, so that each :meth:`step` costs ``O(T)`` for ``T`` new tokens,
    independent of how many came before; a prefill is one ``step`` with the whole prompt.
    The outputs equal those of ``linear_attention(..., is_causal=True)`` on the whole
    sequence. For ``performer`` the random projection is drawn at the first step and kept
    (or pass ``projection``); ``cosformer`` needs a fixed ``max_len``.

    Example:
        >>> state = LinearAttentionState("linear")
        >>> out = state.step(q[:, :, :10], k[:, :, :10], v[:, :, :10])   # prefill
        >>> out = state.step(q[:, :, 10:11], k[:, :, 10:11], v[:, :, 10:11])
    """

    def __init__(self, method: str = "linear", *, scale: float | None = None, chunk_size: int | None = None,
                 **params):
        self.spec = get(method)
        if not self.spec.decoding:
            raise ValueError(f"method {method!r} has no recurrent decoding form (it is not causal)")
        self.params = _params(self.spec, params)
        if self.spec.positional and self.params.get("max_len") is None:
            raise ValueError(f"method {method!r} needs max_len for recurrent decoding (positions are "
                             "normalised by it)")
        self.scale = scale
        self.chunk = _chunk(chunk_size)
        self.ctx: dict | None = None
        self._layout: tuple = ()   # (dtype, device, head dim, value dim), fixed at the first step
        self.sums: Sums | None = None
        self.position = 0

    def reset(self) -> None:
        """Forget every key seen (the random projection, if any, is kept)."""
        self.sums, self.position = None, 0

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attend ``T`` new queries to the keys so far plus ``T`` new keys (causally).

        ``q`` ``(B, H, T, D)``, ``k``/``v`` ``(B, Hkv, T, D)``; ``key_mask`` bool ``(B, T)`` or
        broadcastable to ``(B, H, 1, T)``: False marks padding keys, never seen later either.
        """
        if all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)) and k.shape[-2] != q.shape[-2]:
            raise ValueError(f"step takes as many new keys as new queries, got {q.shape[-2]} and {k.shape[-2]}")
        mask = key_mask
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            mask = mask[:, None, None, :]
        inp = prepare(q, k, v, is_causal=True, attn_mask=mask, scale=self.scale)
        visible, per_query = _key_visibility(mask, inp)
        if per_query is not None:
            raise ValueError("key_mask must not vary over the queries (shape (B, T) or (B, H, 1, T))")
        b, h, t, _ = inp.shape
        layout = (inp.q.dtype, inp.q.device, inp.q.shape[-1], inp.v.shape[-1])
        if self.ctx is not None and layout != self._layout:
            raise ValueError(f"this state holds (dtype, device, head dim, value dim) = {self._layout}, got {layout}; "
                             "reset() keeps them, a new LinearAttentionState takes others")
        if self.ctx is None:
            assert self.spec.check is not None  # every registered method has one
            self._layout = layout
            self.ctx = self.spec.check(self.params, inp.q.shape[-1], inp.q.dtype, inp.q.device)
            self.ctx["scale"] = inp.scale
            if self.spec.positional:
                self.ctx["M"] = self.ctx["max_len"]
        if self.sums is not None and tuple(self.sums.n.shape) != (b, h):
            raise ValueError(f"this state holds (batch, heads) = {tuple(self.sums.n.shape)}, got {(b, h)}")
        if t == 0:
            return _empty_output(inp, 0, inp.v.shape[-1])
        pos = torch.arange(self.position, self.position + t, device=inp.q.device, dtype=inp.q.dtype)
        parts, last, den_shift = _run_causal(self.spec, self.ctx, inp.q, inp.k, inp.v, visible, pos, pos,
                                             self.sums, self.chunk)
        self.sums = last if torch.is_grad_enabled() else last.detach()
        self.position += t
        return _combine(self.spec, self.ctx, parts, den_shift).to(inp.out_dtype)
