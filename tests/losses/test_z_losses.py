"""The spherical z-loss and the PaLM logit z-penalty."""

import math

import pytest
import torch

from softmaxkit.losses import logit_z_penalty, spherical_z_loss


def _logits(shape=(6, 9), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=g, dtype=torch.float64)).requires_grad_()


def test_spherical_z_loss_definition():
    o = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)
    t = torch.tensor([3])
    mu, sigma = 3.0, math.sqrt((4 + 1 + 0 + 9) / 4)
    z = (6.0 - mu) / sigma
    a, b = 0.5, 2.0
    expected = math.log1p(math.exp(a * (b - z))) / a
    assert spherical_z_loss(o, t, a=a, b=b).item() == pytest.approx(expected, rel=1e-12)


def test_spherical_z_loss_is_shift_and_scale_invariant():
    o = _logits().detach()
    t = torch.arange(6)
    base = spherical_z_loss(o, t, reduction="none")
    torch.testing.assert_close(spherical_z_loss(3.5 * o - 7.0, t, reduction="none"), base)


def test_spherical_z_loss_gradcheck_and_constant_rows():
    o = _logits((3, 5))
    t = torch.tensor([0, 4, 2])
    assert torch.autograd.gradcheck(lambda o: spherical_z_loss(o, t, a=0.7, b=1.5), (o,))
    flat = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    loss = spherical_z_loss(flat, torch.tensor([0, 1]), reduction="sum")
    assert loss.item() == pytest.approx(2 * math.log1p(math.e))
    g, = torch.autograd.grad(loss, flat)
    assert bool((g == 0).all())


def test_logit_z_penalty_definition_and_gradcheck():
    z = _logits()
    expected = 1e-4 * torch.logsumexp(z, -1) ** 2
    torch.testing.assert_close(logit_z_penalty(z, reduction="none"), expected)
    torch.testing.assert_close(logit_z_penalty(z, weight=0.5), (0.5 * torch.logsumexp(z, -1) ** 2).mean())
    assert torch.autograd.gradcheck(lambda z: logit_z_penalty(z, weight=0.3, dim=0), (z,))


def test_logit_z_penalty_mask_and_empty_rows():
    z = _logits((2, 4))
    mask = torch.tensor([[True, False, True, True], [False] * 4])
    out = logit_z_penalty(z, weight=1.0, mask=mask, reduction="none")
    assert out[1] == 0
    torch.testing.assert_close(out[0], torch.logsumexp(z[0, [0, 2, 3]], 0) ** 2)
    g, = torch.autograd.grad(out.sum(), z)
    assert bool((g[1] == 0).all()) and g[0, 1] == 0


def test_bad_input():
    z = _logits()
    with pytest.raises(ValueError, match="a must be > 0"):
        spherical_z_loss(z, torch.arange(6), a=0.0)
    with pytest.raises(ValueError, match="target"):
        spherical_z_loss(z, torch.arange(6) + 9)
    with pytest.raises(TypeError, match="target"):   # (a NotImplementedError from aten's lt before)
        spherical_z_loss(z, torch.zeros(6, dtype=torch.complex64))
    with pytest.raises(ValueError, match="weight"):
        logit_z_penalty(z, weight=-1.0)
    with pytest.raises(ValueError, match="reduction"):
        logit_z_penalty(z, reduction="avg")


def test_logit_z_penalty_propagates_nan():
    """A NaN logit gives a NaN penalty (it used to become 0); an all-masked row still gives 0."""
    x = torch.tensor([[float("nan"), 1.0, 2.0], [0.0, 1.0, 2.0], [float("-inf")] * 3], dtype=torch.float64)
    out = logit_z_penalty(x, reduction="none")
    assert torch.isnan(out[0])
    assert torch.isfinite(out[1]) and out[1] > 0
    assert out[2] == 0
    assert torch.isnan(logit_z_penalty(x))
    inf_row = torch.tensor([[float("inf"), 0.0]])
    assert logit_z_penalty(inf_row) == float("inf")


