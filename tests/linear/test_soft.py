"""SOFT: Newton-Schulz pseudo-inverse, its closed-form gradient, the Nystrom form, rank."""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit.linear import NewtonPinv, newton_pinv


def _segment_means(x, r, weights=None):
    """Adaptive average pooling over the visible rows of each (batch, head), written as loops."""
    b, h, _length, d = x.shape
    out = torch.zeros(b, h, r, d, dtype=x.dtype)
    for i in range(b):
        for j in range(h):
            rows = x[i, j] if weights is None else x[i, j][weights[i, min(j, weights.shape[1] - 1)].bool()]
            n = rows.shape[0]
            for s in range(r):
                a, e = (s * n) // r, -((-(s + 1) * n) // r)
                out[i, j, s] = rows[a:e].mean(0) if e > a else rows.mean(0)
    return out


def _kernel(a, b, scale):
    return torch.exp(-scale / 2 * torch.cdist(a, b) ** 2)


def _soft_dense(q, k, v, rank, key_mask=None, symmetric=False):
    scale = 1 / math.sqrt(q.shape[-1])
    w = None if key_mask is None else key_mask.to(q.dtype)
    ql, kl = _segment_means(q, rank, w), _segment_means(k, rank, w)
    a = _kernel(q, kl, scale) @ torch.linalg.pinv(_kernel(ql, kl, scale)) @ _kernel(ql, k, scale)
    if w is not None:
        a = a * w[..., None, :]
    if symmetric:
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-6).sqrt() / a.sum(-2, keepdim=True).clamp_min(1e-6).sqrt()
    return a @ v


def _spread(b, h, length, d, seed, dtype=torch.float64, segments=4):
    """Points around ``segments`` well-separated centres, one centre per contiguous segment:
    the landmark matrix is well conditioned and the kernel sums are far from 0."""
    g = torch.Generator().manual_seed(seed)
    centres = 1.5 * torch.randn(segments, d, generator=g, dtype=dtype)
    idx = (torch.arange(length) * segments) // length
    return centres[idx] + 0.3 * torch.randn(b, h, length, d, generator=g, dtype=dtype)


def test_newton_converges_to_pinv_on_well_conditioned_matrices():
    g = torch.Generator().manual_seed(0)
    a = torch.eye(8, dtype=torch.float64) + 0.2 * torch.randn(3, 8, 8, generator=g, dtype=torch.float64)
    torch.testing.assert_close(newton_pinv(a, 40), torch.linalg.pinv(a), rtol=0, atol=1e-10)
    rect = torch.randn(5, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(newton_pinv(rect, 60), torch.linalg.pinv(rect), rtol=0, atol=1e-10)
    # few iterations are not enough: the test can fail
    assert (newton_pinv(a, 2) - torch.linalg.pinv(a)).abs().max() > 1e-3


def test_newton_runs_without_autograd_and_the_closed_form_gradient_is_pinvs():
    g = torch.Generator().manual_seed(1)
    for shape in ((4, 4), (5, 3)):
        a = (torch.randn(*shape, generator=g, dtype=torch.float64) + torch.eye(*shape, dtype=torch.float64))
        a.requires_grad_()
        x = NewtonPinv.apply(a, 60)
        assert x.grad_fn is not None and x.grad_fn.__class__.__name__.startswith("NewtonPinv")
        gout = torch.randn(*x.shape, generator=g, dtype=torch.float64)
        (ours,) = torch.autograd.grad(x, a, gout)
        (ref,) = torch.autograd.grad(torch.linalg.pinv(a), a, gout)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-9)
        torch.autograd.gradcheck(lambda t: NewtonPinv.apply(t, 60), (a,))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_soft_equals_its_quadratic_form(masked, symmetric):
    q, k = _spread(2, 2, 24, 4, 0), _spread(2, 2, 24, 4, 1)
    v = _spread(2, 2, 24, 3, 2)
    key_mask = None
    if masked:
        key_mask = torch.rand(2, 1, 24, generator=torch.Generator().manual_seed(3)) > 0.3
    out = sk.linear_attention(q, k, v, "soft", rank=4, newton_iters=60, normalize="symmetric" if symmetric else None,
                              attn_mask=None if key_mask is None else key_mask[:, :, None, :])
    torch.testing.assert_close(out, _soft_dense(q, k, v, 4, key_mask, symmetric), rtol=1e-10, atol=1e-10)


def test_soft_gradcheck():
    q, k, v = (_spread(1, 1, 8, 3, s, segments=2).requires_grad_() for s in (4, 5, 6))
    torch.autograd.gradcheck(lambda a, b, c: sk.linear_attention(a, b, c, "soft", rank=2, newton_iters=60),
                             (q, k, v))


def test_soft_error_against_exact_gaussian_attention_falls_with_rank():
    length, d = 64, 4
    t = torch.linspace(0, 1, length, dtype=torch.float64)[:, None]
    freqs = torch.arange(1, d + 1, dtype=torch.float64)
    x = (2 * torch.sin(2 * math.pi * t * freqs))[None, None]     # a smooth trajectory, q = k as in SOFT
    v = torch.randn(1, 1, length, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact = _kernel(x, x, 1 / math.sqrt(d)) @ v
    errors = [float((sk.linear_attention(x, x, v, "soft", rank=r, newton_iters=100) - exact).norm() / exact.norm())
              for r in (2, 8, 32)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.05 < errors[0]
