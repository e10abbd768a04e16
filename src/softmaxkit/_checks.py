"""The one place for argument validation.

Every public function checks its arguments with these helpers, so that bad input raises
the same kind of error everywhere: ``TypeError`` for the wrong kind of value,
``ValueError`` for a value out of range, each naming the argument and what it accepts.
Nothing is clipped or coerced silently. The values of a tensor argument are checked only
where they can be read (:func:`can_branch_on`): not while ``torch.compile`` traces, under a
``torch.func`` transform, or on meta tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Real
from typing import cast

import numpy as np
import torch

__all__ = [
    "check_floating", "check_dim", "check_positive", "check_at_least", "check_nonnegative",
    "check_int_in_range", "check_number", "check_finite", "check_bool", "check_known_params",
    "check_choice", "check_count", "check_head_shape", "check_in_range", "is_functorch_wrapped", "can_branch_on",
    "transforms_active", "under_transform",
    "has_no_data", "check_has_data_like", "backward_in_torch_ops", "FLOATING_DTYPES",
]

#: Whether a tensor is seen through a ``torch.func`` transform (``vmap``, ``grad``): it has no
#: data of its own to read or branch on.
is_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


#: Whether a ``torch.func`` transform is active, whichever tensors it wraps.
transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)

#: How many ``TorchDispatchMode``s are active: ``make_fx``'s tracer (which records the torch ops
#: it sees: a kernel's work, done outside them, left an empty tensor in the graph),
#: ``FlopCounterMode``, a fake-tensor mode.
dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)


def under_transform() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vmap``, ``jvp``...), a forward-mode AD
    level or a ``TorchDispatchMode`` (:data:`dispatch_modes`) is active: kernels, autograd
    Functions without a forward derivative and branches on values step aside for plain
    differentiable torch ops there."""
    return (transforms_active() or torch.autograd.forward_ad._current_level >= 0
            or (not torch.compiler.is_compiling() and dispatch_modes() > 0))   # (dynamo cannot trace the count)


def can_branch_on(t: torch.Tensor) -> bool:
    """Whether a branch on the values of ``t`` is allowed: not while ``torch.compile`` traces,
    not under a ``torch.func`` transform (even when ``t`` itself is not wrapped: the branch
    usually combines it with tensors that are, a ``vmap`` over the mask alone), not on a tensor
    without data (meta, fake)."""
    return not (torch.compiler.is_compiling() or transforms_active() or dispatch_modes() > 0
                or is_functorch_wrapped(t) or has_no_data(t))


def backward_in_torch_ops(grad: torch.Tensor | None) -> bool:
    """Whether a backward must be written in differentiable torch ops rather than a kernel: a
    graph of the gradient is being built (``create_graph=True``), or the incoming gradient is
    batched (``is_grads_batched=True``, vectorised ``jacobian`` / ``hessian``: a tensor seen
    through vmap, with no storage whose address a kernel could read)."""
    if torch.is_grad_enabled():
        return True
    if grad is None:
        return False
    try:
        grad.data_ptr()
    except RuntimeError:
        return True
    return False


def has_no_data(t: torch.Tensor) -> bool:
    """A meta tensor, or a fake one (``FakeTensorMode``, ``make_fx(tracing_mode="fake")``,
    export): shapes only, no values to read or branch on."""
    if t.is_meta:
        return True
    if type(t) is torch.Tensor:
        return False
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:   # (a torch without it)
        return False
    return is_fake(t)


def check_has_data_like(t: torch.Tensor, like: torch.Tensor, name: str, like_name: str = "x") -> None:
    """``ValueError`` naming ``name`` for a tensor argument without data (meta, fake) beside an
    input that has some: it is moved to the input's device, which torch refuses with "Cannot copy
    out of meta tensor; no data!" (a mask or parameter left on the meta device)."""
    if t.device != like.device and has_no_data(t) and not has_no_data(like):
        raise ValueError(f"{name} is a {t.device.type} tensor without data; give it on the device of "
                         f"{like_name} ({like.device})")


