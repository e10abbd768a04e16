"""relu: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._spec_checks import check_spec

NAME = "relu"


def test_spec():
    check_spec(NAME)


def test_relu_family(x):
    n = x.shape[-1]
    torch.testing.assert_close(sk.relu(x), torch.relu(x) / n)
    r = torch.relu(x)
    torch.testing.assert_close(sk.relu_l1(x), r / (r.sum(-1, keepdim=True) + 1e-6))
    s = torch.nn.functional.softplus(x)
    torch.testing.assert_close(sk.softplus_l1(x), s / (s.sum(-1, keepdim=True) + 1e-6))
