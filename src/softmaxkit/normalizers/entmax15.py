r"""1.5-entmax, exact by sorting: ``[x/2 - tau]_+^2``.

Peters, Niculae & Martins (2019), "Sparse Sequence-to-Sequence Models", arXiv 1905.05702.
"""

from __future__ import annotations

import torch

from .._rows import prepare_rows
from ..forms import Threshold
from ..kernels import dispatch
from ..registry import Example, builtin
from ._entmax import entmax_from_rows


def entmax15_reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`entmax15` in plain PyTorch (what the kernels are tested against)."""
    rows = prepare_rows(x, dim, mask)
    return entmax_from_rows(rows, rows.x, 1.5)


def entmax15(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""1.5-entmax, exact (sort-based).

    .. math:: \mathrm{entmax}_{1.5}(x)_i = [x_i/2 - \tau]_+^2, \quad \textstyle\sum_i p_i = 1

    Shift invariant; can be sparse; the Jacobian is ``diag(g) - g g^T / sum(g)`` with
    ``g = sqrt(p)``. Peters, Niculae & Martins (2019), "Sparse Sequence-to-Sequence
    Models", arXiv 1905.05702.
    """
    return dispatch.run("entmax15", entmax15_reference, x, dim, mask)


def _triton_pieces():
    """The identity map for the fused Triton threshold kernel."""
    from ..kernels.gpu.pieces import identity_pieces

    return identity_pieces()


SPEC = builtin(
    entmax15, form=Threshold(alpha=lambda params: 1.5), formula="[(x/2 - tau)]_+^2 with sum 1",
    triton=_triton_pieces,
    reference="Peters, Niculae & Martins 2019, arXiv 1905.05702",
    sums_to_one=True, can_be_sparse=True, shift_invariant=True,
    examples=(
        Example(x=(0.0, 0.0), expected=(0.5, 0.5)),
        Example(x=(3.0, 0.0, -1.0), expected=(1.0, 0.0, 0.0), note="a gap of 2 or more leaves one entry"),
    ),
)
