"""float32 rows whose intermediate values overflow although the definition's result does not.

Found by the function audit: SSMax of a row of ``finfo(float32).min`` fills over 600 entries
(``s log(n) x`` below ``-finfo.max``: every entry ``-inf``) came out all zeros instead of
uniform, and ``relu_l1`` / ``softplus_l1`` of ``finfo.max`` scores (a sum of finite terms
that overflows) came out all zeros instead of equal weights. The float64 computation of
the same definition is the oracle; the other rows of the batch must stay exact.
"""

import math

import pytest
import torch

import softmaxkit as sk

F32, F64 = torch.float32, torch.float64
FMIN, FMAX = torch.finfo(F32).min, torch.finfo(F32).max


def _batch(n, seed=0):
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(seed), dtype=F32)
    x[1] = FMIN                       # a finfo.min fill: uniform
    x[2, : n // 2] = FMAX             # overflowing maxima, then ordinary scores
    x[3, ::3] = FMAX / 2
    x[3, 1::3] = FMAX
    return x


CASES = [
    ("ssmax", {}),
    ("ssmax", {"s": 1.0}),
    ("relu_l1", {}),
    ("softplus_l1", {}),
    ("multimax", {"r": (0.0, 0.0, 0.0, 0.0), "t": (0.0, 1.5, 0.0, 0.0)}),
]


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
@pytest.mark.parametrize(("name", "params"), CASES)
def test_matches_the_float64_definition(name, params, dtype):
    x = _batch(600).to(dtype)
    out = sk.normalize(x, name, **params)
    want = sk.normalize(x.double(), name, **params)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want.to(dtype).double(), rtol=1e-2 if dtype != F32 else 1e-5,
                               atol=1e-6)
    # the good row is untouched by the bad ones (same shape: the same reductions)
    assert torch.equal(out[0], sk.normalize(x[:1].expand_as(x).contiguous(), name, **params)[0])


@pytest.mark.parametrize(("name", "params"), CASES)
def test_overflowing_rows_have_finite_gradients(name, params):
    x = _batch(600).requires_grad_()
    out = sk.normalize(x, name, **params)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    assert torch.isfinite(x.grad).all()


def test_ssmax_finfo_min_row_is_uniform():
    x = torch.full((1, 600), FMIN)
    torch.testing.assert_close(sk.ssmax(x), torch.full_like(x, 1 / 600))


@pytest.mark.parametrize("s", [0.43, 1.0])
def test_a_float64_row_of_finfo_min_fills_is_uniform_with_the_slope_as_gradient(s):
    """float64 has no wider dtype to retry in: SSMax's ``s log(n) x`` of a float64 finfo.min fill
    overflowed to -inf and the row came out all zeros (hostile audit, 2026-12-02). g is now held
    at the float64 range, with ``g' = s log n`` as its derivative: the gradient of the uniform
    row is ``g' p (w - sum p w)``, as float32 rows (recomputed in float64) already had."""
    n = 600
    x = torch.full((2, n), torch.finfo(F64).min, dtype=F64)
    x[1, :3] = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    x.requires_grad_()
    out = sk.ssmax(x, s=s)
    torch.testing.assert_close(out[0], torch.full((n,), 1 / n, dtype=F64))
    torch.testing.assert_close(out[1, :3], torch.softmax(x[1, :3].detach() * s * math.log(n), -1))
    assert out[1, 3:].eq(0).all()
    weight = torch.linspace(-1, 1, n, dtype=F64)
    grad, = torch.autograd.grad((out * weight).sum(), x)
    want = s * math.log(n) / n * (weight - weight.mean())
    torch.testing.assert_close(grad[0], want)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("name", ["relu_l1", "softplus_l1"])
def test_rectifier_of_finfo_max_scores_gives_equal_weights(name):
    x = torch.tensor([[FMAX, FMAX, -1.0, FMAX, 0.0]])
    torch.testing.assert_close(sk.normalize(x, name), torch.tensor([[1 / 3, 1 / 3, 0.0, 1 / 3, 0.0]]))


def _cube(x):
    return torch.relu(x) ** 3


def _dcube(x):
    return 3 * torch.relu(x) ** 2


def test_a_user_term_overflowing_float32_is_computed_in_float64():
    """A user's ``relu(x)^3`` at ``1e13`` is ``inf`` in float32 (``inf / inf``: NaN rows before)."""
    name = "audit_cube_l1"
    sk.register_normalizer(name, family="sum_normalized", h=_cube, dh=_dcube, eps=1e-6)
    try:
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
        x[1, :2] = torch.tensor([1e13, 2e13])
        x[2, 0] = 1e20
        xr = x.clone().requires_grad_()
        out = sk.normalize(xr, name)
        torch.testing.assert_close(out.double(), sk.normalize(x.double(), name).float().double())
        torch.testing.assert_close(out[1, :2], torch.tensor([1 / 9, 8 / 9]))
        assert torch.equal(out[0], sk.normalize(x[:1].expand(3, 5).contiguous(), name)[0])
        out.backward(torch.linspace(-1, 1, 15).reshape(3, 5))
        assert torch.isfinite(xr.grad).all()
    finally:
        sk.unregister_normalizer(name)
