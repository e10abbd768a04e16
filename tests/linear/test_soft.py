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


@pytest.mark.parametrize("iters", [None, 60])
def test_newton_pinv_under_torch_func_transforms_and_forward_ad(iters):
    """NewtonPinv had no ``setup_context``, ``vmap`` or ``jvp``: every ``torch.func`` transform and
    forward-mode AD raised. Now each gives the plain path's values and pinv's derivatives."""
    g = torch.Generator().manual_seed(4)
    a = torch.eye(4, 3, dtype=torch.float64) + 0.3 * torch.randn(3, 4, 3, generator=g, dtype=torch.float64)
    w = torch.randn(3, 3, 4, generator=g, dtype=torch.float64)
    da = torch.randn(3, 4, 3, generator=g, dtype=torch.float64)

    def pinv(t):
        return NewtonPinv.apply(t, iters)

    plain = torch.stack([pinv(m) for m in a])
    torch.testing.assert_close(torch.func.vmap(pinv)(a), plain, rtol=0, atol=1e-12)
    out, tangent = torch.func.jvp(pinv, (a,), (da,))
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(tangent, torch.func.jvp(torch.linalg.pinv, (a,), (da,))[1], rtol=0, atol=1e-9)
    with torch.autograd.forward_ad.dual_level():
        dual_tangent = torch.autograd.forward_ad.unpack_dual(pinv(torch.autograd.forward_ad.make_dual(a, da))).tangent
    torch.testing.assert_close(dual_tangent, tangent, rtol=0, atol=1e-12)
    grad = torch.func.grad(lambda t: (pinv(t) * w).sum())(a)
    leaf = a.clone().requires_grad_()
    (want,) = torch.autograd.grad((pinv(leaf) * w).sum(), leaf)
    torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_soft_under_torch_func_transforms_equals_the_plain_path(masked):
    q, k, v = _spread(1, 2, 12, 3, 7), _spread(1, 2, 12, 3, 8), _spread(1, 2, 12, 2, 9)
    mask = None
    if masked:
        mask = torch.rand(1, 1, 1, 12, generator=torch.Generator().manual_seed(5)) > 0.3

    def soft(a, b, c):
        return sk.linear_attention(a, b, c, "soft", rank=3, attn_mask=mask)

    w = torch.randn(1, 2, 12, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    grads = torch.func.grad(lambda *x: (soft(*x) * w).sum(), argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.testing.assert_close(grads, torch.autograd.grad((soft(*leaves) * w).sum(), leaves), rtol=0, atol=1e-10)
    tangents = (q.flip(-2), k.flip(-1), v.flip(-2))
    got = torch.func.jvp(soft, (q, k, v), tangents)
    torch.testing.assert_close(got, torch.autograd.functional.jvp(soft, (q, k, v), tangents), rtol=0, atol=1e-10)
    batch = torch.stack([q, q.flip(-2), 0.5 * q])
    torch.testing.assert_close(torch.func.vmap(lambda a: soft(a, k, v))(batch),
                               torch.stack([soft(a, k, v) for a in batch]), rtol=0, atol=1e-10)


def test_soft_on_meta_tensors_gives_the_shape():
    """The convergence test of ``newton_pinv`` read the meta tensor's (absent) values."""
    q, k, v = (torch.empty(2, 2, 9, d, dtype=torch.float64, device="meta") for d in (4, 4, 3))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool, device="meta")
    out = sk.linear_attention(q, k, v, "soft", rank=3, attn_mask=mask)
    assert out.device.type == "meta" and out.shape == (2, 2, 9, 3)
    assert newton_pinv(torch.empty(3, 4, 2, device="meta")).shape == (3, 2, 4)


def test_newton_pinv_until_converged_under_vmap_equals_a_loop():
    """``iters=None`` tests convergence on the values: ``vmap`` raised (data-dependent control flow)."""
    g = torch.Generator().manual_seed(8)
    a = torch.eye(3, dtype=torch.float64) + 0.3 * torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64)
    want = torch.stack([torch.stack([newton_pinv(m) for m in row]) for row in a])
    torch.testing.assert_close(torch.func.vmap(torch.func.vmap(newton_pinv))(a), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(want, torch.linalg.pinv(a), rtol=0, atol=1e-12)


def test_newton_pinv_checks_its_input():
    """Hostile sweep 2026-12-04: an integer matrix raised torch.finfo's TypeError, a vector an
    IndexError (dimension out of range), a list is_functorch_wrapped_tensor's TypeError, and an
    empty 0 x 0 matrix amax's IndexError."""
    with pytest.raises(TypeError, match="m must be"):
        newton_pinv(torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="m must be"):
        newton_pinv([[1.0]])
    with pytest.raises(ValueError, match="matrix"):
        newton_pinv(torch.ones(3))
    assert newton_pinv(torch.zeros(0, 0)).shape == (0, 0)
    assert newton_pinv(torch.zeros(2, 0, 3)).shape == (2, 3, 0)
