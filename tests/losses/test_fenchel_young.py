"""Fenchel-Young losses: cross-entropy for softmax, the sparsemax and entmax losses."""

import entmax
import pytest
import torch
import torch.nn.functional as F

import softmaxkit as sk
from softmaxkit.losses import fenchel_young_loss

NORMALIZERS = [("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax", 1.3), ("entmax", 2.5)]


def _logits(shape=(8, 7), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(shape, generator=g, dtype=dtype)).requires_grad_()


def _probs(x, name, alpha):
    return sk.normalize(x.detach(), name, **({"alpha": alpha} if alpha is not None else {}))


def test_softmax_is_cross_entropy():
    x = _logits()
    t = torch.arange(8) % 7
    torch.testing.assert_close(fenchel_young_loss(x, t), F.cross_entropy(x, t))
    y = torch.softmax(_logits(seed=1).detach(), -1)
    kl = F.kl_div(torch.log_softmax(x, -1), y, reduction="batchmean")
    torch.testing.assert_close(fenchel_young_loss(x, y), kl)


@pytest.mark.parametrize("name,alpha", NORMALIZERS)
def test_gradient_is_p_minus_y(name, alpha):
    x = _logits()
    t = torch.arange(8) % 7
    loss = fenchel_young_loss(x, t, name, alpha=alpha, reduction="sum")
    grad, = torch.autograd.grad(loss, x)
    torch.testing.assert_close(grad, _probs(x, name, alpha) - F.one_hot(t, 7).double())


@pytest.mark.parametrize("name,alpha", NORMALIZERS)
def test_nonnegative_and_zero_at_the_prediction(name, alpha):
    x = _logits()
    t = torch.arange(8) % 7
    assert bool((fenchel_young_loss(x, t, name, alpha=alpha, reduction="none") >= -1e-12).all())
    p = _probs(x, name, alpha)
    at_p = fenchel_young_loss(x, p, name, alpha=alpha, reduction="none")
    torch.testing.assert_close(at_p, torch.zeros(8, dtype=torch.float64), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name,alpha", NORMALIZERS)
def test_gradcheck(name, alpha):
    x = _logits((3, 5))
    y = torch.softmax(_logits((3, 5), seed=2).detach(), -1)
    assert torch.autograd.gradcheck(lambda x: fenchel_young_loss(x, y, name, alpha=alpha), (x,))


SPARSE = [(name, alpha) for name, alpha in NORMALIZERS if name != "softmax"]


@pytest.mark.parametrize("name,alpha", SPARSE)
def test_gradgradcheck(name, alpha):
    """Second derivatives: p_hat used to come from detached logits, so they were silently 0.
    (Small logits: every row has at least two classes in the support, a Hessian that is not 0.)"""
    x = (_logits((3, 5)).detach() / 4).requires_grad_()
    y = torch.softmax(_logits((3, 5), seed=2).detach(), -1)
    assert torch.autograd.gradgradcheck(lambda x: fenchel_young_loss(x, y, name, alpha=alpha), (x,))


@pytest.mark.parametrize("name,alpha", SPARSE)
def test_hessian_is_the_normalizer_jacobian(name, alpha):
    """The Hessian in the logits is d p_hat / d theta (0 on a -inf logit): through create_graph=True,
    and through torch.func.hessian."""
    x = _logits((3, 5)).detach() / 4
    x[0, 1] = float("-inf")
    t = torch.tensor([0, 3, 1])
    v = torch.randn(3, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    xr = x.clone().requires_grad_()
    jv, = torch.autograd.grad(sk.normalize(xr, name, **_params(alpha)), xr, v)
    grad, = torch.autograd.grad(fenchel_young_loss(xr, t, name, alpha=alpha, reduction="sum"), xr, create_graph=True)
    hv, = torch.autograd.grad(grad, xr, v)
    torch.testing.assert_close(hv, jv)
    hessian = torch.func.hessian(lambda x: fenchel_young_loss(x, t, name, alpha=alpha, reduction="sum"))(x)
    jacobian = torch.autograd.functional.jacobian(lambda x: sk.normalize(x, name, **_params(alpha)), x)
    torch.testing.assert_close(hessian, jacobian)
    assert (hessian[0, 1] == 0).all() and (hessian[:, :, 0, 1] == 0).all()


def test_matches_the_entmax_package():
    x = _logits()
    t = torch.arange(8) % 7
    torch.testing.assert_close(fenchel_young_loss(x, t, "sparsemax", reduction="none"),
                               entmax.SparsemaxLoss(reduction="none")(x, t))
    torch.testing.assert_close(fenchel_young_loss(x, t, "entmax15", reduction="none"),
                               entmax.Entmax15Loss(reduction="none")(x, t))
    torch.testing.assert_close(fenchel_young_loss(x, t, "entmax", alpha=1.7, reduction="none"),
                               entmax.EntmaxBisectLoss(alpha=1.7, n_iter=60, reduction="none")(x, t), atol=1e-6, rtol=1e-6)


def test_sparsemax_loss_closed_form():
    # Martins & Astudillo (2016), eq. 18: L = -x_y + 1/2 sum_{j in S} (x_j^2 - tau^2) + 1/2
    x = _logits()
    t = torch.arange(8) % 7
    p = sk.sparsemax(x.detach())
    support = p > 0
    tau = ((x.detach() * support).sum(-1) - 1) / support.sum(-1)
    closed = (-x.detach().gather(1, t[:, None]).squeeze(1)
              + 0.5 * ((x.detach() ** 2 - tau[:, None] ** 2) * support).sum(-1) + 0.5)
    torch.testing.assert_close(fenchel_young_loss(x, t, "sparsemax", reduction="none"), closed)


def test_dim_and_half_precision():
    x = _logits((4, 6, 3)).detach()
    t = torch.randint(0, 6, (4, 3), generator=torch.Generator().manual_seed(0))
    moved = fenchel_young_loss(x, t, "entmax15", dim=1, reduction="none")
    torch.testing.assert_close(moved, fenchel_young_loss(x.transpose(1, 2), t, "entmax15", reduction="none"))
    half = fenchel_young_loss(x.to(torch.bfloat16), t, "sparsemax", dim=1)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), fenchel_young_loss(x.to(torch.bfloat16).float(), t, "sparsemax",
                                                                dim=1).float(), rtol=1e-2, atol=1e-2)


