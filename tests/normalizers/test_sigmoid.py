"""sigmoid: the examples its spec carries, its pieces, and the definition written naively."""

import math

import torch

import softmaxkit as sk
from tests.normalizers._spec_checks import check_spec

NAME = "sigmoid"


def test_spec():
    check_spec(NAME)


def test_sigmoid(x):
    n = x.shape[-1]
    torch.testing.assert_close(sk.sigmoid(x), torch.sigmoid(x - math.log(n)))
    torch.testing.assert_close(sk.sigmoid(x, bias=0.5), torch.sigmoid(x + 0.5))
    torch.testing.assert_close(sk.sigmoid(x, bias_offset=0.25), torch.sigmoid(x - math.log(n) + 0.25))
