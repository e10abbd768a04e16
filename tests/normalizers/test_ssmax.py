"""ssmax: the examples its spec carries, its pieces, and the definition written naively."""

import math

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "ssmax"


def test_spec():
    check_spec(NAME)


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
