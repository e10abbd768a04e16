"""Checked attention inputs: shapes, grouped-query heads, masks, causal alignment, tiles.

:class:`AttentionInputs` holds ``q``, ``k``, ``v`` (with key/value heads repeated up to
the query heads), the scale and the visibility rules, and answers, for any tile of
query rows by key columns, which scores are visible and what is added to them, without
ever building the ``Lq x Lk`` mask when the caller did not pass one.

Causal masking is aligned to the end of the keys: query ``i`` sees key ``j`` when
``j <= i + (Lk - Lq)``, so that a single decoding query (``Lq = 1``) sees every cached key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .._checks import can_branch_on, check_bool, check_finite, check_floating, check_has_data_like
from .._rows import compute_dtype


def per_head(value: torch.Tensor, b: int, h: int, size: int = 1) -> bool:
    """Whether a tensor parameter is constant over queries and keys (one value per batch entry and
    head at most: broadcastable to ``(B, H, 1, 1)``); a parameter of ``size > 1`` values carries
    them along its first axis."""
    shape = value.shape[1:] if size > 1 else value.shape
    try:
        return torch.broadcast_shapes(shape, (b, h, 1, 1)) == (b, h, 1, 1)
    except RuntimeError:
        return False


@dataclass
class Tile:
    """Query rows ``r0:r1`` against key columns ``c0:c1``.

    ``visible`` is None when every score of the tile is visible; ``additive`` is the slice
    of a float ``attn_mask`` (None without one).
    """

    r0: int
    r1: int
    c0: int
    c1: int
    visible: torch.Tensor | None
    additive: torch.Tensor | None


@dataclass
class AttentionInputs:
    """The checked inputs. ``given_q``, ``given_k``, ``given_v`` are the caller's tensors;
    ``q``, ``k``, ``v`` the same in the compute dtype (float32 for float16 / bfloat16) with the
    key/value heads repeated to the query heads, made on first use: SDPA takes the caller's
    tensors, and converting them anyway cost 300 us of a 480 us bf16 forward on an H200."""

    given_q: torch.Tensor
    given_k: torch.Tensor
    given_v: torch.Tensor
    scale: float
    is_causal: bool
    bool_mask: torch.Tensor | None
    additive_mask: torch.Tensor | None
    out_dtype: torch.dtype
    kv_groups: int
    # (made on first use; not functools.cached_property, whose lock dynamo cannot trace)
    _made: dict = field(default_factory=dict, repr=False)

    @property
    def q(self) -> torch.Tensor:
        if "q" not in self._made:
            self._made["q"] = self.given_q.to(compute_dtype(self.given_q.dtype))
        return self._made["q"]

    @property
    def k(self) -> torch.Tensor:
        if "k" not in self._made:
            self._made["k"] = self._all_heads(self.given_k)
        return self._made["k"]

    @property
    def v(self) -> torch.Tensor:
        if "v" not in self._made:
            self._made["v"] = self._all_heads(self.given_v)
        return self._made["v"]

    def _all_heads(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(compute_dtype(t.dtype))
        # (groups = 0 when H = 0: no head, and k, v get zero gradients)
        return t.repeat_interleave(self.kv_groups, dim=1) if self.kv_groups != 1 else t

    @property
    def device(self) -> torch.device:
        return self.given_q.device

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, Lq, Lk)``: the shape scores would have."""
        b, h, lq, _ = self.given_q.shape
        return b, h, lq, self.given_k.shape[-2]

    @property
    def offset(self) -> int:
        """``Lk - Lq``: the causal diagonal's shift (end-aligned)."""
        return self.given_k.shape[-2] - self.given_q.shape[-2]

    @property
    def has_user_mask(self) -> bool:
        return self.bool_mask is not None or self.additive_mask is not None

    def tile(self, r0: int, r1: int, c0: int, c1: int) -> Tile | None:
        """The tile ``[r0:r1, c0:c1]``, or None when causal masking hides all of it."""
        visible = None
        if self.is_causal:
            off = self.offset
            if c0 > r1 - 1 + off:
                return None
            if c1 - 1 > r0 + off:
                rows = torch.arange(r0, r1, device=self.q.device).unsqueeze(-1)
                cols = torch.arange(c0, c1, device=self.q.device)
                visible = cols <= rows + off
        if self.bool_mask is not None:
            part = self.bool_mask[..., r0:r1, c0:c1]
            visible = part if visible is None else part & visible
        additive = None
        if self.additive_mask is not None:
            additive = self.additive_mask[..., r0:r1, c0:c1]
            finite = additive != float("-inf")
            visible = finite if visible is None else finite & visible
        return Tile(r0, r1, c0, c1, visible, additive)

    def tiles(self, r0: int, r1: int, block: int):
        """The visible tiles of rows ``r0:r1`` over key blocks of ``block`` columns."""
        lk = self.k.shape[-2]
        for c0 in range(0, lk, block):
            t = self.tile(r0, r1, c0, min(c0 + block, lk))
            if t is not None:
                yield t

    def visible_count(self, r0: int, r1: int, block: int) -> torch.Tensor:
        """Visible keys per query row, shape ``(..., r1 - r0, 1)`` in the compute dtype."""
        dtype = self.q.dtype
        if not self.has_user_mask:
            lk = self.k.shape[-2]
            rows = torch.arange(r0, r1, device=self.q.device, dtype=dtype).unsqueeze(-1)
            if not self.is_causal:
                return torch.full_like(rows, float(lk))
            return (rows + self.offset + 1).clamp(0, lk)
        b, h, _, _ = self.shape
        count = torch.zeros(b, h, r1 - r0, 1, dtype=dtype, device=self.q.device)
        for t in self.tiles(r0, r1, block):
            if t.visible is None:
                count += t.c1 - t.c0
            else:
                count += t.visible.sum(-1, keepdim=True).to(dtype).expand(b, h, -1, -1)
        return count


