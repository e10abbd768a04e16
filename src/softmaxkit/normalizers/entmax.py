r"""alpha-entmax: ``[(alpha - 1) x - tau]_+^{1/(alpha - 1)}``, with a learnable alpha.

Peters, Niculae & Martins (2019), "Sparse Sequence-to-Sequence Models", arXiv 1905.05702;
the gradient in alpha from Correia, Niculae & Martins (2019), "Adaptively Sparse
Transformers", arXiv 1909.00015.
"""

from __future__ import annotations

import torch

from .._rows import prepare_rows
from ..forms import Threshold
from ..kernels import dispatch
from ..registry import Example, Learnable, builtin
from ._entmax import check_alpha, entmax_from_rows


def entmax_reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                     alpha: float | torch.Tensor = 1.5) -> torch.Tensor:
    """:func:`entmax` in plain PyTorch (what the kernels are tested against)."""
    check_alpha(alpha)
    rows = prepare_rows(x, dim, mask)
    return entmax_from_rows(rows, rows.x, alpha)


def entmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
           alpha: float | torch.Tensor = 1.5) -> torch.Tensor:
    r"""alpha-entmax.

    .. math:: \alpha\text{-entmax}(x)_i = [(\alpha - 1)\, x_i - \tau]_+^{1/(\alpha-1)},
              \quad \textstyle\sum_i p_i = 1

    alpha = 1 is softmax (computed as softmax), alpha = 1.5 :func:`entmax15` and
    alpha = 2 :func:`sparsemax` (both sort-based); any other alpha, and every tensor
    alpha, is solved by bisection to full precision plus Newton steps. Shift invariant;
    sparse for alpha > 1.

    ``alpha`` is a number ``>= 1`` or a tensor with one value per row: broadcastable to
    ``x`` with size 1 along ``dim`` (e.g. ``(..., 1)``, or ``(H, 1, 1)`` per head). A tensor
    alpha is learnable: its gradient is the closed form of Correia, Niculae & Martins
    (2019), "Adaptively Sparse Transformers", arXiv 1909.00015, computed so that it stays
    exact as alpha -> 1 (entries equal to 1 are softmax rows).

    Peters, Niculae & Martins (2019), "Sparse Sequence-to-Sequence Models", arXiv 1905.05702.
    """
    return dispatch.run("entmax", entmax_reference, x, dim, mask, alpha=alpha)


def _triton_pieces():
    """The identity map for the fused Triton threshold kernel."""
    from ..kernels.gpu.pieces import identity_pieces

    return identity_pieces()


SPEC = builtin(
    entmax, form=Threshold(alpha=lambda params: params["alpha"]),
    triton=_triton_pieces,
    formula="[(alpha-1) x - tau]_+^(1/(alpha-1)) with sum 1",
    reference="Peters, Niculae & Martins 2019, arXiv 1905.05702; Correia et al. 2019, arXiv 1909.00015",
    sums_to_one=True, can_be_sparse=True, shift_invariant=True,
    learnable={"alpha": Learnable(1.5, low=1.0, high=2.0)},
    examples=(
        Example(x=(1.0, 2.0, 3.0), expected=(0.0, 0.0, 1.0), params={"alpha": 2.0}, note="alpha = 2: sparsemax"),
        Example(x=(0.0, 1.0986122886681098), expected=(0.25, 0.75), params={"alpha": 1.0},
                note="alpha = 1: softmax"),
        Example(x=(0.0, 0.0, 0.0, 0.0), expected=(0.25, 0.25, 0.25, 0.25), params={"alpha": 3.0}),
    ),
)