@pytest.mark.parametrize("row", [[1e-30, 0.0, 0.0, 0.0], [3e19, -3e19, 0.0, 1e19], [3e38, 3e38, -3e38, 1e38],
                                 [1e-40, 0.0, 2e-40, 0.0]])
def test_spherical_z_loss_scale_invariance_survives_float32_range(row):
    """The variance of such rows underflowed or overflowed in float32, which gave z = 0 (loss
    softplus(1)) instead of the loss of the same row rescaled (hostile audit, 2026-12-02)."""
    x = torch.tensor([row], dtype=torch.float32, requires_grad=True)
    t = torch.tensor([0])
    scaled = torch.tensor([row], dtype=torch.float64)
    scaled = scaled / scaled.abs().max()
    want = spherical_z_loss(scaled, t)
    got = spherical_z_loss(x, t)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    g, = torch.autograd.grad(got, x)
    # z is scale invariant, so its gradient scales as 1 / |x|: beyond float32's range at 1e-40
    assert bool(torch.isfinite(g).all()) or max(map(abs, row)) < 1e-38


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_spherical_z_loss_of_a_non_finite_row_is_nan(bad):
    """A NaN or inf logit used to give the finite loss of z = 0 with a NaN gradient."""
    x = torch.tensor([[1.0, bad, 0.0], [1.0, 2.0, 0.0]], requires_grad=True)
    out = spherical_z_loss(x, torch.tensor([0, 0]), reduction="none")
    assert torch.isnan(out[0]) and torch.isfinite(out[1])


def test_logit_z_penalty_refuses_an_infinite_weight():
    with pytest.raises(ValueError, match="weight"):
        logit_z_penalty(_logits(), weight=float("inf"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_spherical_z_loss_of_no_rows_and_no_classes(reduction):
    """Hostile sweep: (0, 0) logits raised IndexError from amax over the empty class axis
    (fenchel_young_loss and logit_z_penalty give an empty loss there)."""
    logits = torch.zeros(0, 0, requires_grad=True)
    loss = spherical_z_loss(logits, torch.zeros(0, dtype=torch.long), reduction=reduction)
    assert loss.shape == ((0,) if reduction == "none" else ()) and not loss.detach().any()
    loss.sum().backward()
    assert logits.grad.shape == (0, 0)
    with pytest.raises(ValueError, match="target"):
        spherical_z_loss(torch.zeros(3, 0), torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("dtype", [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)])
def test_class_targets_of_the_wide_unsigned_dtypes(dtype):
    """Hostile sweep: uint16 / uint32 / uint64 targets raised NotImplementedError ('"lt_cpu" not
    implemented for UInt16') in spherical_z_loss and fenchel_young_loss."""
    from softmaxkit.losses import fenchel_young_loss

    logits = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 4, 2, 1])
    assert spherical_z_loss(logits, target.to(dtype)) == spherical_z_loss(logits, target)
    for normalizer in ("softmax", "sparsemax", "entmax15"):
        assert fenchel_young_loss(logits, target.to(dtype), normalizer) == fenchel_young_loss(logits, target, normalizer)
    with pytest.raises(ValueError, match="target"):
        spherical_z_loss(logits, torch.tensor([0, 5, 2, 1]).to(dtype))


def test_a_weight_tensor_must_broadcast_to_the_rows():
    """Hostile sweep: a weight of shape (2,) for 4 rows raised "The size of tensor a (2) must match"."""
    logits = torch.randn(4, 3, dtype=torch.float64)
    per_row = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    want = (per_row * torch.logsumexp(logits, -1).square()).mean()
    torch.testing.assert_close(logit_z_penalty(logits, weight=per_row), want)
    with pytest.raises(ValueError, match="weight of shape"):
        logit_z_penalty(logits, weight=torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="weight of shape"):   # (4, 1) with 4 rows broadcast to (4, 4)
        logit_z_penalty(logits, weight=per_row[:, None])
