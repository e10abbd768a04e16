"""Argument checks and reductions shared by the losses."""

from __future__ import annotations

import torch

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(reduction) -> str:
    """``reduction`` must be one of ``"mean"``, ``"sum"``, ``"none"``."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    return reduction


def reduce_loss(per_item: torch.Tensor, reduction: str, counted: torch.Tensor | None = None) -> torch.Tensor:
    """``"none"``: ``per_item`` as is; ``"sum"``: its sum; ``"mean"``: the sum divided by
    the number of counted items (all of them when ``counted`` is None), 0 when none counts."""
    if reduction == "none":
        return per_item
    total = per_item.sum()
    if reduction == "sum":
        return total
    count = per_item.numel() if counted is None else int(counted.sum())
    return total / max(count, 1)
