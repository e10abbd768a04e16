"""The properties InLine and MALA are built on, checked on their exact weights."""

import torch

from ._quadratic import weights


def _qk(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 1, 6, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 20, 8, generator=g,
                                                                                 dtype=torch.float64)


def test_weights_sum_to_one():
    q, k = _qk()
    for method in ("linear", "inline", "mala"):
        torch.testing.assert_close(weights(method, q, k).sum(-1), torch.ones(1, 1, 6, dtype=torch.float64),
                                   rtol=0, atol=1e-5)


def test_ratio_linear_attention_is_not_injective_inline_is():
    q, k = _qk(1)
    q = q.abs()   # relu features of q and 3q are proportional
    lin = weights("cosformer", q, k)
    assert torch.allclose(weights("cosformer", 3 * q, k), lin)          # q and 3q: the same weights
    inl = weights("inline", q, k)
    assert not torch.allclose(weights("inline", 3 * q, k), inl)         # InLine tells them apart


def test_mala_sharpens_with_the_query_magnitude():
    q, k = _qk(2)
    spread = [float(weights("mala", c * q, k).std(-1).mean()) for c in (0.5, 1.0, 2.0, 4.0)]
    assert spread == sorted(spread) and spread[-1] > 2 * spread[0]
