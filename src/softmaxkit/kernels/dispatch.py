"""The one place that decides which backend computes an op: reference, numba or Triton.

Public functions (``softmax``, ``log_softmax``, ``logsumexp``, ``sparsemax``,
``entmax15``, ``entmax``, ``softmax_topk``) ask :func:`select` first; it returns a
zero-argument callable computing the op with a kernel, or ``None``, in which case the
caller runs its reference code. Asking for a kernel that does not cover an input is
never an error: the reference is used.

Backends (:func:`use_backend`):

* ``"reference"``: always the plain-PyTorch definition.
* ``"numba"``: the CPU kernels for every input they cover (CPU tensor, float32 or
  float64, C-contiguous, normalised along the last axis, no ``mask``; op-specific
  parameters such as a float temperature, see :func:`select`), whatever its size.
* ``"triton"``: the GPU kernels (softmax forward and backward) for CUDA inputs when
  Triton is importable.
* ``"auto"`` (default): numba for covered CPU inputs of at least
  :data:`AUTO_MIN_NUMEL` elements, Triton on CUDA when importable, the reference
  otherwise.

The choice is a context variable: it is per thread (and per asyncio task), and
``use_backend`` blocks nest, the innermost winning.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

BACKENDS = ("reference", "numba", "triton", "auto")
OPS = ("softmax", "log_softmax", "logsumexp", "sparsemax", "entmax15", "entmax", "softmax_topk",
       "log_softmax_topk")
SOFTMAX_ALGORITHMS = ("three_pass", "two_pass", "online")

#: ``auto`` uses numba from this many elements on. The kernels beat the reference at
#: every size (measured: 73 us against 240 us for 64 elements, 175 us against 1.46 ms for
#: 65536), but the first call in a fresh environment compiles them (seconds, then cached
#: on disk); small calls stay on the reference so that toy use never pays that.
AUTO_MIN_NUMEL = 16384
#: entmax kernels cover alpha >= this (closer to 1 the reference's log1p form is used).
ENTMAX_MIN_ALPHA = 1.05


@dataclass(frozen=True)
class _Choice:
    backend: str = "auto"
    algorithm: str | None = None


_current: contextvars.ContextVar[_Choice] = contextvars.ContextVar("softmaxkit_backend", default=_Choice())


@contextlib.contextmanager
def use_backend(name: str, *, algorithm: str | None = None):
    """Use backend ``name`` for the ops called inside the ``with`` block.

    Args:
        name: ``"reference"``, ``"numba"``, ``"triton"`` or ``"auto"``.
        algorithm: for the numba softmax kernels, ``"three_pass"``, ``"two_pass"`` or
            ``"online"`` (Milakov & Gimelshein 2018, arXiv 1805.02867; Dukhan &
            Ablavatski 2020, arXiv 2001.04438); ``None`` keeps the default (the fastest
            in the kernel benchmark).

    Example::

        with sk.use_backend("reference"):
            p = sk.softmax(x)
    """
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {name!r}")
    if algorithm is not None and algorithm not in SOFTMAX_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(map(repr, SOFTMAX_ALGORITHMS))} or None; "
                         f"got {algorithm!r}")
    token = _current.set(_Choice(name, algorithm))
    try:
        yield name
    finally:
        _current.reset(token)


def current_backend() -> str:
    """The backend name in effect (``"auto"`` outside any :func:`use_backend` block)."""
    return _current.get().backend


def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _plain_last_axis(x, dim) -> bool:
    """A plain strided tensor, normalised along its (contiguous) last axis."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.is_nested or x.dim() == 0:
        return False
    if type(x) not in (torch.Tensor, torch.nn.Parameter):
        return False
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    if wrapped is not None and wrapped(x):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_scripting():
        return False
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (-1, x.dim() - 1):
        return False
    return x.is_contiguous()


def _numba_covers(x, dim, mask, backend: str) -> bool:
    if mask is not None or not _plain_last_axis(x, dim):
        return False
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if backend == "auto" and x.numel() < AUTO_MIN_NUMEL:
        return False
    return numba_available()


