r"""What a normalizer declares so that the numba attention row kernels can inline its pieces.

The forms of :mod:`softmaxkit.forms` hold *torch* pieces, which numba cannot call. A
normalizer that wants the fused CPU row kernels (:mod:`.attention`) declares, in its own
module, a factory returning :class:`NumbaPieces` (``NormalizerSpec.numba``): the same
pieces as ``@njit`` functions of one score. The GPU counterpart is
:class:`softmaxkit.kernels.gpu.pieces.TritonPieces`.

Signatures (``x`` one score, float32 or float64; ``par`` the head's packed parameters, a
1-d array of the same type): ``fn(x, a, par)`` and ``dfn(x, a, par)``, ``g``/``h`` and its
derivative in ``x``, where ``a = row(n, par)`` is computed once per row from ``n``, the
visible-key count of the row (or the parameter ``n``), so that what depends only on the row
(``log n``, a bias) is not recomputed per score; the default ``row`` passes ``n``. Write
constants with :func:`~softmaxkit.kernels.cpu._intrinsics.cast_like` so that float32 stays
float32. ``weight(x, a, par)`` (``softmax_of`` only, optional) is
``e^{g(x)}`` where it is cheaper than ``g`` and cannot overflow for finite scores; the kernels
then compute ``p = w / sum w`` without a maximum. It may underflow (StableMax's ``1 / (1 - x)`` is
``1 / finfo.max``, subnormal, at a ``finfo.min`` mask fill): the fused path redoes the rows whose
``sum w`` falls below :func:`softmaxkit.attention.fused.weight_floor` through ``fn`` and the row's
maximum (the ``softmax_of`` kernels), forward and backward, so ``fn``/``dfn`` must be exact there too.

Optional extras, for normalizers that are not exactly one of the four forms and stream through
their own rule (``NormalizerSpec.stream``) but whose rows the kernels can still compute exactly:

* ``sink(a, par)`` (``softmax_of``): one more logit per row, in the space of ``g``, that joins the
  maximum and the denominator and carries no value, ``p_i = e^{g_i} / (e^{sink} + sum_j e^{g_j})``
  (softmax with a sink, Miller 2023; gpt-oss, arXiv 2508.10925); default :func:`no_sink` (none).
  The gradient at the scores keeps the softmax form ``dg p (dp - dd)``. ``sink_logit(params)``:
  the same logit in torch (a number or a per-head tensor) when it carries parameters; their
  gradient is taken from it, ``-p_sink dd`` per row (not through ``g``, where it would be a sum
  over the row that cancels down to the small sink weight).
* ``factor(x, a, par)``, ``dfactor`` (``softmax_of``): a factor of the numerator,
  ``p = w(x) softmax(g(x))`` (SA-Softmax's ``x softmax(x)``, arXiv 2502.18277), with gradient
  ``dS = q (dg (w dp - dd) + dw dp)``, ``q = softmax(g)``. No parameter gradients through it.
* the signed ``sum_normalized`` variant (a form with ``signed=True``, softpick, arXiv
  2504.20966): ``fn(x, c, a, par)``, ``dfn(x, c, a, par)`` take the row shift ``c = max(m, 0)``
  (``m`` the row maximum) and satisfy ``fn(x, c) = e^{-c} fn(x, 0)``; the kernels compute
  ``relu(fn) / (sum |fn| + eps e^{m - c})``, the stable form of
  ``relu(h) / (sum |h| + eps e^m)``, as the Triton template does. No parameter gradients.

``form``: the :mod:`softmaxkit.forms` form (torch pieces) the kernels compute when it is not the
normalizer's own (``None``: ``NormalizerSpec.form``); the fused path reads its family and takes
parameter gradients by autograd on its torch piece ``g``/``h``. ``accepts(params)``: whether the
pieces compute the normalizer with these parameters (e.g. not SA-Softmax's ``normalized``
variant); when not, the fused path keeps its reference rows.

``values(params)`` packs the parameters (defaults filled in) as a flat sequence of numbers
or tensors broadcastable to ``(B, H, 1, 1)``, in the order ``par`` reads them. Parameter
gradients do not go through these pieces: the fused path takes them by autograd on the
torch piece.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from ._intrinsics import cast_like


def no_params(params: Mapping[str, Any]) -> Sequence[Any]:
    """``values`` for pieces that take no parameter."""
    return ()


@njit(cache=True, inline="always")
def count(n, par):
    """The default ``row``: the pieces receive ``n``."""
    return n


def always(params: Mapping[str, Any]) -> bool:
    """``accepts`` for pieces that compute the normalizer with any parameters."""
    return True


@njit(cache=True, inline="always")
def no_sink(a, par):
    """The default ``sink``: no extra logit (``-inf``)."""
    return cast_like(-np.inf, a)


@dataclass(frozen=True)
class NumbaPieces:
    """A normalizer's pieces as numba functions (see the module docstring)."""

    fn: Any
    dfn: Any
    values: Callable[[Mapping[str, Any]], Sequence[Any]] = no_params
    weight: Any = None
    row: Any = count
    sink: Any = no_sink
    sink_logit: Callable[[Mapping[str, Any]], Any] | None = None
    factor: Any = None
    dfactor: Any = None
    form: Any = None
    accepts: Callable[[Mapping[str, Any]], bool] = always


@njit(cache=True, inline="always")
def identity_piece(x, n, par):
    """``g(x) = x`` as a numba piece (shared by every normalizer whose map is the identity)."""
    return x


@njit(cache=True, inline="always")
def one_piece(x, n, par):
    """``dg(x) = 1``, the derivative of :func:`identity_piece`."""
    return cast_like(1.0, x)


#: ``g(x) = x``, ``dg = 1``: the pieces of softmax of the raw scores (a linear ``g`` folded into
#: the query scale).
IDENTITY = NumbaPieces(fn=identity_piece, dfn=one_piece)
