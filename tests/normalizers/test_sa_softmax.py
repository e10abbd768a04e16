"""sa_softmax: the examples its spec carries, its pieces, and the definition written naively."""

import pytest
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


def _sa_jacobian_product(x, g):
    """g^T J in float64 by the formula J = diag(p) + diag(x) (diag(p) - p p^T), x one row."""
    p = torch.softmax(x, -1)
    return g * p + p * (g * x - (p * g * x).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_at_scores_near_finfo_max_is_finite(dtype):
    """Audit 2026-12-03: the backward of x p sent g x into the softmax's backward, which
    overflowed (inf - inf = NaN) on a row of finfo.min mask fills and beside a finfo.max score."""
    big = torch.finfo(dtype).max
    g = torch.tensor([1.0, -1.0, 2.0, 0.0, 0.0], dtype=dtype)
    for row in (torch.full((5,), -big, dtype=dtype), torch.full((5,), big, dtype=dtype)):
        x = row.clone().requires_grad_()
        grad, = torch.autograd.grad(sk.sa_softmax(x), x, g)
        expected = g.double() * 0.2 + 0.2 * row.double() * (g.double() - 0.4)   # p = 1/5, <p, g> = 0.4
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad.double(), expected, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)
    x = torch.tensor([big, 0.0, 1.0, 2.0, 3.0], dtype=dtype, requires_grad=True)
    grad, = torch.autograd.grad(sk.sa_softmax(x), x, torch.tensor([2.0, -1.0, 1.0, 1.0, 2.0], dtype=dtype))
    assert grad.tolist() == [2.0, 0.0, 0.0, 0.0, 0.0]
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)   # ordinary rows: unchanged
    upstream = torch.randn(4, 7, dtype=torch.float64)
    grad, = torch.autograd.grad(sk.sa_softmax(x), x, upstream)
    for r in range(4):
        torch.testing.assert_close(grad[r], _sa_jacobian_product(x[r].detach(), upstream[r]))


def test_normalized_at_a_plus_inf_score_is_its_limit():
    """Audit 2026-12-03: (inf - low) / (inf - low + eps) gave NaN; the limit is 1 (as at 1e300)."""
    x = torch.tensor([[float("inf"), 1.0, 2.0], [float("inf"), float("inf"), -1.0]], requires_grad=True)
    out = sk.sa_softmax(x, normalized=True)
    assert out.tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
    grad, = torch.autograd.grad(out, x, torch.ones_like(out))
    assert grad.eq(0).all()   # a constant limit (softmax's own gradient at a +inf row is 0)
