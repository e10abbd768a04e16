r"""``"cosformer"``: ReLU features with cos-based re-weighting (Qin et al. 2022).

.. math:: s_{ij} = \mathrm{relu}(q_i)^\top \mathrm{relu}(k_j)\,
                   \cos\!\Big(\frac{\pi}{2}\cdot\frac{p_i - p_j}{M}\Big),\qquad
          a_{ij} = s_{ij} / \max\big(\textstyle\sum_{j'} s_{ij'}, \varepsilon\big)

decomposed with ``cos(a - b) = cos a cos b + sin a sin b`` into the ``2D`` features
``phi(x_i) = [relu(x_i) cos(pi p_i / 2M), relu(x_i) sin(pi p_i / 2M)]``, so the causal path
never builds the ``(L, 2D, D)`` cumulative sum of the official code. Positions ``p``: keys
``0 .. Lk-1``; queries ``0 .. Lq-1``, or ``Lk-Lq .. Lk-1`` (end-aligned) when causal. ``M``
is ``max_len`` when given, else ``max(Lq, Lk)`` as in the official code; recurrent decoding
needs a fixed ``max_len`` (the weights of earlier keys must not change as the sequence
grows). Qin, Sun, Deng, Li, Wei, Lv, Yan, Kong, Zhong 2022, "cosFormer: Rethinking Softmax
in Attention", ICLR 2022, arXiv 2202.08791. ``scale`` is not used (it cancels: relu is
positively homogeneous); ``eps`` defaults to 1e-6 as in the official code.
"""

from __future__ import annotations

import math

import torch

from .._checks import can_branch_on
from ._spec import Features, LinearMethod, check_count, check_eps, ratio_combine


def _check(params, head_dim, dtype, device):
    max_len = check_count(params["max_len"], "max_len", allow_none=True)
    return {"eps": check_eps(params["eps"]), "max_len": max_len}


def _features(x, positions, ctx, is_query, visible):
    m = ctx["M"]
    if positions.numel() and can_branch_on(positions) and float(positions.max()) > m - 1 + 1e-9:
        raise ValueError(f"cosformer: position {int(positions.max())} is beyond max_len={m} "
                         f"(pass a larger max_len)")
    angle = (math.pi / 2) * positions.to(x.dtype) / m
    r = torch.relu(x)
    return Features(torch.cat([r * torch.cos(angle)[:, None], r * torch.sin(angle)[:, None]], dim=-1))


METHOD = LinearMethod(
    name="cosformer",
    feature_map="relu(x) (x) [cos, sin](pi p / 2M)",
    formula="relu(q_i).relu(k_j) cos(pi (p_i - p_j) / 2M), row-normalised",
    paper="Qin et al. 2022, arXiv 2202.08791",
    causal=True, decoding=True, params={"max_len": None, "eps": 1e-6},
    check=_check, features=_features, combine=ratio_combine, shift_invariant=True, uses_vsum=False, positional=True,
)
