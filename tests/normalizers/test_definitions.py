"""Each normalizer equals its formula in DESIGN.md, written here independently and naively."""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit import registry


def naive_softmax(x, T=1.0):
    e = torch.exp(x / T - (x / T).max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def entropy(p):
    return -(p * torch.log(p)).sum(-1, keepdim=True)


@pytest.fixture
def x():
    return torch.randn(6, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2


def test_softmax_temperature(x):
    torch.testing.assert_close(sk.softmax(x, temperature=0.7), naive_softmax(x, 0.7))
    torch.testing.assert_close(sk.log_softmax(x, temperature=2.0), torch.log(naive_softmax(x, 2.0)))
    torch.testing.assert_close(sk.logsumexp(x), torch.log(torch.exp(x).sum(-1)))


def test_adaptive_softmax_follows_the_polynomial(x):
    p = naive_softmax(x)
    h = entropy(p)
    c = [-0.037, 0.481, -2.3, 4.917, -1.791]
    poly = sum(ci * h ** (4 - i) for i, ci in enumerate(c))
    beta = torch.where(h > 0.5, torch.clamp(poly, min=1.0), torch.ones_like(h))
    assert (h > 0.5).any()
    torch.testing.assert_close(sk.adaptive_softmax(x), naive_softmax(beta * x))


def test_adaptive_softmax_is_softmax_when_entropy_is_low():
    x = torch.tensor([[10.0, 0.0, 0.0], [0.0, 8.0, -1.0]], dtype=torch.float64)
    assert (entropy(naive_softmax(x)) <= 0.5).all()
    torch.testing.assert_close(sk.adaptive_softmax(x), naive_softmax(x))


def test_ssmax(x):
    n = x.shape[-1]
    torch.testing.assert_close(sk.ssmax(x, s=0.43), naive_softmax(0.43 * math.log(n) * x))
    torch.testing.assert_close(sk.ssmax(x, s=0.5, n=100), naive_softmax(0.5 * math.log(100) * x))


def test_ssmax_counts_visible_entries_only(x):
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[:, 4:] = False
    out = sk.ssmax(x, mask=mask, s=0.6)
    torch.testing.assert_close(out[:, :4], naive_softmax(0.6 * math.log(4) * x[:, :4]))
    assert (out[:, 4:] == 0).all()


def test_sa_softmax(x):
    torch.testing.assert_close(sk.sa_softmax(x), x * naive_softmax(x))
    lo = torch.clamp(x.min(-1, keepdim=True).values, max=0)
    hi = torch.clamp(x.max(-1, keepdim=True).values, min=0)
    expected = (x - lo) / (hi - lo + 1e-6) * naive_softmax(x)
    torch.testing.assert_close(sk.sa_softmax(x, normalized=True), expected)


def test_multimax(x):
    r = [-1.0, 1.0, -0.5, 0.5]
    t = [0.3, 0.7, 0.2, 0.1]
    relu = torch.relu
    sigma = x + t[0] * relu(r[0] - x) + t[1] * relu(x - r[1]) + t[2] * relu(r[2] - x) ** 2 + t[3] * relu(x - r[3]) ** 2
    torch.testing.assert_close(sk.multimax(x, r=r, t=t), naive_softmax(sigma))
    torch.testing.assert_close(sk.multimax(x), naive_softmax(x))


def test_sparse_softmax(x):
    out = sk.sparse_softmax(x, k=3)
    top = x.topk(3, -1)
    expected = torch.zeros_like(x).scatter(-1, top.indices, naive_softmax(top.values))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(sk.sparse_softmax(x, k=x.shape[-1]), naive_softmax(x))


def test_softpick(x):
    m = x.max(-1, keepdim=True).values
    e = torch.exp(x - m) - torch.exp(-m)
    torch.testing.assert_close(sk.softpick(x), torch.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-6))
    plain = torch.exp(x) - 1
    torch.testing.assert_close(sk.softpick(x), torch.relu(plain) / plain.abs().sum(-1, keepdim=True),
                               rtol=2e-6, atol=0)
    assert (sk.softpick(x)[x <= 0] == 0).all()


def test_softpick_stable_form_on_extreme_rows():
    x = torch.tensor([[800.0, 799.0, -3.0]], dtype=torch.float64)
    e = torch.exp(x - 800.0) - math.exp(-800.0)
    torch.testing.assert_close(sk.softpick(x), torch.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-6))
    very_negative = torch.tensor([[-1000.0, -2000.0, -1e4]], dtype=torch.float64)
    assert torch.equal(sk.softpick(very_negative), torch.zeros_like(very_negative))


def test_stablemax(x):
    s = torch.where(x >= 0, x + 1, 1 / (1 - x))
    torch.testing.assert_close(sk.stablemax(x), s / s.sum(-1, keepdim=True))


def test_clipped_softmax(x):
    expected = torch.clamp((1.1 + 0.2) * naive_softmax(x) - 0.2, 0, 1)
    torch.testing.assert_close(sk.clipped_softmax(x, gamma=-0.2, zeta=1.1), expected)
    torch.testing.assert_close(sk.clipped_softmax(x, gamma=0.0, zeta=1.0), naive_softmax(x))


def test_sigmoid(x):
    n = x.shape[-1]
    torch.testing.assert_close(sk.sigmoid(x), torch.sigmoid(x - math.log(n)))
    torch.testing.assert_close(sk.sigmoid(x, bias=0.5), torch.sigmoid(x + 0.5))
    torch.testing.assert_close(sk.sigmoid(x, bias_offset=0.25), torch.sigmoid(x - math.log(n) + 0.25))


def test_relu_family(x):
    n = x.shape[-1]
    torch.testing.assert_close(sk.relu(x), torch.relu(x) / n)
    r = torch.relu(x)
    torch.testing.assert_close(sk.relu_l1(x), r / (r.sum(-1, keepdim=True) + 1e-6))
    s = torch.nn.functional.softplus(x)
    torch.testing.assert_close(sk.softplus_l1(x), s / (s.sum(-1, keepdim=True) + 1e-6))


def test_every_registered_name_has_a_public_function():
    for spec in registry.normalizers():
        assert getattr(sk, spec.name) is spec.fn