def test_bad_input():
    x = _logits()
    t = torch.arange(8) % 7
    with pytest.raises(ValueError, match="normalizer"):
        fenchel_young_loss(x, t, "softpick")
    with pytest.raises(ValueError, match="alpha"):
        fenchel_young_loss(x, t, "sparsemax", alpha=1.5)
    with pytest.raises(ValueError, match="alpha"):
        fenchel_young_loss(x, t, "entmax", alpha=0.5)
    with pytest.raises(ValueError, match="target"):
        fenchel_young_loss(x, t + 7)
    with pytest.raises(ValueError, match="target"):
        fenchel_young_loss(x, torch.full((8, 7), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="reduction"):
        fenchel_young_loss(x, t, reduction="avg")
    for bad in (None, 0, ["softmax"]):   # hostile sweep: "name must be a str" (the registry's argument)
        with pytest.raises(TypeError, match="normalizer must be a str"):
            fenchel_young_loss(x, t, bad)


# ---- -inf logits are masked classes (issue 12) ------------------------------------------

def _params(alpha):
    return {"alpha": alpha} if alpha is not None else {}


@pytest.mark.parametrize("name,alpha", NORMALIZERS)
def test_minus_inf_logit_is_a_masked_class(name, alpha):
    """A -inf logit gives the loss of the row without that class, and zero gradient there."""
    full = _logits()
    x = full.detach().clone()
    x[:, 2] = float("-inf")
    x.requires_grad_()
    kept = torch.tensor([0, 1, 3, 4, 5, 6])
    t = torch.tensor([0, 1, 3, 4, 5, 6, 0, 1])
    y = torch.softmax(_logits(seed=3).detach()[:, kept], -1)
    y_full = torch.zeros(8, 7, dtype=torch.float64)
    y_full[:, kept] = y
    for target, target_kept in ((t, torch.searchsorted(kept, t)), (y_full, y)):
        loss = fenchel_young_loss(x, target, name, alpha=alpha, reduction="none")
        expected = fenchel_young_loss(full.detach()[:, kept], target_kept, name, alpha=alpha, reduction="none")
        assert torch.isfinite(loss).all()
        torch.testing.assert_close(loss, expected)
        grad, = torch.autograd.grad(loss.sum(), x)
        p = _probs(x, name, alpha)
        y_dense = F.one_hot(target, 7).double() if target.dtype == torch.int64 else target
        torch.testing.assert_close(grad, p - y_dense)
        assert (grad[:, 2] == 0).all()


@pytest.mark.parametrize("name,alpha", NORMALIZERS)
def test_target_on_a_minus_inf_logit_has_infinite_loss(name, alpha):
    """Mass on a masked class: loss +inf (as F.cross_entropy for softmax), finite gradient,
    other rows untouched."""
    x = _logits().detach().clone()
    x[0, 2] = float("-inf")
    x[1] = float("-inf")
    x.requires_grad_()
    t = torch.arange(8) % 7
    t[0] = 2
    y = torch.softmax(_logits(seed=4).detach(), -1)
    y[0, 2] = 0.0
    y[0] = y[0] / y[0].sum()
    y_bad = y.clone()
    y_bad[0] = 0.0
    y_bad[0, 2], y_bad[0, 3] = 0.5, 0.5
    for target in (t, y_bad):
        loss = fenchel_young_loss(x, target, name, alpha=alpha, reduction="none")
        assert loss[0] == float("inf") and loss[1] == float("inf")
        assert torch.isfinite(loss[2:]).all()
        assert fenchel_young_loss(x, target, name, alpha=alpha) == float("inf")
        grad, = torch.autograd.grad(loss.sum(), x)
        assert torch.isfinite(grad).all()
        assert grad[0, 2] == 0 and (grad[1] == 0).all()
    if name == "softmax":
        assert F.cross_entropy(x.detach()[:1], t[:1]) == float("inf")


def test_minus_inf_in_half_precision():
    x = torch.tensor([[1.0, float("-inf"), 0.5, -2.0]], dtype=torch.float16)
    for name, alpha in NORMALIZERS:
        loss = fenchel_young_loss(x, torch.tensor([0]), name, alpha=alpha)
        assert loss.dtype == torch.float16 and torch.isfinite(loss)


def test_nan_logit_gives_nan():
    x = torch.tensor([[1.0, float("nan"), 0.5]], dtype=torch.float64)
    for name, alpha in NORMALIZERS:
        assert torch.isnan(fenchel_young_loss(x, torch.tensor([0]), name, alpha=alpha))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "alpha"), [("softmax", None), ("sparsemax", None), ("entmax15", None),
                                             ("entmax", 1.3), ("entmax", 3.0)])
