"""stablemax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._spec_checks import check_spec

NAME = "stablemax"


def test_spec():
    check_spec(NAME)


def test_stablemax(x):
    s = torch.where(x >= 0, x + 1, 1 / (1 - x))
    torch.testing.assert_close(sk.stablemax(x), s / s.sum(-1, keepdim=True))
