"""adaptive_softmax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import entropy, naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "adaptive_softmax"


def test_spec():
    check_spec(NAME)


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


def test_rows_of_huge_negative_scores_are_not_empty():
    # beta * finfo.min overflows to -inf at every entry (beta > 1 for a uniform row): the row
    # is still uniform (or all on its top entry), as float64 gives, with a finite gradient
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(3))
    x[1] = torch.finfo(torch.float32).min
    x[2] = -1e38
    x[3, ::2] = torch.finfo(torch.float32).min
    xr = x.clone().requires_grad_(True)
    p = sk.adaptive_softmax(xr)
    torch.testing.assert_close(p.double(), sk.adaptive_softmax(x.double()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p[1], torch.full((300,), 1 / 300))
    (g,) = torch.autograd.grad((p * torch.arange(300.0)).sum(), xr)
    x64 = x.double().requires_grad_(True)
    (g64,) = torch.autograd.grad((sk.adaptive_softmax(x64) * torch.arange(300.0, dtype=torch.float64)).sum(), x64)
    assert torch.isfinite(g).all()      # finfo.min next to ordinary scores: the entropy's p log p
    torch.testing.assert_close(g.double(), g64, rtol=1e-4, atol=1e-4)
