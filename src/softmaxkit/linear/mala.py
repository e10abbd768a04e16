r"""``"mala"``: magnitude-aware linear attention, MALA (Fan et al. 2025).

The official code (qhfan/MALA, ``classfication_release/model.py``,
``AddLinearAttention.forward``) computes, with ``phi = elu + 1``, ``scale = D^-1/2`` and
``N`` keys::

    z = phi(q) @ mean(phi(k))^T * scale
    kv = (phi(k)^T * (scale/N)^0.5) @ (v * (scale/N)^0.5)
    out = phi(q) @ kv * (1 + 1/(z + 1e-6)) - z * mean(v)

(the official layer also rotates ``phi(q)``, ``phi(k)`` by a 2-D RoPE after ``z`` and adds
a depthwise-convolution term of ``v``; both belong to the model and are left out). The
attention weights are therefore

.. math:: z_i = \frac{\mathrm{scale}}{n_i}\sum_{s}\phi(q_i)^\top\phi(k_s),\qquad
          a_{ij} = \Big(1 + \frac{1}{z_i + \varepsilon}\Big)\frac{\mathrm{scale}}{n_i}
                   \phi(q_i)^\top\phi(k_j) - \frac{z_i}{n_i},

which sum to one (up to ``eps``, default 1e-6 as in the official code). Writing
``r_ij = phi(q_i).phi(k_j) / mean_s phi(q_i).phi(k_s)``, ``a_ij = (1 + z_i (r_ij - 1)) / n_i``
(``eps = 0``): the spread of the weights grows with ``z_i``, i.e. with the query's
magnitude, as softmax's does, where ratio-normalised linear attention ignores it. ``n_i``
counts the keys visible to query ``i`` (our causal extension). Fan, Huang, Ai, He 2025,
"Rectifying Magnitude Neglect in Linear Attention", ICCV 2025, arXiv 2507.00698.
"""

from __future__ import annotations

import torch

from ._spec import Features, LinearMethod, check_eps, elu_plus_one, zero_where_empty


def _check(params, head_dim, dtype, device):
    return {"eps": check_eps(params["eps"])}


def _features(x, positions, ctx, is_query, visible):
    return Features(elu_plus_one(x))


def _combine(num, den, vsum, n, ctx):
    scale = ctx["scale"]
    safe = torch.where(n > 0, n, torch.ones_like(n))
    z = scale * den / safe
    out = (1.0 + 1.0 / (z + ctx["eps"])) * (scale / safe) * num - (z / safe) * vsum
    return zero_where_empty(out, n)


METHOD = LinearMethod(
    name="mala",
    feature_map="elu(x) + 1",
    formula="(1 + 1/z_i) scale/n phi(q_i).phi(k_j) - z_i/n, z_i = scale mean_s phi(q_i).phi(k_s)",
    paper="Fan et al. 2025, arXiv 2507.00698",
    causal=True, decoding=True, params={"eps": 1e-6},
    check=_check, features=_features, combine=_combine,
)
