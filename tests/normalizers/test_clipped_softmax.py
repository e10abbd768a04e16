"""clipped_softmax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "clipped_softmax"


def test_spec():
    check_spec(NAME)


def test_clipped_softmax(x):
    expected = torch.clamp((1.1 + 0.2) * naive_softmax(x) - 0.2, 0, 1)
    torch.testing.assert_close(sk.clipped_softmax(x, gamma=-0.2, zeta=1.1), expected)
    torch.testing.assert_close(sk.clipped_softmax(x, gamma=0.0, zeta=1.0), naive_softmax(x))
