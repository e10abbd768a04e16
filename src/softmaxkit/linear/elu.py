r"""``"linear"``: linear attention with the elu + 1 feature map (Katharopoulos et al. 2020).

.. math:: \phi(x) = \mathrm{elu}(x) + 1,\qquad
          \mathrm{out}_i = \frac{\phi(q_i)^\top \sum_{j} \phi(k_j) v_j^\top}
                                {\phi(q_i)^\top \sum_{j} \phi(k_j)}

over the visible keys ``j`` (``j <= i`` when causal). Katharopoulos, Vyas, Pappas,
Fleuret 2020, "Transformers are RNNs: Fast Autoregressive Transformers with Linear
Attention", arXiv 2006.16236. ``scale`` is not used (the paper's feature map takes ``q``
as is); the denominator is clamped at ``eps`` (default 1e-6).
"""

from __future__ import annotations

from ._spec import Features, LinearMethod, check_eps, elu_plus_one, ratio_combine


def _check(params, head_dim, dtype, device):
    return {"eps": check_eps(params["eps"])}


def _features(x, positions, ctx, is_query, visible):
    return Features(elu_plus_one(x))


METHOD = LinearMethod(
    name="linear",
    feature_map="elu(x) + 1",
    formula="phi(q_i).phi(k_j) / sum_j' phi(q_i).phi(k_j')",
    paper="Katharopoulos et al. 2020, arXiv 2006.16236",
    causal=True, decoding=True, params={"eps": 1e-6},
    check=_check, features=_features, combine=ratio_combine, shift_invariant=True, uses_vsum=False,
)
