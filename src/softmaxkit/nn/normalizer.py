"""``softmaxkit.nn.Normalizer``: a registered normalizer as a module that owns its learnable parameters.

Which parameters are learnable, their initial values and constraints are declared in
each normalizer's spec (:class:`softmaxkit.registry.Learnable`), as the papers do them:
SSMax ``s`` = 0.43 (Nakanishi 2025); MultiMax ``r``, ``t`` (4 values each), truncated
normal of std 0.02 (official MultiMax code); entmax ``alpha`` = 1.5, kept in (1, 2) as
``1 + sigmoid(raw)`` (Correia et al. 2019); the sigmoid bias offset 0, i.e. the paper's
bias ``-log n`` (Ramapuram et al. 2024). A user's normalizer has none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import registry
from .._checks import check_bool, check_dim, check_finite, check_int_in_range, check_known_params, has_no_data
from ..registry import Learnable, Param

__all__ = ["Normalizer"]


def _initial(param: Param, learn: Learnable, value: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """The initial tensor of ``shape`` (values along a leading axis when ``param.size > 1``)."""
    full = ((param.size,) if param.size > 1 else ()) + shape
    if isinstance(value, torch.Tensor):
        tensor = value.detach().clone().to(torch.get_default_dtype())
        if param.size > 1 and (tensor.dim() == 0 or tensor.shape[0] != param.size):
            raise ValueError(f"{param.name} must have {param.size} entries along its first axis, "
                             f"got shape {tuple(tensor.shape)}")
        if tensor.dim() > len(full):
            return tensor
        try:
            return tensor.reshape(tensor.shape + (1,) * (len(full) - tensor.dim())).expand(full).clone()
        except RuntimeError:
            raise ValueError(f"{param.name} of shape {tuple(tensor.shape)} does not broadcast to param_shape "
                             f"{shape}") from None
    values = [value] if param.size == 1 else list(value)
    if len(values) != param.size:
        raise ValueError(f"{param.name} must have {param.size} entries, got {len(values)}")
    for i, v in enumerate(values):
        check_finite(v, param.name if param.size == 1 else f"{param.name}[{i}]", allow_tensor=False)
    floats = [float(v) for v in values]
    if learn.init_std is not None and not any(floats):
        tensor = torch.empty(full)
        nn.init.trunc_normal_(tensor, std=learn.init_std)  # bounds [-2, 2], as timm and the official code
        return tensor
    if param.size == 1:
        return torch.full(full, floats[0])
    return torch.tensor(floats).reshape((param.size,) + (1,) * len(shape)).expand(full).clone()


def _tensor_summary(t: torch.Tensor) -> str:
    """A fixed tensor parameter in a module's repr: its value when it holds one, else its shape."""
    if t.numel() == 1 and not has_no_data(t):
        return f"tensor({t.item():g})"
    return f"tensor(shape={tuple(t.shape)})"


def _param_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"param_shape must be a tuple of ints, got {type(shape).__name__}")
    return tuple(check_int_in_range(size, f"param_shape[{i}]", 0) for i, size in enumerate(shape))


#: The most axes of the construction probe (:meth:`Normalizer._check_fixed_params`): a ``dim``
#: beyond it is checked against each input instead.
_PROBE_MAX_RANK = 1024