#: The floating dtypes softmaxkit computes in (float8 formats have almost no CPU ops in torch).
FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_floating(x: object, name: str = "x") -> None:
    """Raise ``TypeError`` unless ``x`` is a tensor of one of :data:`FLOATING_DTYPES` (a float8
    tensor raised NotImplementedError from the first arithmetic op)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOATING_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}"
        )


def check_dim(x: torch.Tensor, dim: object, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative axis index of ``x`` (a scalar counts as 1-d); a NumPy
    integer counts as an int, as torch takes it."""
    if isinstance(dim, np.integer) and not isinstance(dim, np.bool_):
        dim = int(dim)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {x.dim()} dimensions")
    return dim % ndim


#: The least int that ``float()`` refuses (it rounds to 2^1024).
_FLOAT_INT_LIMIT = 2**1024 - 2**970


def _check_kind(value: object, name: str, allow_tensor: bool) -> None:
    if isinstance(value, torch.Tensor):
        if not allow_tensor:
            raise TypeError(f"{name} must be a number, got a tensor")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor or a number, got dtype {value.dtype}")
    elif isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    elif isinstance(value, int) and not abs(value) < _FLOAT_INT_LIMIT:   # (math.isnan(value) would raise OverflowError)
        raise ValueError(f"{name} must be within the range of a float, got an int of {value.bit_length()} bits")


def check_number(value: object, name: str, *, allow_tensor: bool = True) -> None:
    """A real number (not a bool) or, if allowed, a floating tensor; NaN is refused, inf allowed."""
    _check_kind(value, name, allow_tensor)
    if isinstance(value, torch.Tensor):
        if can_branch_on(value) and bool(torch.isnan(value).any()):
            raise ValueError(f"{name} must not contain NaN")
    elif math.isnan(value):  # type: ignore[arg-type]
        raise ValueError(f"{name} must not be NaN")


def check_finite(value: object, name: str, *, allow_tensor: bool = True) -> None:
    """A finite number or a floating tensor without NaN or inf."""
    _check_kind(value, name, allow_tensor)
    if isinstance(value, torch.Tensor):
        if can_branch_on(value) and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} must be finite (no NaN or inf)")
    elif not math.isfinite(value):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be finite, got {value}")


