r"""``"inline"``: injective linear attention, InLine (Han et al. 2024).

The official code (LeapLabTHU/InLine, ``models/inline_deit.py`` and ``inline_swin.py``,
``InLineAttention.forward``) computes, with ``phi`` = ``kernel`` (``identity`` by default;
``relu``, ``leakyrelu`` or ``exp`` (``exp(0.2 x)``) in the Swin variant), ``scale = D^-1/2``
and ``N`` keys::

    kv = (phi(k)^T * (scale/N)^0.5) @ (v * (scale/N)^0.5)
    out = phi(q) @ kv + (1 - phi(q) @ mean(phi(k))^T * scale) * mean(v)

that is, the attention weights (paper eq. 5, with its ``scale / N`` folded into ``phi``)

.. math:: a_{ij} = \frac{1}{n_i} + \frac{\mathrm{scale}}{n_i}\Big(\phi(q_i)^\top\phi(k_j)
          - \frac{1}{n_i}\sum_{s}\phi(q_i)^\top\phi(k_s)\Big),

which sum to one by subtraction instead of division, so ``q`` and ``c q`` get different
weights (the map is injective) where ratio-normalised linear attention gives them the same.
Here ``n_i`` counts the keys visible to query ``i`` (``N`` in the official, non-causal code;
``i + 1`` when causal, our extension). The official layer adds a local depthwise-convolution
residual of ``v`` with predicted weights; that is part of the model, not of the attention
weights, and is left out. Han, Pu, Xia, Han, Pan, Li, Lu, Song, Huang 2024, "Bridging the
Divide: Reconsidering Softmax and Linear Attention", NeurIPS 2024, arXiv 2412.06590.
"""

from __future__ import annotations

import torch
import torch.nn.functional as torch_f

from ._spec import Features, LinearMethod, zero_where_empty

KERNELS = ("identity", "relu", "leakyrelu", "exp")


def _check(params, head_dim, dtype, device):
    kernel = params["kernel"]
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    return {"kernel": kernel}


def _phi(x, kernel):
    if kernel == "relu":
        return torch.relu(x)
    if kernel == "leakyrelu":
        return torch_f.leaky_relu(x)
    if kernel == "exp":
        return torch.exp(0.2 * x)
    return x


def _features(x, positions, ctx, is_query, visible):
    return Features(_phi(x, ctx["kernel"]))


def _combine(num, den, vsum, n, ctx):
    scale = ctx["scale"]
    safe = torch.where(n > 0, n, torch.ones_like(n))
    out = vsum / safe + (scale / safe) * (num - (den / safe) * vsum)
    return zero_where_empty(out, n)


METHOD = LinearMethod(
    name="inline",
    feature_map="identity (kernel=relu|leakyrelu|exp)",
    formula="1/n + scale/n (phi(q_i).phi(k_j) - mean_s phi(q_i).phi(k_s))",
    paper="Han et al. 2024, arXiv 2412.06590",
    causal=True, decoding=True, params={"kernel": "identity"},
    check=_check, features=_features, combine=_combine,
)
