r"""The declaration every linear-attention method makes, and the table of methods.

A method of the kernelised family writes its attention weights as

.. math:: a_{ij} = A_i\, \phi(q_i)^\top \phi(k_j) + B_i

over the keys ``j`` visible to query ``i``, where ``A_i`` and ``B_i`` depend on ``q_i`` only
through ``num_i = sum_j phi(q_i).phi(k_j) v_j``, ``den_i = phi(q_i).sum_j phi(k_j)``, the sum
of the visible values and their count ``n_i``. Every such method is therefore computed from
the four running sums ``(sum phi(k) v^T, sum phi(k), sum v, n)``: in one pass for
non-causal attention, chunk by chunk for causal attention, one token at a time when
decoding (:mod:`softmaxkit.linear.chunked`). A method declares its feature map
(:attr:`LinearMethod.features`) and how the sums combine (:attr:`LinearMethod.combine`);
nothing outside its module switches on its name.

SOFT (:mod:`softmaxkit.linear.soft`) is not of this form (a Nystrom approximation of a
Gaussian kernel); it declares ``kernelised=False`` and its own ``compute``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Literal, overload

import torch
import torch.nn.functional as torch_f

from .._checks import can_branch_on


@dataclass(frozen=True)
class Features:
    """Feature vectors of a block of queries or keys.

    ``phi`` is ``(B, H, L, F)``. ``shift`` (keys only, ``(B, H, 1, 1)`` or None) says that
    ``phi`` was divided by ``exp(shift)`` for numerical range: a factor common to every key
    cancels in methods whose ``combine`` is invariant to it (``shift_invariant``).
    """

    phi: torch.Tensor
    shift: torch.Tensor | None = None


@dataclass(frozen=True)
class LinearMethod:
    """One softmax-free / linear attention method.

    Attributes:
        name: the ``method`` string of :func:`softmaxkit.linear_attention`.
        feature_map: the feature map or kernel, in words (for ``softmaxkit list``).
        formula: the attention weights (for ``softmaxkit list``).
        paper: authors, year, arXiv id.
        causal: supports ``is_causal=True``.
        decoding: supports O(1)-per-token recurrent decoding (:class:`LinearAttentionState`).
        params: accepted parameters and their defaults.
        check: ``check(params, head_dim, dtype, device) -> ctx``: validates the parameters
            (``ValueError``/``TypeError`` naming them) and returns what ``features`` needs.
        features: ``features(x, positions, ctx, is_query, visible) -> Features`` with
            ``x`` ``(B, H, L, D)``, ``positions`` ``(L,)`` absolute positions (float),
            ``visible`` ``(B, H|1, L)`` bool or None (keys only).
        combine: ``combine(num, den, vsum, n, ctx) -> out`` (the weights above).
        shift_invariant: ``combine`` is unchanged when every ``phi(k)`` is scaled by one
            positive factor (required by features that return a ``shift``).
        kernelised: False for SOFT, which provides ``compute`` instead.
        positional: the feature map depends on the token position (cosFormer).
        uses_vsum: ``combine`` reads ``vsum`` (else the causal path may pass None).
    """

    name: str
    feature_map: str
    formula: str
    paper: str
    causal: bool
    decoding: bool
    params: dict[str, Any] = field(default_factory=dict)
    check: Callable | None = None
    features: Callable | None = None
    combine: Callable | None = None
    shift_invariant: bool = False
    kernelised: bool = True
    positional: bool = False
    uses_vsum: bool = True
    compute: Callable | None = None


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1``, the feature map of ``linear`` and ``mala``, on a contiguous copy of a
    strided ``x``: torch's ``elu_backward`` gives a transposed input (the heads of
    ``nn.LinearAttention``, ``(B, L, H, D)`` seen as ``(B, H, L, D)``) a gradient of other strides
    than its meta kernel says, and ``torch.compile``'s AOT backward then failed on a ``view``
    ("view size is not compatible with input tensor's size and stride")."""
    return torch_f.elu(x.contiguous()).add_(1.0)


def ratio_combine(num, den, vsum, n, ctx):
    """``num / den`` (clamped at ``ctx["eps"]``): normalised linear attention; 0 with no key."""
    out = num / den.clamp_min(ctx["eps"])
    return zero_where_empty(out, n)


def zero_where_empty(out, n):
    """``out`` with 0 on the queries that see no key (``n == 0``); no copy when there are none
    (known only where ``n`` has values to read: not on meta tensors nor under ``torch.func``)."""
    empty = n == 0
    if can_branch_on(empty) and not bool(empty.any()):
        return out
    return torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)


def check_eps(value, name: str = "eps", allow_zero: bool = False) -> float:
    """``value`` as a float: a finite number ``> 0`` (``>= 0`` with ``allow_zero``); a numpy or
    one-element tensor scalar is taken as its value."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return value


@overload
def check_count(value, name: str, *, minimum: int = 1, allow_none: Literal[False] = False, what: str = "") -> int: ...
@overload
def check_count(value, name: str, *, minimum: int = 1, allow_none: bool, what: str = "") -> int | None: ...
def check_count(value, name: str, *, minimum: int = 1, allow_none: bool = False, what: str = "") -> int | None:
    """``value`` as an int ``>= minimum`` (None passes with ``allow_none``): any integer, a numpy one
    included (``__index__``), not a bool nor a float; ``TypeError`` / ``ValueError`` naming ``name``."""
    desc = ("a positive int" if minimum == 1 else f"an int >= {minimum}") + what + (" or None" if allow_none else "")
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be {desc}, got {type(value).__name__}")
    try:
        number = operator.index(value)
    except TypeError:   # (a float tensor has __index__ and refuses)
        raise TypeError(f"{name} must be {desc}, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be {desc}, got {number!r}")
    return number