def test_huge_logit_rows_do_not_cancel(name, alpha, dtype):
    # a row of finfo.min (or -1e9) logits is a row of equal scores: the loss is that of a
    # row of zeros (shift invariance), not the 1e31 left by <theta, p> - theta_y in float32
    kw = {} if alpha is None else {"alpha": alpha}
    target = torch.tensor([2, 2, 1])
    for fill in (torch.finfo(dtype).min, -1e9):
        x = torch.full((3, 5), fill, dtype=dtype)
        x[2, 1] = fill + abs(fill) * 2 ** -10      # one entry above the others
        xr = x.clone().requires_grad_(True)
        loss = fenchel_young_loss(xr, target, name, reduction="none", **kw)
        (g,) = torch.autograd.grad(loss.sum(), xr)
        shifted = (x - x.amax(-1, keepdim=True)).requires_grad_(True)
        want = fenchel_young_loss(shifted, target, name, reduction="none", **kw)
        (g_want,) = torch.autograd.grad(want.sum(), shifted)
        torch.testing.assert_close(loss, want)
        torch.testing.assert_close(g, g_want)
        assert 0 < float(loss[0].detach()) < 2   # log(5) for softmax


@pytest.mark.parametrize("alpha", [1 + 1e-9, 1 + 1e-7, 1 + 1e-5, 1.01])
def test_float32_entmax_loss_near_alpha_one_is_the_float64_loss(alpha):
    """Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1)) cancelled in float32 as alpha neared 1:
    the loss went negative (down to -120) where it is non-negative and near cross-entropy."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 9, generator=g) * 3
    for target in (torch.randint(0, 9, (64,), generator=g), torch.softmax(torch.randn(64, 9, generator=g), -1)):
        low = fenchel_young_loss(z, target, "entmax", alpha=alpha, reduction="none")
        exact = fenchel_young_loss(z.double(), target.double() if target.is_floating_point() else target,
                                   "entmax", alpha=alpha, reduction="none")
        assert (low >= 0).all()
        torch.testing.assert_close(low.double(), exact, rtol=1e-5, atol=1e-5)
        if alpha - 1 <= 1e-5:   # the softmax loss (alpha = 1): cross-entropy, or KL(y || p)
            at_one = fenchel_young_loss(z.double(), target.double() if target.is_floating_point() else target,
                                        "softmax", reduction="none")
            torch.testing.assert_close(exact, at_one, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax", "entmax15"])
def test_gradient_under_compile_fullgraph(normalizer):
    """torch.compile(fullgraph=True) with a gradient: dynamo refused the conjugate's autograd
    Function (a custom jvp), and its backward's questions on the gradient (a graph break)."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 9, dtype=torch.float64, generator=gen)
    logits[0, 3] = float("-inf")
    target = torch.randint(0, 9, (6,), generator=gen)
    target[0] = 4

    def fn(z):
        return sk.losses.fenchel_young_loss(z, target, normalizer=normalizer)

    results = []
    for call in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        z = logits.clone().requires_grad_()
        loss = call(z)
        loss.backward()
        results.append((loss.detach(), z.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)
