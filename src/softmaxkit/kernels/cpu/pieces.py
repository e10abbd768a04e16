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
then compute ``p = w / sum w`` without a maximum.

``values(params)`` packs the parameters (defaults filled in) as a flat sequence of numbers
or tensors broadcastable to ``(B, H, 1, 1)``, in the order ``par`` reads them. Parameter
gradients do not go through these pieces: the fused path takes them by autograd on the
torch piece.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from numba import njit

from ._intrinsics import cast_like


def no_params(params: Mapping[str, Any]) -> Sequence[Any]:
    """``values`` for pieces that take no parameter."""
    return ()


@njit(cache=True, inline="always")
def count(n, par):
    """The default ``row``: the pieces receive ``n``."""
    return n


@dataclass(frozen=True)
class NumbaPieces:
    """A normalizer's pieces as numba functions (see the module docstring)."""

    fn: Any
    dfn: Any
    values: Callable[[Mapping[str, Any]], Sequence[Any]] = no_params
    weight: Any = None
    row: Any = count


@njit(cache=True, inline="always")
def _identity(x, n, par):
    return x


@njit(cache=True, inline="always")
def _one(x, n, par):
    return cast_like(1.0, x)


#: ``g(x) = x``, ``dg = 1``: the pieces of softmax of the raw scores (a linear ``g`` folded into
#: the query scale).
IDENTITY = NumbaPieces(fn=_identity, dfn=_one)
