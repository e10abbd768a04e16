"""softmax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "softmax"


def test_spec():
    check_spec(NAME)


def test_softmax_temperature(x):
    torch.testing.assert_close(sk.softmax(x, temperature=0.7), naive_softmax(x, 0.7))
    torch.testing.assert_close(sk.log_softmax(x, temperature=2.0), torch.log(naive_softmax(x, 2.0)))
    torch.testing.assert_close(sk.logsumexp(x), torch.log(torch.exp(x).sum(-1)))
