r"""What a normalizer declares so that the Triton attention templates can inline its pieces.

The forms of :mod:`softmaxkit.forms` hold *torch* pieces; Triton cannot call them. A
normalizer that wants the fused GPU kernels declares, in its own module, a factory
returning :class:`TritonPieces` (``NormalizerSpec.triton``): the same pieces written as
``@triton.jit`` functions, plus the derivative of each piece in each of its parameters
(for the per-head parameter gradients). The factory imports triton lazily, so that
``import softmaxkit`` never needs it.

Signatures (``x`` a float32 tile of scores, ``n`` the visible-key count of each row
broadcast to the tile, ``par`` a pointer to this head's packed float32 parameters):

* ``fn(x, n, par)`` and ``dfn(x, n, par)``: ``g``/``h`` and its derivative in ``x``;
  the signed ``sum_normalized`` variant takes the row shift as well,
  ``fn(x, c, n, par)``, ``dfn(x, c, n, par)``, and must satisfy
  ``fn(x, c, ...) = e^{-c} fn(x, 0, ...)`` (softpick's ``e^{x-c} - e^{-c}``);
* ``dpar(x, n, par, K)`` (``K`` a ``tl.constexpr``): the derivative in the ``K``-th packed
  parameter (``None`` when the pieces take no parameter).

``values(params)`` packs the normalizer's parameters (defaults filled in) as a flat list
of numbers or tensors broadcastable to ``(B, H, 1, 1)``, in the order ``par`` reads them;
they are packed differentiably, so a learnable per-head tensor receives its gradient.
``uses_n`` says whether the pieces read ``n``. For the threshold family ``alpha(params)``
is the number alpha.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TritonPieces:
    """A normalizer's pieces as Triton functions (see the module docstring)."""

    fn: Any
    dfn: Any
    dpar: Any = None
    values: Callable[[Mapping[str, Any]], Sequence[Any]] = lambda params: ()
    uses_n: bool = False


def no_params(params: Mapping[str, Any]) -> Sequence[Any]:
    """``values`` for pieces that take no parameter."""
    return ()


#: ``triton.language``, bound by the factory below: a global, as Triton's interpreter requires.
tl: Any = None


def identity_pieces() -> TritonPieces:
    """``g(x) = x``, ``dg = 1``: the pieces of a threshold normalizer of the raw scores."""
    import triton
    global tl
    import triton.language as tl

    @triton.jit
    def g(x, n, par):
        return x

    @triton.jit
    def dg(x, n, par):
        return tl.full(x.shape, 1.0, tl.float32)

    return TritonPieces(fn=g, dfn=dg)