class Normalizer(nn.Module):
    """A registered normalizer as a module, owning its learnable parameters.

    Args:
        name: a registered normalizer name (``softmaxkit list``).
        dim: the axis normalised (default -1).
        param_shape: shape of each learnable scalar, broadcastable to the input: ``()``
            for one shared value, ``(heads, 1, 1)`` for one value per attention head of
            scores shaped ``(batch, heads, queries, keys)``.
        learnable: register the parameters as ``nn.Parameter`` (True) or as buffers (False).
        **params: initial values of learnable parameters, and fixed parameters
            (e.g. ``temperature=0.5`` for softmax, ``k=8`` for sparse_softmax).

    Example:
        >>> norm = Normalizer("ssmax", param_shape=(4, 1, 1))   # one s per head
        >>> p = norm(torch.randn(2, 4, 16, 16))
    """

    def __init__(self, name: str, dim: int = -1, param_shape: tuple[int, ...] = (), learnable: bool = True,
                 **params: Any):
        super().__init__()
        self.spec = registry.get(name)
        check_known_params(params, self.spec.params, f"normalizer {name!r}")
        self.name = name
        self.dim = check_int_in_range(dim, "dim", -(2 ** 62))
        self.param_shape = _param_shape(param_shape)
        learnable = check_bool(learnable, "learnable")
        self._learned: dict[str, str] = {}   # parameter name -> attribute holding it (raw when constrained)
        self._init_values: dict[str, Any] = {}   # parameter name -> initial value given (for reset_parameters)
        for param in self.spec.param_specs:
            if param.learnable is None:
                continue
            value = params.pop(param.name, param.learnable.init)
            initial = _initial(param, param.learnable, value, self.param_shape)
            self._init_values[param.name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            check_finite(initial, param.name)
            if learnable:
                tensor = param.learnable.to_raw(initial, param.name)
                attribute = f"{param.name}_raw" if param.learnable.constrained else param.name
                self.register_parameter(attribute, nn.Parameter(tensor))
            else:   # the value itself: a buffer is not optimised, so any value the function takes
                attribute = param.name
                self.register_buffer(attribute, initial)
            self._learned[param.name] = attribute
        # fixed tensors are module state too (state_dict, .to(), .double()); the rest stay as given
        self._fixed_tensors = [name for name, value in params.items() if isinstance(value, torch.Tensor)]
        self._fixed_initial: dict[str, torch.Tensor] = {}   # (plain attributes: .to() leaves them, to_empty too)
        for name in self._fixed_tensors:
            self.register_buffer(name, params.pop(name).detach().clone())
            self._fixed_initial[name] = getattr(self, name).clone()
        self.fixed = params
        self._check_fixed_params()

    def _check_fixed_params(self) -> None:
        """Raise now, naming the argument, for a fixed parameter the function refuses
        (``temperature=-1``), rather than at the first forward: the module runs once on a
        probe of zeros shaped like its parameters (``param_shape`` and the initial tensors) and
        fixed tensors (broadcast, aligned on the right), with rows of two entries where none of
        them sets the row length. (A probe shaped by ``param_shape`` alone refused a valid fixed
        tensor: ``temperature`` of shape (2, 1), one per row, "does not broadcast to the input
        shape (2,)".)"""
        shapes = [self.param_shape] + [tuple(getattr(self, name).shape) for name in self._fixed_tensors]
        for name, value in self.learned_values().items():   # (an initial tensor may outrank param_shape)
            shapes.append(tuple(value.shape)[1:] if self.spec.param(name).size > 1 else tuple(value.shape))
        rank = max([len(s) for s in shapes] + [self.dim + 1 if self.dim >= 0 else -self.dim])
        if rank > _PROBE_MAX_RANK:   # (dim=10**9 built a probe shape of 10^9 entries; forward checks dim)
            return
        shape = [1] * rank
        for s in shapes:
            for axis, size in enumerate(s, start=rank - len(s)):
                if size != 1:   # (sizes that disagree: the forward's own error names the argument)
                    shape[axis] = size
        if shape[self.dim] == 1:
            shape[self.dim] = 2
        with torch.no_grad():
            self.forward(torch.zeros(shape))

    def reset_parameters(self) -> None:
        """Set the learnable parameters back to their initial values (those given at
        construction, else the spec's: a new draw for MultiMax's ``r``, ``t``) and the fixed
        tensor parameters to the tensors given, in place, keeping each tensor's device and dtype.

        As ``nn.Linear.reset_parameters``: a module built on the meta device (or moved there)
        and materialised with ``to_empty(device=...)`` holds uninitialised memory until this runs.
        """
        with torch.no_grad():
            for name, attribute in self._learned.items():
                param = self.spec.param(name)
                learn = param.learnable
                assert learn is not None
                value = self._init_values[name]
                if isinstance(value, torch.Tensor) and has_no_data(value):
                    raise ValueError(f"{name}'s initial value was given on the meta device: it holds no "
                                     "value to reset to")
                with torch.device("cpu"):   # (a default device of meta would give no values)
                    initial = _initial(param, learn, value, self.param_shape)
                    initial = learn.to_raw(initial, name) if attribute != name else initial
                getattr(self, attribute).copy_(initial)
            for name in self._fixed_tensors:
                given = self._fixed_initial[name]
                if has_no_data(given):
                    raise ValueError(f"{name} was given on the meta device: it holds no value to reset to")
                getattr(self, name).copy_(given)

    def __getstate__(self) -> dict:
        # the spec by name (it holds lambdas, which do not pickle): torch.save of a module, or of a
        # model holding one, failed for 10 of the 18 normalizers
        state = self.__dict__.copy()
        state["spec"] = self.spec.name
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["spec"] = registry.get(state["spec"])
        self.__dict__.update(state)

    def call_params(self) -> dict[str, Any]:
        """Every parameter the functional normalizer takes from this module: the fixed ones
        (numbers, and tensors held as buffers) and the learnable ones."""
        return {**self.fixed, **{name: getattr(self, name) for name in self._fixed_tensors},
                **self.learned_values()}

    def learned_values(self) -> dict[str, torch.Tensor]:
        """The learnable parameters in the form the functional normalizer takes."""
        out = {}
        for name, attribute in self._learned.items():
            learn = self.spec.param(name).learnable
            assert learn is not None
            value = getattr(self, attribute)
            out[name] = value if attribute == name else learn.from_raw(value)   # (name_raw: a constrained parameter)
        return out

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None,
                **extra: Any) -> torch.Tensor:
        """Normalise ``x`` along ``dim`` (default: the module's) with the current parameters.

        ``extra`` passes per-call arguments such as ``n`` (ssmax, as_entmax). A parameter whose
        spec says how it adapts to the row length (``Param.for_length``: sparse_softmax's ``k``,
        at most the row length, 8 when unset) is adapted here.
        """
        dim = self.dim if dim is None else dim
        params = {**self.call_params(), **extra}
        if not isinstance(x, torch.Tensor):
            return registry.normalize(x, self.name, dim=dim, mask=mask, **params)   # (its TypeError names x)
        if x.dim():
            dim = check_dim(x, dim)   # (x.shape[dim] raised a bare IndexError)
        params = self.spec.params_for_length(params, x.shape[dim] if x.dim() else 1)
        return registry.normalize(x, self.name, dim=dim, mask=mask, **params)

    def extra_repr(self) -> str:
        parts = [repr(self.name), f"dim={self.dim}"]
        if self.param_shape:
            parts.append(f"param_shape={self.param_shape}")
        if self._learned:
            learned = [name for name, attribute in self._learned.items()
                       if isinstance(getattr(self, attribute), nn.Parameter)]
            parts.append(f"learned={learned}" if learned else "learnable=False")
        parts += [f"{k}={v}" for k, v in self.fixed.items()]
        parts += [f"{name}={_tensor_summary(getattr(self, name))}" for name in self._fixed_tensors]
        return ", ".join(parts)
