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


def test_finfo_min_fill_has_a_finite_gradient():
    # scores.masked_fill(~mask, finfo.min): those entries get p = 0 and output 0; their
    # x * dL/dy must not overflow into a NaN gradient for the whole row
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    x[1, ::2] = torch.finfo(torch.float32).min
    x[2, ::3] = -1e9
    w = torch.linspace(-2, 2, 50)
    xr = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((sk.sa_softmax(xr) * w).sum(), xr)
    x64 = x.double().requires_grad_(True)
    (g64,) = torch.autograd.grad((sk.sa_softmax(x64) * w.double()).sum(), x64)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g.double(), g64, rtol=1e-5, atol=1e-6)
    assert torch.equal(g[1, ::2], torch.zeros(25))
