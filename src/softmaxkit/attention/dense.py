"""The dense reference: ``normalize(q k^T * scale + attn_mask) v`` through the registry.

It builds the whole ``Lq x Lk`` score matrix, so it is the definition that the streaming
path is tested against, and the path taken for normalizers that cannot stream
(``sparse_softmax``: its top-k needs the whole row) or parameters that vary per query
or key.
"""

from __future__ import annotations

import torch

from .. import registry
from .inputs import AttentionInputs


def visible_scores(inp: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The full score matrix ``q k^T * scale (+ additive mask)`` and its visibility (None = all)."""
    b, h, lq, lk = inp.shape
    tile = inp.tile(0, lq, 0, lk) if lq and lk else None
    x = torch.matmul(inp.q, inp.k.transpose(-1, -2)) * inp.scale
    if tile is None:
        visible = torch.zeros(b, h, lq, lk, dtype=torch.bool, device=x.device) if lq and lk else None
        return x, visible
    if tile.additive is not None:
        x = x + tile.additive
    return x, tile.visible


def dense_attention(inp: AttentionInputs, normalizer: str, params: dict) -> torch.Tensor:
    """``normalize(scores, normalizer, mask=visible, **params) @ v`` with the full score matrix."""
    x, visible = visible_scores(inp)
    if visible is not None:
        visible = visible.expand(x.shape)
    if x.shape[-1] == 0:  # no key at all: every row is empty (output 0), whatever the parameters
        out = torch.matmul(x, inp.v)  # (sparse_softmax's k <= row length would refuse them)
        for val in params.values():  # tensor parameters get a zero gradient, as on every other path
            if isinstance(val, torch.Tensor) and val.requires_grad:
                out = out + 0.0 * val.sum()
        return out.to(inp.out_dtype)
    p = registry.normalize(x, normalizer, dim=-1, mask=visible, **params)
    return torch.matmul(p, inp.v).to(inp.out_dtype)
