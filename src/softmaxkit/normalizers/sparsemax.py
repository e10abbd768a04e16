r"""Sparsemax: the Euclidean projection onto the probability simplex (alpha-entmax at alpha = 2).

Martins & Astudillo (2016), "From Softmax to Sparsemax: A Sparse Model of Attention and
Multi-Label Classification", arXiv 1602.02068.
"""

from __future__ import annotations

import torch

from .._rows import prepare_rows
from ..forms import Threshold
from ..kernels import dispatch
from ..registry import Example, builtin
from ._entmax import entmax_from_rows


def sparsemax_reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`sparsemax` in plain PyTorch (what the kernels are tested against)."""
    rows = prepare_rows(x, dim, mask)
    return entmax_from_rows(rows, rows.x, 2.0)


def sparsemax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Sparsemax: the Euclidean projection of ``x`` onto the probability simplex.

    .. math:: \mathrm{sparsemax}(x) = \arg\min_{p \in \Delta} \|p - x\|^2 = [x - \tau]_+,
              \quad \textstyle\sum_i [x_i - \tau]_+ = 1

    Exact (sort-based). Shift invariant; can be sparse. The Jacobian is
    ``diag(s) - s s^T / |S|`` with ``s`` the support indicator. alpha-entmax at alpha = 2.

    Martins & Astudillo (2016), "From Softmax to Sparsemax: A Sparse Model of Attention
    and Multi-Label Classification", arXiv 1602.02068.
    """
    return dispatch.run("sparsemax", sparsemax_reference, x, dim, mask)


def _triton_pieces():
    """The identity map for the fused Triton threshold kernel."""
    from ..kernels.gpu.pieces import identity_pieces

    return identity_pieces()


SPEC = builtin(
    sparsemax, form=Threshold(alpha=lambda params: 2.0), formula="[x - tau]_+ with sum 1",
    triton=_triton_pieces,
    reference="Martins & Astudillo 2016, arXiv 1602.02068",
    sums_to_one=True, can_be_sparse=True, shift_invariant=True,
    examples=(
        Example(x=(1.0, 2.0, 3.0), expected=(0.0, 0.0, 1.0)),
        Example(x=(1.0, 0.5, 0.0), expected=(0.75, 0.25, 0.0)),
        Example(x=(-1e9, 0.0, 0.1), expected=(0.0, 0.45, 0.55), note="a -1e9 fill acts as masked"),
    ),
)
