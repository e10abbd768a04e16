"""sa_softmax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "sa_softmax"


def test_spec():
    check_spec(NAME)


def test_sa_softmax(x):
    torch.testing.assert_close(sk.sa_softmax(x), x * naive_softmax(x))
    lo = torch.clamp(x.min(-1, keepdim=True).values, max=0)
    hi = torch.clamp(x.max(-1, keepdim=True).values, min=0)
    expected = (x - lo) / (hi - lo + 1e-6) * naive_softmax(x)
    torch.testing.assert_close(sk.sa_softmax(x, normalized=True), expected)
