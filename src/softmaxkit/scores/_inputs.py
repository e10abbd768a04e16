"""Argument checks shared by the scores: logits, labels, probabilities, 1-d score arrays."""

from __future__ import annotations

import numpy as np
import torch

from .._checks import can_branch_on, check_floating, has_no_data


def check_logits_2d(logits, name: str = "logits") -> torch.Tensor:
    """``logits`` must be a floating tensor of shape (N, C) with N >= 1 and C >= 1."""
    check_floating(logits, name)
    if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ValueError(f"{name} must have shape (N, C) with N >= 1 and C >= 1, got {tuple(logits.shape)}")
    if can_branch_on(logits) and bool(torch.isnan(logits).any()):
        raise ValueError(f"{name} must not contain NaN")
    return logits


def check_labels(labels, n: int, num_classes: int, name: str = "labels") -> torch.Tensor:
    """``labels``: an integer tensor of shape (n,) with values in [0, num_classes)."""
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of class indices, got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of class indices, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match the {n} rows given, got {tuple(labels.shape)}")
    labels = labels.long()   # (uint16 / uint32 / uint64 have no min, max or comparisons in torch)
    if n and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"{name} must lie in [0, {num_classes - 1}] for {num_classes} classes, "
            f"got values in [{int(labels.min())}, {int(labels.max())}]"
        )
    return labels


def check_probs(probs, name: str = "probs") -> torch.Tensor:
    """``probs``: (N, C), non-negative, rows summing to one (tolerance by dtype)."""
    check_logits_2d(probs, name)
    p = probs.detach().to(torch.float64)
    atol = 1e-2 if probs.dtype in (torch.float16, torch.bfloat16) else 1e-4
    if bool((p < 0).any()) or not bool(torch.isfinite(p).all()):
        raise ValueError(f"{name} must be finite and non-negative (probabilities); pass softmax(logits)")
    err = (p.sum(1) - 1).abs().max().item()
    if err > atol:
        raise ValueError(
            f"{name} rows must sum to one (|sum - 1| <= {atol:g}), worst row is off by {err:.3g}; "
            "pass softmax(logits), not logits"
        )
    return p


def as_score_array(scores, name: str) -> np.ndarray:
    """A 1-d, non-empty, NaN-free float64 numpy copy of a tensor, array or sequence."""
    if isinstance(scores, torch.Tensor):
        if scores.is_complex():
            raise TypeError(f"{name} must be real-valued, got dtype {scores.dtype}")
        if has_no_data(scores):
            raise ValueError(f"{name} must hold values, got a {'meta' if scores.is_meta else 'fake'} tensor")
        arr = scores.detach().to("cpu", torch.float64).numpy()
    else:
        raw = np.asarray(scores)
        if np.iscomplexobj(raw):   # (float64 conversion would drop the imaginary part, with only a warning)
            raise TypeError(f"{name} must be real-valued, got dtype {raw.dtype}")
        if raw.dtype.kind in "USVMm" or scores is None:   # ("0.5" was read as 0.5; None as a 0-d array)
            raise TypeError(f"{name} must be a 1-d tensor or array of real numbers, got "
                            f"{type(scores).__name__} of dtype {raw.dtype}")
        try:
            arr = np.asarray(scores, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):   # (an int past float's range: OverflowError)
            raise TypeError(
                f"{name} must be a 1-d tensor or array of real numbers, got {type(scores).__name__}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-d (one score per sample), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not contain NaN")
    return arr
