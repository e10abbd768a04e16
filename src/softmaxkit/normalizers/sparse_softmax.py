r"""Sparse-softmax: softmax over the ``k`` largest entries, 0 elsewhere.

Sun, Zhang, Li & Guo (2021), "Sparse-softmax: a simpler and faster alternative softmax
transformation", arXiv 2112.12433. Dense only: the top-k needs whole rows, not O(1) state
per query, so it has no streaming form.
"""

from __future__ import annotations

import torch

from .._checks import check_int_in_range
from .._rows import prepare_rows
from ..registry import Example, builtin
from ._generic import finish
from .softmax import softmax_rows

#: ``k`` where no caller can pass one (a Hugging Face layer without a softmaxkit Normalizer).
FALLBACK_K = 8


def sparse_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                   k: int | None = None) -> torch.Tensor:
    r"""Sparse-softmax: softmax over the ``k`` largest visible entries, 0 elsewhere.

    .. math::

        p_i = \frac{e^{x_i}}{\sum_{j \in \mathrm{top}_k(x)} e^{x_j}}\ (i \in \mathrm{top}_k(x)),\ 0 \text{ otherwise}

    A row with fewer than ``k`` visible entries keeps them all. Ties at the ``k``-th value
    keep the entries of lowest index (``torch.topk`` leaves that order unspecified: a row
    would otherwise keep different keys on different paths, such as attention tiles of
    different widths). Sun, Zhang, Li & Guo (2021), "Sparse-softmax:
    a simpler and faster alternative softmax transformation", arXiv 2112.12433.

    Args:
        k: the number of entries kept, ``1 <= k <= x.shape[dim]`` (required; any ``k >= 1`` on
            an empty axis, which gives an empty result). Attention
            layers that cannot pass it (Hugging Face models without a softmaxkit
            Normalizer) keep :data:`FALLBACK_K`, or every key of a shorter row.
    """
    if k is None:
        raise ValueError("sparse_softmax needs k, the number of entries kept (1 <= k <= row length)")
    rows = prepare_rows(x, dim, mask)
    length = rows.x.shape[-1]
    k = check_int_in_range(k, "k", 1, length or None)   # (an empty axis: an empty result for any k >= 1)
    if length == 0:
        return rows.restore(rows.x.clone())
    filled = rows.x.detach().masked_fill(~rows.visible, float("-inf"))
    kth = filled.topk(k, dim=-1).values[..., -1:]
    above = (filled > kth) | filled.isnan()   # a NaN ranks first, as in torch.topk, and stays in its row
    tied = (filled == kth) & rows.visible
    keep = (above | (tied & (tied.cumsum(-1) <= k - above.sum(-1, keepdim=True)))) & rows.visible
    z = torch.where(keep, rows.x, rows.safe_x)
    return finish(rows, softmax_rows(z, keep))


def _k_for_length(k: int | None, length: int) -> int:
    """``k`` (:data:`FALLBACK_K` when unset) for rows of ``length`` entries: at most the row
    length, as the layers that adapt it need; an int >= 1 (a float or a string is refused, not
    truncated)."""
    k = FALLBACK_K if k is None else check_int_in_range(k, "k", 1)
    return min(k, max(length, 1))


SPEC = builtin(
    sparse_softmax, form=None, formula="softmax over the k largest entries, 0 elsewhere",
    reference="Sun et al. 2021, Sparse-softmax, arXiv 2112.12433",
    sums_to_one=True, can_be_sparse=True, shift_invariant=True,
    for_length={"k": _k_for_length},
    examples=(
        Example(x=(0.0, 1.0986122886681098, -5.0), expected=(0.25, 0.75, 0.0), params={"k": 2}),
        Example(x=(1.0, 2.0, 3.0), expected=(0.0, 0.0, 1.0), params={"k": 1}),
    ),
)