def _triton_covers(x, dim, mask) -> bool:
    return (mask is None and _plain_last_axis(x, dim) and x.device.type == "cuda"
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and triton_available())


def _plain_float(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def select(op: str, x, dim=-1, mask=None, **params) -> Callable[[], torch.Tensor] | None:
    """A callable computing ``op`` with a kernel, or ``None`` to run the reference.

    Params by op: ``softmax`` / ``log_softmax``: ``temperature`` (a number is covered, a
    tensor is not); ``logsumexp``: ``keepdim``; ``entmax``: ``alpha`` (a number
    ``>= ENTMAX_MIN_ALPHA`` or a tensor with one value per row, all ``>= ENTMAX_MIN_ALPHA``);
    ``softmax_topk`` / ``log_softmax_topk``: ``k`` (already validated).
    Inputs the caller has not validated are fine: anything unusual returns ``None`` and
    the reference then raises the proper error.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    if torch.compiler.is_compiling():  # traced code runs the reference (dynamo cannot read a ContextVar)
        return None
    choice = _current.get()
    if choice.backend == "reference":
        return None
    if choice.backend in ("numba", "auto") and _numba_covers(x, dim, mask, choice.backend):
        return _numba_call(op, x, choice.algorithm, params)
    if choice.backend in ("triton", "auto") and op == "softmax" and _triton_covers(x, dim, mask):
        temperature = params.get("temperature", 1.0)
        if _plain_float(temperature) and temperature > 0:
            from .gpu import softmax as gpu_softmax
            return lambda: gpu_softmax.softmax(x, temperature=float(temperature))
    return None


def _numba_call(op, x, algorithm, params):
    if op in ("softmax", "log_softmax"):
        temperature = params.get("temperature", 1.0)
        if not (_plain_float(temperature) and temperature > 0):
            return None
        from .cpu import functions
        fn = functions.softmax if op == "softmax" else functions.log_softmax
        return lambda: fn(x, temperature=float(temperature), algorithm=algorithm)
    if op == "logsumexp":
        keepdim = params.get("keepdim", False)
        if not isinstance(keepdim, bool):
            return None
        from .cpu import functions

        def run():
            out = functions.logsumexp(x, algorithm=algorithm)
            return out.unsqueeze(-1) if keepdim else out
        return run
    if op in ("softmax_topk", "log_softmax_topk"):
        if torch.is_grad_enabled() and x.requires_grad:
            return None  # the fused kernel has no backward; the reference keeps the graph
        from .cpu import topk
        return lambda: topk.softmax_topk(x, params["k"], log=op == "log_softmax_topk")
    if op in ("sparsemax", "entmax15", "entmax"):
        alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(op, params.get("alpha", 1.5))
        alpha = _entmax_alpha(x, alpha)
        if alpha is None:
            return None
        from .cpu import sparse_functions
        return lambda: sparse_functions.entmax(x, alpha)
    return None


def _entmax_alpha(x, alpha):
    """A float alpha, or a per-row alpha tensor of shape ``x.shape[:-1]``; ``None`` if not covered."""
    if _plain_float(alpha):
        return float(alpha) if alpha >= ENTMAX_MIN_ALPHA and alpha == alpha and alpha < float("inf") else None
    if not isinstance(alpha, torch.Tensor) or not alpha.is_floating_point() or alpha.device != x.device:
        return None
    if alpha.dim() > x.dim():
        return None
    shape = (1,) * (x.dim() - alpha.dim()) + tuple(alpha.shape)
    if shape[-1] != 1 or any(a not in (1, s) for a, s in zip(shape, x.shape)):
        return None
    with torch.no_grad():
        if not bool((torch.isfinite(alpha) & (alpha >= ENTMAX_MIN_ALPHA)).all()):
            return None
    return alpha.reshape(shape).expand(x.shape[:-1] + (1,)).squeeze(-1)


from .topk import log_softmax_topk, softmax_topk  # noqa: E402  (public names live here too)

__all__ = ["use_backend", "current_backend", "select", "softmax_topk", "log_softmax_topk", "BACKENDS",
           "AUTO_MIN_NUMEL"]