def check_mask(attn_mask, shape, layout: str = "(B, H, Lq, Lk)",
               hint: str = "", q: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(bool_mask, additive_mask)`` of ``attn_mask`` expanded to ``shape`` (one of them None):
    bool (True = visible) or floating (added to the scores); errors name ``layout``. With ``q``,
    a mask without data (meta) beside a ``q`` with data is refused (it is moved to ``q``'s device)."""
    if attn_mask is None:
        return None, None
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool (True = visible) or floating point (added to the scores), "
                        f"got dtype {attn_mask.dtype}")
    try:
        if torch.broadcast_shapes(attn_mask.shape, shape) != tuple(shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"{layout} = {tuple(shape)}{hint}") from None
    if q is not None:
        check_has_data_like(attn_mask, q, "attn_mask", "q")
    if attn_mask.dtype == torch.bool:
        return attn_mask.expand(shape), None
    return None, attn_mask.expand(shape)


def zero_unseen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask):
    """``(q, keys, seen)`` for ``q, k, v`` (checked by :func:`prepare`): ``q`` with 0 for each
    query that ``attn_mask`` lets see no key (``seen``, ``(B or 1, H or 1, Lq, 1)``, False there;
    None when every query sees a key), and ``keys`` (``(B or 1, H or 1, Lk, 1)``, False for each
    key that it hides from every query of its head; None when it hides none), which
    :func:`hide_keys` applies to ``k`` and ``v``; None when there is no such query or key (or no
    mask).
    Their weights are exactly 0, but ``0 * NaN`` is NaN: garbage in such a slot (a preallocated
    key/value cache read past its length, ``torch.empty``'s contents) reached every output and
    gradient of the head (torch's SDPA too). They are constants of the result, so their
    gradients stay 0. ``finfo.min`` fills are not hidden (a query row of them averages the
    values), only ``False`` and ``-inf``."""
    if attn_mask is None or not isinstance(attn_mask, torch.Tensor) or attn_mask.dim() == 0:
        return None
    mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)).to(q.device)
    keys, queries = _seen_keys_and_queries(mask)
    groups = q.shape[1] // k.shape[1] if k.shape[1] else 1
    if keys.shape[1] != 1 and groups != 1:    # a key/value head is seen when any of its query heads sees it
        keys = keys.reshape(keys.shape[0], k.shape[1], groups, keys.shape[-1]).any(2)
    keys = keys.unsqueeze(-1)
    branch = can_branch_on(mask)
    every_query = branch and bool(queries.all())
    every_key = branch and bool(keys.all())
    if every_query and every_key:
        return None
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    return (q if every_query else torch.where(queries, q, zero),   # (a copy of q: 1.2 ms at 2 x 8 x 1024 x 64)
            None if every_key else keys, None if every_query else queries)


def hide_keys(k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with 0 where ``keys`` (:func:`zero_unseen`) is False."""
    zero = torch.zeros((), dtype=k.dtype, device=k.device)
    return torch.where(keys, k, zero), torch.where(keys, v, zero)


def _seen_keys_and_queries(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether the 4-d ``mask`` lets any query see each key (``(B or 1, H or 1, Lk)``) and each
    query see any key (``(B or 1, H or 1, Lq, 1)``): ``amax`` over the mask's bytes (a bool
    mask) or values (a float one; NaN counts as seen), a tenth to a fortieth of the time of
    ``any`` over a bool copy (1 ms for a 1024 x 1024 float mask on the CPU)."""
    if mask.numel() == 0:   # (amax refuses an empty axis)
        seen = mask if mask.dtype == torch.bool else mask != float("-inf")
        return seen.any(-2), seen.any(-1, keepdim=True)
    if mask.dtype == torch.bool:
        values, hidden = mask.view(torch.uint8), 0.0
    else:
        values, hidden = mask, float("-inf")
    return values.amax(-2) != hidden, values.amax(-1, keepdim=True) != hidden


def prepare(q, k, v, *, is_causal: bool, attn_mask, scale) -> AttentionInputs:
    """Check ``q, k, v`` (``(B, H, L, D)``), the mask and the scale; repeat key/value heads."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_floating(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    b, h, lq, d = q.shape
    bk, hk, lk, dk = k.shape
    if (bk, hk, lk) != tuple(v.shape[:3]):
        raise ValueError(f"k and v must agree in (B, H, L), got {tuple(k.shape)} and {tuple(v.shape)}")
    if bk != b:
        raise ValueError(f"q and k must have the same batch size, got {b} and {bk}")
    if dk != d:
        raise ValueError(f"q and k must have the same head dimension, got {d} and {dk}")
    if hk == 0 and h:
        raise ValueError(f"{h} query heads need at least one key/value head, got k and v with 0 heads")
    if hk and h % hk:
        raise ValueError(f"the number of query heads ({h}) must be a multiple of the key/value heads ({hk})")
    is_causal = check_bool(is_causal, "is_causal")
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    else:
        check_finite(scale, "scale", allow_tensor=False)
    groups = h // hk if hk else 1   # (no heads on either side: nothing to repeat)
    dtype = compute_dtype(q.dtype)
    bool_mask, additive = check_mask(attn_mask, (b, h, lq, lk), q=q)
    if additive is not None:  # (moved to q's device, as a bool mask is)
        additive = additive.to(dtype=dtype, device=q.device)
    if bool_mask is not None and bool_mask.device != q.device:
        bool_mask = bool_mask.to(q.device)
    return AttentionInputs(q, k, v, float(scale), is_causal, bool_mask, additive, q.dtype, groups)
