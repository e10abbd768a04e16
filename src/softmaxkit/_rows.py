"""Argument checking and row handling shared by every normalizer.

Every public function in softmaxkit follows the same conventions (see DESIGN.md):

* ``dim`` selects the axis that is normalised (default -1); any shape is accepted.
* ``mask`` is a bool tensor broadcastable to ``x``, True = visible. Entries whose
  score is ``-inf`` behave exactly like masked entries.
* float16 / bfloat16 inputs are computed in float32 and returned in the input dtype.
* Bad input raises ``TypeError`` / ``ValueError`` naming the argument (the checks live in
  :mod:`softmaxkit._checks`).

:func:`prepare_rows` turns ``(x, dim, mask)`` into a :class:`Rows` view whose
normalised axis is the last one, so that each normalizer is written once, for the
last axis, and :meth:`Rows.restore` puts the result back in the caller's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_dim, check_floating, check_has_data_like

LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 are computed in float32; other dtypes as they are."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


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
        check_has_data_like(mask, x, name)
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

    def align(self, value, name: str, dtype: torch.dtype | None = None):
        """A parameter given in the caller's layout, in the rows' layout and compute dtype
        (or ``dtype``).

        Floats pass through; a tensor must broadcast to the input's shape (``ValueError``
        naming ``name`` otherwise) and is expanded and moved like ``x``.
        """
        if not isinstance(value, torch.Tensor):
            return value
        check_has_data_like(value, self.x, name)
        value = value.to(device=self.x.device, dtype=self.x.dtype if dtype is None else dtype)
        shape = self.shape if len(self.shape) else torch.Size([1])
        try:
            if torch.broadcast_shapes(value.shape, shape) != shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(
                f"{name} of shape {tuple(value.shape)} does not broadcast to the input shape {tuple(self.shape)}"
            ) from None
        return value.expand(shape).movedim(self.dim, -1)

    def per_row(self, value, name: str, dtype: torch.dtype | None = None):
        """A parameter with one value per row, as shape ``(..., 1)`` in the rows' layout and
        compute dtype or ``dtype`` (floats pass through): a tensor must broadcast to the input
        and have size 1 along ``dim`` (e.g. ``(..., 1)`` or per head ``(H, 1, 1)``);
        ``ValueError`` naming ``name`` otherwise."""
        if not isinstance(value, torch.Tensor):
            return value
        ndim = max(len(self.shape), 1)
        padded = (1,) * (ndim - value.dim()) + tuple(value.shape)
        if value.dim() <= ndim and padded[self.dim] != 1:
            raise ValueError(
                f"{name} must have one value per row (size 1 along dim={self.dim}), got shape {tuple(value.shape)}"
            )
        return self.align(value, name, dtype)[..., :1]

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
