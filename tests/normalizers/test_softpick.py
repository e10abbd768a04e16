"""softpick: the examples its spec carries, its pieces, and the definition written naively."""

import math

import torch

import softmaxkit as sk
from tests.normalizers._spec_checks import check_spec

NAME = "softpick"


def test_spec():
    check_spec(NAME)


def test_softpick(x):
    m = x.max(-1, keepdim=True).values
    e = torch.exp(x - m) - torch.exp(-m)
    torch.testing.assert_close(sk.softpick(x), torch.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-6))
    plain = torch.exp(x) - 1
    torch.testing.assert_close(sk.softpick(x), torch.relu(plain) / plain.abs().sum(-1, keepdim=True),
                               rtol=2e-6, atol=0)
    assert (sk.softpick(x)[x <= 0] == 0).all()


def test_softpick_stable_form_on_extreme_rows():
    x = torch.tensor([[800.0, 799.0, -3.0]], dtype=torch.float64)
    e = torch.exp(x - 800.0) - math.exp(-800.0)
    torch.testing.assert_close(sk.softpick(x), torch.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-6))
    very_negative = torch.tensor([[-1000.0, -2000.0, -1e4]], dtype=torch.float64)
    assert torch.equal(sk.softpick(very_negative), torch.zeros_like(very_negative))
