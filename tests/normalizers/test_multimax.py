"""multimax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "multimax"


def test_spec():
    check_spec(NAME)


def test_multimax(x):
    r = [-1.0, 1.0, -0.5, 0.5]
    t = [0.3, 0.7, 0.2, 0.1]
    relu = torch.relu
    sigma = x + t[0] * relu(r[0] - x) + t[1] * relu(x - r[1]) + t[2] * relu(r[2] - x) ** 2 + t[3] * relu(x - r[3]) ** 2
    torch.testing.assert_close(sk.multimax(x, r=r, t=t), naive_softmax(sigma))
    torch.testing.assert_close(sk.multimax(x), naive_softmax(x))
