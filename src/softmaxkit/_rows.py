"""Argument checking and row handling shared by every normalizer.

Every public function in softmaxkit follows the same conventions (see DESIGN.md):

* ``dim`` selects the axis that is normalised (default -1); any shape is accepted.
* ``mask`` is a bool tensor broadcastable to ``x``, True = visible. Entries whose
  score is ``-inf`` behave exactly like masked entries.
* float16 / bfloat16 inputs are computed in float32 and returned in the input dtype.
* Bad input raises ``TypeError`` / ``ValueError`` naming the argument.

:func:`prepare_rows` turns ``(x, dim, mask)`` into a :class:`Rows` view whose
normalised axis is the last one, so that each normalizer is written once, for the
last axis, and :meth:`Rows.restore` puts the result back in the caller's layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def check_floating(x, name: str = "x") -> None:
    """Raise ``TypeError`` unless ``x`` is a floating-point tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}"
        )


def check_dim(x: torch.Tensor, dim, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative axis index of ``x`` (a scalar counts as 1-d)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {x.dim()} dimensions")
    return dim % ndim


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 are computed in float32; other dtypes as they are."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def check_positive(value, name: str, *, allow_tensor: bool = True) -> None:
    """Raise ``ValueError`` unless ``value`` (a number or a tensor) is > 0 everywhere."""
    if type(value) is float and 0.0 < value <= math.inf:   # the common case, at no cost
        return
    _check_number(value, name, allow_tensor)
    if isinstance(value, torch.Tensor):
        if not bool((value > 0).all()):
            raise ValueError(f"{name} must be > 0, got a tensor with min {value.min().item()}")
    elif not value > 0 or math.isnan(value):
        raise ValueError(f"{name} must be > 0, got {value}")


def check_at_least(value, minimum: float, name: str, *, allow_tensor: bool = True) -> None:
    """Raise ``ValueError`` unless ``value`` >= ``minimum`` everywhere."""
    _check_number(value, name, allow_tensor)
    if isinstance(value, torch.Tensor):
        if not bool((value >= minimum).all()):
            raise ValueError(f"{name} must be >= {minimum}, got a tensor with min {value.min().item()}")
    elif not value >= minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_nonnegative(value, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` >= 0 everywhere."""
    check_at_least(value, 0.0, name)


def check_int_in_range(value, name: str, low: int, high: int | None = None) -> int:
    """Raise unless ``value`` is an int with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value.item())
        else:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _check_number(value, name: str, allow_tensor: bool) -> None:
    if isinstance(value, torch.Tensor):
        if not allow_tensor:
            raise TypeError(f"{name} must be a number, got a tensor")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor or a number, got dtype {value.dtype}")
        if bool(torch.isnan(value).any()):
            raise ValueError(f"{name} must not contain NaN")
    elif isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")


def nonzero_or_one(d: torch.Tensor) -> torch.Tensor:
    """A denominator: 1 where ``d`` is exactly 0 (an empty row), ``d`` elsewhere, NaN included,
    so that a NaN in a row makes its whole normalised row NaN rather than unnormalised."""
    return torch.where(d == 0, torch.ones_like(d), d)


def broadcast_mask(mask, x: torch.Tensor, name: str = "mask") -> torch.Tensor | None:
    """Check ``mask`` (bool, broadcastable to ``x``) and expand it to ``x.shape``."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must have dtype torch.bool (True = visible), got {mask.dtype}")
    try:
        shape = torch.broadcast_shapes(mask.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the input shape {tuple(x.shape)}"
        )
    if mask.device != x.device:
        mask = mask.to(x.device)
    return mask.expand(x.shape)


def as_param(value, like: torch.Tensor) -> torch.Tensor | float:
    """A float stays a float; a tensor parameter is moved to ``like``'s device and compute dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(device=like.device, dtype=like.dtype)
    return float(value)


@dataclass
class Rows:
    """``x`` in compute dtype with the normalised axis moved last, and its visibility.

    Attributes:
        x: scores, compute dtype, normalised axis last.
        visible: bool, same shape as ``x``: the mask and ``x != -inf`` combined.
        safe_x: ``x`` with every invisible entry replaced by 0, so that no invisible
            entry can put an ``inf`` or ``NaN`` into a gradient.
        count: number of visible entries per row, keepdim, in compute dtype.
        any_visible: bool, keepdim: the row has at least one visible entry.
    """

    x: torch.Tensor
    visible: torch.Tensor
    dim: int
    out_dtype: torch.dtype
    scalar: bool
    shape: torch.Size

    def align(self, value, name: str):
        """A parameter given in the caller's layout, in the rows' layout and compute dtype.

        Floats pass through; a tensor must broadcast to the input's shape (``ValueError``
        naming ``name`` otherwise) and is expanded and moved like ``x``.
        """
        if not isinstance(value, torch.Tensor):
            return value
        value = value.to(device=self.x.device, dtype=self.x.dtype)
        shape = self.shape if len(self.shape) else torch.Size([1])
        try:
            if torch.broadcast_shapes(value.shape, shape) != shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(
                f"{name} of shape {tuple(value.shape)} does not broadcast to the input shape {tuple(self.shape)}"
            ) from None
        return value.expand(shape).movedim(self.dim, -1)

    @property
    def safe_x(self) -> torch.Tensor:
        return torch.where(self.visible, self.x, torch.zeros((), dtype=self.x.dtype, device=self.x.device))

    @property
    def count(self) -> torch.Tensor:
        return self.visible.sum(-1, keepdim=True).to(self.x.dtype)

    @property
    def any_visible(self) -> torch.Tensor:
        return self.visible.any(-1, keepdim=True)

    def masked_max(self) -> torch.Tensor:
        """Row maximum over visible entries (keepdim); 0 for a row with nothing visible.

        A visible ``+inf`` gives ``+inf``; callers that divide by it handle that case.
        """
        filled = self.x.masked_fill(~self.visible, float("-inf"))
        if filled.shape[-1] == 0:
            return filled.new_zeros(filled.shape[:-1] + (1,))
        m = filled.amax(-1, keepdim=True)
        return torch.where(self.any_visible, m, torch.zeros_like(m))

    def masked_min(self) -> torch.Tensor:
        """Row minimum over visible entries (keepdim); 0 for a row with nothing visible."""
        filled = self.x.masked_fill(~self.visible, float("inf"))
        if filled.shape[-1] == 0:
            return filled.new_zeros(filled.shape[:-1] + (1,))
        m = filled.amin(-1, keepdim=True)
        return torch.where(self.any_visible, m, torch.zeros_like(m))

    def zero_invisible(self, y: torch.Tensor) -> torch.Tensor:
        """Set every invisible entry of ``y`` to exactly 0."""
        return torch.where(self.visible, y, torch.zeros((), dtype=y.dtype, device=y.device))

    def restore(self, y: torch.Tensor, *, reduced: bool = False, keepdim: bool = False) -> torch.Tensor:
        """Move the last axis back to ``dim`` and cast to the input dtype.

        ``reduced=True`` is for reductions (``y`` has a trailing axis of size 1).
        """
        y = y.to(self.out_dtype)
        if reduced:
            if self.scalar:
                return y.reshape(())
            y = y.squeeze(-1)
            return y.unsqueeze(self.dim) if keepdim else y
        if self.scalar:
            return y.reshape(())
        return y.movedim(-1, self.dim)


def prepare_rows(x, dim=-1, mask=None, *, name: str = "x") -> Rows:
    """Validate ``x``, ``dim`` and ``mask`` and return a :class:`Rows` view."""
    check_floating(x, name)
    d = check_dim(x, dim)
    m = broadcast_mask(mask, x)
    scalar = x.dim() == 0
    xc = x.to(compute_dtype(x.dtype))
    if scalar:
        xc = xc.reshape(1)
        m = m.reshape(1) if m is not None else None
    xc = xc.movedim(d, -1)
    visible = xc != float("-inf")
    if m is not None:
        visible = visible & m.movedim(d, -1)
    return Rows(x=xc, visible=visible, dim=d, out_dtype=x.dtype, scalar=scalar, shape=x.shape)
