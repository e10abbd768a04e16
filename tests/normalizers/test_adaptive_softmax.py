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
