"""``torch.nn`` modules: :class:`Normalizer` owns a normalizer's learnable parameters.

The learnable parameters and their initialisations come from the registry
(``NormalizerSpec.learnable``), as the papers initialise them:

============  ==========================  =====================================================
normalizer    parameter                   initialisation
============  ==========================  =====================================================
ssmax         ``s``                       0.43 (Nakanishi 2025)
multimax      ``r``, ``t`` (4 each)        truncated normal, std 0.02 (official MultiMax code)
entmax        ``alpha`` in (1, 2)         1.5, stored as ``alpha = 1 + sigmoid(raw)`` (Correia et al. 2019)
as_entmax     ``alpha``, ``beta``         as registered
sigmoid       ``bias_offset``             0, i.e. the paper's bias ``-log n`` (Ramapuram et al. 2024)
============  ==========================  =====================================================
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import registry

__all__ = ["Normalizer", "Attention"]

_ALPHA_LOW, _ALPHA_HIGH = 1.0, 2.0


def _alpha_to_raw(alpha: float) -> float:
    """Inverse of ``alpha = 1 + sigmoid(raw)``: keeps a learned alpha inside (1, 2)."""
    if not _ALPHA_LOW < alpha < _ALPHA_HIGH:
        raise ValueError(f"a learnable alpha must be strictly between 1 and 2, got {alpha}")
    u = alpha - _ALPHA_LOW
    return math.log(u / (1.0 - u))


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

    def __init__(self, name: str, dim: int = -1, param_shape=(), learnable: bool = True, **params):
        super().__init__()
        self.spec = registry.get(name)
        unknown = sorted(set(params) - set(self.spec.params))
        if unknown:
            raise TypeError(f"normalizer {name!r} got unexpected parameter(s) {unknown}; "
                            f"accepted: {', '.join(self.spec.params) or 'none'}")
        self.name = name
        self.dim = dim
        self.param_shape = tuple(param_shape)
        self._learned: list[str] = []
        for pname, init in self.spec.learnable.items():
            value = params.pop(pname, init)
            self._add(pname, value, learnable)
        self.fixed = params

    def _add(self, pname: str, value, learnable: bool) -> None:
        if pname in ("r", "t"):
            tensor = self._multimax_init(value)
        elif pname == "alpha":
            tensor = torch.full(self.param_shape, _alpha_to_raw(float(value)))
            pname = "alpha_raw"
        else:
            tensor = torch.full(self.param_shape, float(value))
        if learnable:
            self.register_parameter(pname, nn.Parameter(tensor))
        else:
            self.register_buffer(pname, tensor)
        self._learned.append(pname)

    def _multimax_init(self, value) -> torch.Tensor:
        shape = (4,) + self.param_shape
        if isinstance(value, torch.Tensor):
            return value.detach().clone().to(torch.get_default_dtype()).expand(shape).clone()
        values = [float(v) for v in value]
        if any(values):
            return torch.tensor(values).reshape((4,) + (1,) * len(self.param_shape)).expand(shape).clone()
        tensor = torch.empty(shape)
        nn.init.trunc_normal_(tensor, std=0.02)
        return tensor

    def learned_values(self) -> dict:
        """The learnable parameters in the form the functional normalizer takes."""
        out = {}
        for pname in self._learned:
            value = getattr(self, pname)
            if pname == "alpha_raw":
                out["alpha"] = _ALPHA_LOW + torch.sigmoid(value) * (_ALPHA_HIGH - _ALPHA_LOW)
            else:
                out[pname] = value
        return out

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None,
                **extra) -> torch.Tensor:
        """Normalise ``x`` along ``dim`` (default: the module's) with the current parameters.

        ``extra`` passes per-call arguments such as ``n`` (ssmax, as_entmax).
        """
        params = {**self.fixed, **self.learned_values(), **extra}
        return registry.normalize(x, self.name, dim=self.dim if dim is None else dim, mask=mask, **params)

    def extra_repr(self) -> str:
        fixed = ", ".join(f"{k}={v}" for k, v in self.fixed.items())
        shape = f", param_shape={self.param_shape}" if self.param_shape else ""
        return f"{self.name!r}, dim={self.dim}{shape}" + (f", {fixed}" if fixed else "")


from .attention.modules import Attention  # noqa: E402
from .linear.modules import LinearAttention  # noqa: E402, F401