def check_positive(value: object, name: str, *, allow_tensor: bool = True, finite: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` (a number or a tensor) is > 0 everywhere (and
    finite, with ``finite``: a temperature of ``inf`` has no softmax, only a limit)."""
    if type(value) is float and 0.0 < value and (value < math.inf or not finite):  # the common case
        return
    check_number(value, name, allow_tensor=allow_tensor)
    what = "finite and > 0" if finite else "> 0"
    if isinstance(value, torch.Tensor):
        if not can_branch_on(value):
            return
        ok = value > 0
        if finite:
            ok &= torch.isfinite(value)
        if not bool(ok.all()):
            bad = value[~ok].flatten()[0].item()
            raise ValueError(f"{name} must be {what}, got a tensor holding {bad}")
    elif not value > 0 or (finite and not math.isfinite(value)):  # type: ignore[operator, arg-type]
        raise ValueError(f"{name} must be {what}, got {value}")


def check_at_least(value: object, minimum: float, name: str, *, allow_tensor: bool = True) -> None:
    """Raise ``ValueError`` unless ``value`` >= ``minimum`` everywhere."""
    check_number(value, name, allow_tensor=allow_tensor)
    if isinstance(value, torch.Tensor):
        if can_branch_on(value) and not bool((value >= minimum).all()):
            raise ValueError(f"{name} must be >= {minimum}, got a tensor with min {value.min().item()}")
    elif not value >= minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_nonnegative(value: object, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` >= 0 everywhere."""
    check_at_least(value, 0.0, name)


def check_int_in_range(value: object, name: str, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int, raising unless it is an int with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
                and value.dtype != torch.bool:
            value = int(value.item())
        elif isinstance(value, np.integer):
            value = int(value)
        else:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_bool(value: object, name: str) -> bool:
    """Return ``value`` as a bool if it is one (NumPy's ``bool_`` included); ``TypeError``
    otherwise (no truthiness)."""
    if isinstance(value, np.bool_):
        return bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(value: object, name: str, choices: Iterable[object]) -> None:
    """``ValueError`` listing ``choices`` unless ``value`` is one of them."""
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")


def check_known_params(given: Mapping[str, object], accepted: Iterable[str], owner: str) -> None:
    """``TypeError`` naming the unexpected keyword parameters of ``owner`` and the accepted ones."""
    accepted = list(accepted)
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TypeError(f"{owner} got unexpected parameter(s) {unknown}; accepted: {', '.join(accepted) or 'none'}")


def check_count(n: object, name: str = "n") -> None:
    """A row count override: ``None``, a finite number >= 1, or a tensor >= 1 and finite
    everywhere (a length of ``inf`` has no ``log n`` to scale by, only a limit)."""
    if n is None:
        return
    if isinstance(n, torch.Tensor):
        if n.dtype == torch.bool or n.is_complex():
            raise TypeError(f"{name} must be a real tensor, got dtype {n.dtype}")
        if not can_branch_on(n):
            return
        if n.is_floating_point() and bool(torch.isnan(n).any()):
            raise ValueError(f"{name} must not contain NaN")
        if not bool(((n >= 1) & (n < math.inf)).all()):
            raise ValueError(f"{name} must be finite and >= 1 everywhere")
        return
    if isinstance(n, bool) or not isinstance(n, Real):
        raise TypeError(f"{name} must be a number >= 1 (a row length, possibly fractional), a tensor or None, "
                        f"got {type(n).__name__}")
    check_at_least(n, 1, name, allow_tensor=False)
    if not math.isfinite(n):
        raise ValueError(f"{name} must be finite (a row length), got {n}")


def check_sequence_inputs(x: torch.Tensor, context: torch.Tensor, dim: int) -> None:
    """``x`` and ``context`` of an attention module: tensors ``(B, L, dim)`` with one batch size."""
    for name, t in (("x", x), ("context", context)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3 or t.shape[-1] != dim:
            raise ValueError(f"{name} must have shape (B, L, dim) with dim={dim}, got {tuple(t.shape)}")
    if context.shape[0] != x.shape[0]:
        raise ValueError(f"x and context must have the same batch size, got {x.shape[0]} and {context.shape[0]}")


def check_head_shape(dim: object, heads: object, kv_heads: object, head_dim: object) -> tuple[int, int, int]:
    """``(heads, kv_heads, head_dim)`` of a multi-head layer of width ``dim``: positive ints, ``kv_heads``
    (default ``heads``) dividing ``heads``, ``head_dim`` (default ``dim // heads``) given when ``heads``
    does not divide ``dim``."""
    for name, value in (("dim", dim), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    assert isinstance(dim, int) and isinstance(heads, int)
    kv_heads = heads if kv_heads is None else kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must be a positive int dividing heads={heads}, got {kv_heads!r}")
    if head_dim is None:
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}; pass head_dim")
        head_dim = dim // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    return heads, kv_heads, head_dim


def check_in_range(value: object, name: str, low: float, high: float | None = None) -> float:
    """``value`` as a float: a finite real number (not a bool; a NumPy float counts) with
    ``low <= value <= high`` (NaN and infinities refused; an int past float's range is a
    ``ValueError``, not the ``OverflowError`` of ``math.isfinite``)."""
    _check_kind(value, name, allow_tensor=False)
    number = cast(float, value)   # (a real number now, of any type: int, float, NumPy)
    if not (number >= low and math.isfinite(number)) or (high is not None and not number <= high):
        bound = f"in [{low}, {high}]" if high is not None else f"finite and >= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return float(number)
