"""A query row that sees no key outputs the constant 0: no incoming gradient there may reach
q, k or v, even an infinite or NaN one, on any method.

Found by a hostile sweep (2026-12-04): on SDPA (softmax), the fused path (the threshold
normalizers, stablemax, relu) and the streaming path (softpick) an infinite or NaN gradient
arriving at such a row made every key's gradient NaN (``0 * inf`` in their backwards), where
the dense reference passes nothing.
"""

import math

import pytest
import torch

import softmaxkit as sk

CASES = [("softmax", "auto"), ("softmax", "sdpa"), ("softmax", "fused"), ("softmax", "streaming"),
         ("sparsemax", "fused"), ("entmax15", "streaming"), ("relu", "fused"), ("stablemax", "fused"),
         ("softpick", "streaming"), ("softpick", "fused")]


def _grads(normalizer, method, q, k, v, upstream, **kwargs):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = sk.attention(*leaves, normalizer, method=method, **kwargs)
    return torch.autograd.grad(out, leaves, upstream)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
@pytest.mark.parametrize("hidden_by", ["mask", "causal"])
@pytest.mark.parametrize("normalizer, method", CASES)
def test_non_finite_gradient_at_a_row_that_sees_no_key(normalizer, method, hidden_by, bad):
    gen = torch.Generator().manual_seed(0)
    if hidden_by == "mask":   # query 1 sees no key
        q, k, v = torch.randn(1, 2, 4, 4, generator=gen), torch.randn(1, 2, 5, 4, generator=gen), \
            torch.randn(1, 2, 5, 3, generator=gen)
        mask = torch.ones(4, 5, dtype=torch.bool)
        mask[1] = False
        kwargs = {"attn_mask": mask}
        row = 1
    else:   # Lq > Lk: the first two queries see no key
        if method == "sdpa":
            pytest.skip("method='sdpa' does not take a causal mask with Lq > Lk")
        q, k, v = torch.randn(1, 2, 6, 4, generator=gen), torch.randn(1, 2, 4, 4, generator=gen), \
            torch.randn(1, 2, 4, 3, generator=gen)
        kwargs = {"is_causal": True}
        row = 0
    upstream = torch.randn(1, 2, q.shape[2], 3, generator=gen)
    upstream[0, 0, row, 0] = bad
    got = _grads(normalizer, method, q, k, v, upstream, **kwargs)
    clean = upstream.clone()
    clean[0, 0, row, 0] = 0.0
    want = _grads(normalizer, "dense", q, k, v, clean, **kwargs)
    for name, g, w in zip("qkv", got, want):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, w, msg=lambda m, name=name: f"d{name}: {m}")
