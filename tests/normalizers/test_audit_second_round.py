"""Hostile audit of the functional normalizers, 2026-12-02 (second round): each test is a
reproducer that failed before its fix."""

import math

import numpy as np
import pytest
import torch

import softmaxkit as sk


def _softpick64(x, eps):
    a = torch.expm1(x.double())
    return torch.relu(a) / (a.abs().sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("scale", [1e-8, 1e-6, 1e-4, 1e-2, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softpick_of_small_scores_keeps_its_precision(scale, dtype):
    """e^{x-m} - e^{-m} cancelled: 7e-2 of relative error at scores of 1e-6 in float32."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale
    expected = _softpick64(x, 1e-300)
    out = sk.softpick(x.to(dtype), eps=1e-300).double()
    assert float((out - expected).abs().max() / expected.abs().max()) < 20 * torch.finfo(dtype).eps


@pytest.mark.parametrize("method", ["fused", "streaming"])
def test_softpick_attention_of_small_scores_within_the_flash_rule(method):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 17, 16, generator=g, dtype=torch.float64) * 1e-3
    k = torch.randn(1, 2, 17, 16, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 17, 8, generator=g, dtype=torch.float64)
    ref = sk.attention(q, k, v, "softpick", method="dense")
    dense = sk.attention(q.float(), k.float(), v.float(), "softpick", method="dense").double()
    out = sk.attention(q.float(), k.float(), v.float(), "softpick", method=method).double()
    assert (out - ref).abs().max() <= 2 * (dense - ref).abs().max() + 1e-7


def test_softmax_sink_wants_one_sink_per_row():
    x = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="sink must have one value per row"):
        sk.softmax_sink(x, sink=torch.tensor([0.0, 5.0, -5.0], dtype=torch.float64))
    per_row = sk.softmax_sink(torch.stack([x[0], x[0]]), sink=torch.tensor([[0.0], [1.0]], dtype=torch.float64))
    torch.testing.assert_close(per_row[1:], sk.softmax_sink(x, sink=1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normalized_sa_softmax_near_the_top_of_the_range(dtype):
    big = torch.finfo(dtype).max * 0.9
    out = sk.sa_softmax(torch.tensor([big, -big, 0.0], dtype=dtype), normalized=True)
    torch.testing.assert_close(out, torch.tensor([1.0, 0.0, 0.0], dtype=dtype))


@pytest.mark.parametrize("name", ["softpick", "relu_l1", "softplus_l1"])
def test_an_infinite_eps_is_refused(name):
    with pytest.raises(ValueError, match="eps"):
        sk.normalize(torch.randn(2, 3), name, eps=math.inf)
    with pytest.raises(ValueError, match="eps"):
        sk.sa_softmax(torch.randn(2, 3), normalized=True, eps=math.inf)


def test_numpy_integers_are_ints():
    x = torch.randn(3, 6)
    torch.testing.assert_close(sk.sparse_softmax(x, k=np.int64(2)), sk.sparse_softmax(x, k=2))
    assert torch.equal(sk.softmax_topk(x, np.int64(2))[1], sk.softmax_topk(x, 2)[1])


def test_as_entmax_with_a_scale_past_the_float_range_is_its_argmax():
    """gamma = 1000 made the length scale inf: an all-NaN output, and NaN gradients for beta, gamma."""
    x = torch.randn(3, 8)
    gamma = torch.tensor(1000.0, requires_grad=True)
    beta = torch.tensor(1.0, requires_grad=True)
    y = sk.as_entmax(x, gamma=gamma, beta=beta, n=8)
    assert torch.equal(y, torch.nn.functional.one_hot(x.argmax(-1), 8).float())
    (y * torch.randn(3, 8)).sum().backward()
    assert torch.isfinite(gamma.grad) and torch.isfinite(beta.grad)
