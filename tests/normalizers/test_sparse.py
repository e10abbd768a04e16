"""sparsemax, entmax15, entmax (alpha) and as_entmax: exactness, gradients, properties, edge rows."""

import math

import entmax as peer
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxkit as sk
from softmaxkit import registry

F64 = torch.float64
F32 = torch.float32


@pytest.fixture(autouse=True)
def _float32_default():
    """Other test modules change the default dtype; every tensor here states its own."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(old)


def randn(*shape, seed=0, dtype=F64, scale=2.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def naive_entmax(x, alpha):
    """alpha-entmax of each row of a float64 tensor by plain bisection on tau (test oracle)."""
    z = (alpha - 1) * (x - x.max(-1, keepdim=True).values)
    lo = torch.full_like(z[..., :1], -1.0)
    hi = torch.zeros_like(lo)
    for _ in range(200):
        mid = (lo + hi) / 2
        mass = (z - mid).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    p = (z - (lo + hi) / 2).clamp_min(0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------------------
# exactness against the entmax package and a naive oracle
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F64])
def test_agrees_with_entmax_package(dtype):
    x = randn(32, 17, seed=1, dtype=dtype, scale=3.0)
    torch.testing.assert_close(sk.sparsemax(x), peer.sparsemax(x, dim=-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(sk.entmax15(x), peer.entmax15(x, dim=-1), atol=1e-5, rtol=0)
    for alpha in (1.1, 1.75, 2.5):
        ref = peer.entmax_bisect(x, alpha, n_iter=100)
        torch.testing.assert_close(sk.entmax(x, alpha=alpha), ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(sk.entmax(x, alpha=torch.tensor(alpha, dtype=dtype)), ref, atol=1e-5, rtol=0)
    per_row = 1 + torch.rand(32, 1, generator=torch.Generator().manual_seed(2), dtype=dtype) * 1.5
    torch.testing.assert_close(sk.entmax(x, alpha=per_row), peer.entmax_bisect(x, per_row, n_iter=100),
                               atol=1e-5, rtol=0)


def test_agrees_along_another_dim():
    x = randn(7, 5, 6, seed=3)
    torch.testing.assert_close(sk.sparsemax(x, dim=1), peer.sparsemax(x, dim=1))
    torch.testing.assert_close(sk.entmax15(x, dim=0), peer.entmax15(x, dim=0))
    torch.testing.assert_close(sk.entmax(x, dim=1, alpha=1.3), peer.entmax_bisect(x, 1.3, dim=1, n_iter=100))


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.5, 2.0, 3.0, 8.0])
def test_matches_naive_bisection_in_float64(alpha):
    # at alpha = 8 the oracle itself is 2.9e-12 off a 50-digit mpmath solution (row 8), where
    # sk.entmax (and the numba kernel) are 1.1e-12 off
    atol = 1e-12 if alpha <= 3.0 else 5e-12
    x = randn(20, 11, seed=4, scale=4.0)
    torch.testing.assert_close(sk.entmax(x, alpha=alpha), naive_entmax(x, alpha), atol=atol, rtol=0)
    tensor_alpha = torch.tensor([[alpha]], dtype=F64)
    torch.testing.assert_close(sk.entmax(x, alpha=tensor_alpha), naive_entmax(x, alpha), atol=atol, rtol=0)


def test_float32_near_alpha_one_is_accurate():
    """theta-form bisection keeps float32 exact where tau-form bisection loses digits."""
    x = randn(30, 17, seed=5, dtype=F32, scale=3.0)
    for alpha in (1.0001, 1.001, 1.01):
        ref = sk.entmax(x.double(), alpha=alpha)
        torch.testing.assert_close(sk.entmax(x, alpha=alpha).double(), ref, atol=1e-6, rtol=0)


def test_alpha_gradient_agrees_with_entmax_package():
    x = randn(5, 8, seed=6)
    w = randn(5, 8, seed=7)
    for value in (1.2, 1.5, 1.9):
        a = torch.full((5, 1), value, dtype=F64, requires_grad=True)
        b = a.detach().clone().requires_grad_()
        (sk.entmax(x, alpha=a) * w).sum().backward()
        (peer.entmax_bisect(x, b, n_iter=100) * w).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, atol=1e-8, rtol=1e-6)


# ----------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------

def _mask(shape, seed):
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    m[..., 0] = True
    return m


@pytest.mark.parametrize("with_mask", [False, True])
def test_gradcheck_sparsemax_entmax15(with_mask):
    x = randn(4, 7, seed=8).requires_grad_()
    mask = _mask((4, 7), 9) if with_mask else None
    assert torch.autograd.gradcheck(lambda x: sk.sparsemax(x, mask=mask), (x,))
    assert torch.autograd.gradcheck(lambda x: sk.entmax15(x, mask=mask), (x,))
    assert torch.autograd.gradcheck(lambda x: sk.entmax(x, mask=mask, alpha=1.3), (x,))


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("alpha", [1.00001, 1.4, 2.0, 2.7])
def test_gradcheck_entmax_with_learnable_alpha(alpha, with_mask):
    x = randn(4, 6, seed=10).requires_grad_()
    a = torch.full((4, 1), alpha, dtype=F64) + torch.arange(4, dtype=F64).view(4, 1) * 1e-3
    a.requires_grad_()
    mask = _mask((4, 6), 11) if with_mask else None
    assert torch.autograd.gradcheck(lambda x, a: sk.entmax(x, mask=mask, alpha=a), (x, a))


def test_gradcheck_per_head_alpha_along_dim_1():
    x = randn(1, 3, 4, 3, seed=12).requires_grad_()
    a = torch.tensor([1.2, 1.5, 1.8], dtype=F64).view(3, 1, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, a: sk.entmax(x, dim=-2, alpha=a.unsqueeze(-2).squeeze(-1)), (x, a))


def test_second_derivatives():
    x = randn(3, 5, seed=29).requires_grad_()
    a = torch.tensor([[1.3], [1.6], [2.2]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: sk.sparsemax(x), (x,))
    assert torch.autograd.gradgradcheck(lambda x: sk.entmax15(x), (x,))
    assert torch.autograd.gradgradcheck(lambda x, a: sk.entmax(x, alpha=a), (x, a))


def test_alpha_gradient_at_exactly_one_is_the_softmax_limit():
    x = randn(3, 6, seed=13)
    w = randn(3, 6, seed=14)
    a = torch.ones(3, 1, dtype=F64, requires_grad=True)
    p = sk.entmax(x, alpha=a)
    torch.testing.assert_close(p, torch.softmax(x, -1), atol=1e-15, rtol=0)
    (p * w).sum().backward()
    logp = torch.log_softmax(x, -1)
    q = logp.exp()
    dp = -(q / 2) * (logp ** 2 - (q * logp ** 2).sum(-1, keepdim=True))
    torch.testing.assert_close(a.grad, (dp * w).sum(-1, keepdim=True), atol=1e-12, rtol=1e-9)
    h = 1e-7
    one_sided = ((sk.entmax(x, alpha=1 + h) - p.detach()) / h * w).sum(-1, keepdim=True)
    torch.testing.assert_close(a.grad, one_sided, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("alpha", [3.0, 5.0, 10.0])
def test_float32_gradient_past_alpha_two_is_accurate(backend, alpha):
    """Past alpha = 2 the backward's weights p^{2-alpha} span many decades (1e14 at alpha = 10):
    the float32 gradient must stay that of the same float32 scores in float64 (the reference
    lost 4.4 of 41 at alpha = 5 and 1.7e7 at alpha = 10 to cancellation)."""
    x = randn(512, 64, seed=3, dtype=F32)
    dy = randn(512, 64, seed=4, dtype=F32)

    def grad(values, out_grad, name):
        values = values.clone().requires_grad_()
        with sk.use_backend(name):
            return torch.autograd.grad(sk.entmax(values, alpha=alpha), values, out_grad)[0]

    truth = grad(x.double(), dy.double(), "reference")
    got = grad(x, dy, backend)
    assert (got.double() - truth).abs().max() <= 1e-6 * truth.abs().max()


def test_float32_alpha_gradient_beside_a_small_weight_is_finite():
    """p = (0.9998, 0.0002) at alpha = 3: 1 + u d rounded to 0 in float32 and the alpha gradient
    was NaN on the reference; it is the float64 one."""
    grads = []
    for dtype in (F32, F64):
        x = torch.tensor([[0.0, -0.4998, -3.0]], dtype=dtype, requires_grad=True)
        a = torch.tensor([[3.0]], dtype=dtype, requires_grad=True)
        with sk.use_backend("reference"):
            p = sk.entmax(x, alpha=a)
        grads.append(torch.autograd.grad(p, (x, a), torch.tensor([[1.0, -1.0, 0.5]], dtype=dtype)))
    for got, want in zip(grads[0], grads[1]):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_mixed_alpha_rows_are_stable():
    x = randn(4, 9, seed=15)
    a = torch.tensor([[1.0], [1.0 + 1e-12], [1.5], [2.0]], dtype=F64, requires_grad=True)
    p = sk.entmax(x, alpha=a)
    torch.testing.assert_close(p[0], torch.softmax(x[0], -1), atol=1e-15, rtol=0)
    torch.testing.assert_close(p[1], torch.softmax(x[1], -1), atol=1e-10, rtol=0)
    torch.testing.assert_close(p[2], sk.entmax15(x[2]))
    torch.testing.assert_close(p[3], sk.sparsemax(x[3]))
    p.pow(2).sum().backward()
    assert torch.isfinite(a.grad).all()


@pytest.mark.parametrize("with_mask", [False, True])
def test_gradcheck_as_entmax_all_parameters(with_mask):
    x = randn(1, 3, 5, seed=16).requires_grad_()
    beta = torch.tensor([0.5, 1.0, 1.5], dtype=F64).view(3, 1).requires_grad_()
    gamma = torch.tensor(0.8, dtype=F64, requires_grad=True)
    delta = torch.tensor(0.9, dtype=F64, requires_grad=True)
    alpha = torch.tensor(1.4, dtype=F64, requires_grad=True)
    mask = _mask((1, 3, 5), 17) if with_mask else None
    assert torch.autograd.gradcheck(
        lambda x, a, b, g, d: sk.as_entmax(x, mask=mask, alpha=a, beta=b, gamma=g, delta=d),
        (x, alpha, beta, gamma, delta))


# ----------------------------------------------------------------------------------------
# limits and special cases of the definition
# ----------------------------------------------------------------------------------------

def test_limits():
    x = randn(10, 12, seed=18)
    with sk.use_backend("reference"):   # auto computes sk.softmax with aten: equal to rounding
        torch.testing.assert_close(sk.entmax(x, alpha=1.0), sk.softmax(x), atol=0, rtol=0)
    torch.testing.assert_close(sk.entmax(x, alpha=1 + 1e-7), torch.softmax(x, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(sk.entmax(x, alpha=2.0), sk.sparsemax(x), atol=0, rtol=0)
    torch.testing.assert_close(sk.entmax(x, alpha=1.5), sk.entmax15(x), atol=0, rtol=0)
    torch.testing.assert_close(sk.entmax(x, alpha=torch.tensor(2.0, dtype=F64)), sk.sparsemax(x))
    torch.testing.assert_close(sk.entmax(x, alpha=torch.tensor(1.5, dtype=F64)), sk.entmax15(x))
    torch.testing.assert_close(sk.entmax(x, alpha=2.0 + 1e-9), sk.sparsemax(x), atol=1e-8, rtol=0)


def test_sparsemax_closed_form():
    x = torch.tensor([-2.0, 0.0, 0.5], dtype=F64)
    torch.testing.assert_close(sk.sparsemax(x), torch.tensor([0.0, 0.25, 0.75], dtype=F64))
    assert sk.sparsemax(torch.tensor([3.0, 1.0, 0.0], dtype=F64)).tolist() == [1.0, 0.0, 0.0]


def test_sparse_outputs_have_exact_zeros():
    x = randn(8, 50, seed=19, scale=5.0)
    for p in (sk.sparsemax(x), sk.entmax15(x), sk.entmax(x, alpha=1.3), sk.as_entmax(x)):
        assert (p == 0).any(dim=-1).all()


def test_as_entmax_definition():
    x = randn(3, 10, seed=20)
    scale = 1.0 + 0.7 * math.log(10) ** 1.3
    torch.testing.assert_close(sk.as_entmax(x, alpha=1.5, beta=0.7, gamma=1.3, delta=1.0),
                               sk.entmax15(scale * x))
    torch.testing.assert_close(sk.as_entmax(x, alpha=1.3, beta=0.5, delta=0.0, n=100),
                               sk.entmax(0.5 * math.log(100) * x, alpha=1.3))
    # n defaults to the visible count of each row
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 4:] = False
    out = sk.as_entmax(x, mask=mask, beta=2.0, alpha=2.0)
    torch.testing.assert_close(out[1, :4], sk.sparsemax((1 + 2.0 * math.log(4)) * x[1, :4]))
    assert (out[1, 4:] == 0).all()
    # causal n = i + 1, per-row tensor
    n = torch.arange(1, 4, dtype=F64).view(3, 1)
    out = sk.as_entmax(x, n=n, beta=1.0, alpha=1.5)
    for i in range(3):
        torch.testing.assert_close(out[i], sk.entmax15((1 + math.log(i + 1)) * x[i]))
    # per-head beta
    xh = randn(2, 3, 4, 5, seed=21)
    beta = torch.tensor([0.2, 1.0, 3.0], dtype=F64).view(3, 1, 1)
    out = sk.as_entmax(xh, beta=beta)
    for h in range(3):
        torch.testing.assert_close(out[:, h], sk.entmax15((1 + beta[h].item() * math.log(5)) * xh[:, h]))


def test_registry_entry_runs_with_its_defaults():
    spec = registry.get("as_entmax")
    x = randn(4, 9, seed=22)
    params = {k: v for k, v in spec.params.items()}
    torch.testing.assert_close(sk.normalize(x, "as_entmax", **params), sk.as_entmax(x))
    for name in ("sparsemax", "entmax15", "entmax"):
        torch.testing.assert_close(sk.normalize(x, name), getattr(sk, name)(x))


# ----------------------------------------------------------------------------------------
# properties (hypothesis)
# ----------------------------------------------------------------------------------------

rows = st.lists(st.floats(-50, 50, allow_nan=False, width=64), min_size=1, max_size=12)
NORMALIZERS = {
    "sparsemax": lambda x, **k: sk.sparsemax(x, **k),
    "entmax15": lambda x, **k: sk.entmax15(x, **k),
    "entmax_1.2": lambda x, **k: sk.entmax(x, alpha=1.2, **k),
    "entmax_2.6": lambda x, **k: sk.entmax(x, alpha=2.6, **k),
    "entmax_tensor": lambda x, **k: sk.entmax(x, alpha=torch.tensor(1.7, dtype=F64), **k),
    "as_entmax": lambda x, **k: sk.as_entmax(x, **k),
}


@settings(max_examples=25, deadline=None)
@given(values=rows, name=st.sampled_from(sorted(NORMALIZERS)), seed=st.integers(0, 2 ** 16),
       shift=st.floats(-100, 100))
def test_properties(values, name, seed, shift):
    f = NORMALIZERS[name]
    x = torch.tensor(values, dtype=F64)
    p = f(x)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=F64), atol=1e-12, rtol=0)
    perm = torch.randperm(len(values), generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(f(x[perm]), p[perm], atol=1e-12, rtol=0)
    # every normalizer here is shift invariant (as_entmax: its scale is constant per row)
    torch.testing.assert_close(f(x + shift), p, atol=1e-9, rtol=0)


@settings(max_examples=15, deadline=None)
@given(values=rows, alpha=st.floats(1.0, 3.0))
def test_entmax_is_a_distribution_for_any_alpha(values, alpha):
    x = torch.tensor(values, dtype=F64)
    p = sk.entmax(x, alpha=alpha)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=F64), atol=1e-12, rtol=0)
    assert p.argmax() == x.argmax() or p[x.argmax()] == p.max()


# ----------------------------------------------------------------------------------------
# adversarial rows and row conventions
# ----------------------------------------------------------------------------------------

ALL = [sk.sparsemax, sk.entmax15, lambda x, **k: sk.entmax(x, alpha=1.3, **k),
       lambda x, **k: sk.entmax(x, alpha=torch.tensor(2.4, dtype=F32), **k), sk.as_entmax]


@pytest.mark.parametrize("f", ALL)
def test_extreme_values(f):
    x = torch.tensor([[1e4, -1e4, 1e4 - 0.5, 3.0], [-1e4, -1e4 + 0.3, -1e4, -1e4]], dtype=F32)
    p = f(x)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p, f(x.double()).float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, dtype=F32), atol=1e-6, rtol=0)


@pytest.mark.parametrize("f", ALL)
def test_infinities_masks_nan_and_degenerate_rows(f):
    inf = float("inf")
    x = torch.tensor([[inf, 1.0, inf, 0.0],
                      [-inf, 2.0, 1.5, -inf],
                      [-inf, -inf, -inf, -inf],
                      [float("nan"), 1.0, 2.0, 3.0],
                      [0.5, 1.0, 2.0, 0.0]], dtype=F32, requires_grad=True)
    p = f(x)
    assert p[0].tolist() == [0.5, 0.0, 0.5, 0.0]
    assert p[1, 0] == 0 and p[1, 3] == 0 and torch.isclose(p[1].sum(), torch.tensor(1.0, dtype=F32))
    torch.testing.assert_close(p[1, 1:3], f(x[1, 1:3].detach()))
    assert (p[2] == 0).all()
    assert torch.isnan(p[3]).all()
    torch.testing.assert_close(p[4], f(x[4].detach()))
    g = torch.autograd.grad(p[[0, 1, 2, 4]].pow(2).sum(), x)[0]
    assert torch.isfinite(g).all()
    assert (g[2] == 0).all() and g[1, 0] == 0 and g[1, 3] == 0


@pytest.mark.parametrize("f", ALL)
def test_masked_entries_are_exactly_zero_with_zero_gradient(f):
    x = randn(5, 8, seed=23, dtype=F32).requires_grad_()
    mask = _mask((5, 8), 24)
    mask[3] = False
    p = f(x, mask=mask)
    assert (p[~mask] == 0).all()
    assert (p[3] == 0).all()
    g = torch.autograd.grad((p * randn(5, 8, seed=25, dtype=F32)).sum(), x)[0]
    assert (g[~mask] == 0).all() and torch.isfinite(g).all()
    unmasked = f(x[0, mask[0]].detach())
    torch.testing.assert_close(p[0, mask[0]], unmasked)


@pytest.mark.parametrize("f", ALL)
def test_shapes_and_dtypes(f):
    assert f(torch.tensor([[0.3], [-2.0]], dtype=F32)).tolist() == [[1.0], [1.0]]
    assert f(torch.tensor(0.7, dtype=F32)).item() == 1.0
    assert f(torch.empty(3, 0, dtype=F32)).shape == (3, 0)
    assert f(torch.empty(0, 4, dtype=F32)).shape == (0, 4)
    x = randn(4, 10, seed=26, dtype=F32)
    for dtype in (torch.float16, torch.bfloat16):
        out = f(x.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), f(x.to(dtype).float()), atol=1e-2, rtol=0)


def test_a_row_of_a_million_entries():
    x = randn(1_000_000, seed=27, dtype=F32, scale=3.0)
    x[::1000] += 5.0
    p = sk.sparsemax(x)
    torch.testing.assert_close(p, peer.sparsemax(x, dim=-1), atol=1e-6, rtol=0)
    assert torch.isclose(p.sum(), torch.tensor(1.0, dtype=F32))
    p = sk.entmax15(x)
    torch.testing.assert_close(p, peer.entmax15(x, dim=-1), atol=1e-6, rtol=0)
    p = sk.entmax(x, alpha=1.25)
    assert torch.isfinite(p).all() and torch.isclose(p.sum(), torch.tensor(1.0, dtype=F32))
    torch.testing.assert_close(p, sk.entmax(x.double(), alpha=1.25).float(), atol=1e-6, rtol=0)
    p = sk.entmax(x, alpha=1.0)
    torch.testing.assert_close(p.double(), torch.softmax(x.double(), -1), atol=1e-12, rtol=1e-5)


def test_ties_are_treated_equally():
    x = torch.tensor([[1.0, 1.0, 1.0, -5.0], [2.0, 2.0, 0.0, 0.0]], dtype=F64)
    for f in ALL:
        p = f(x)
        assert p[0, 0] == p[0, 1] == p[0, 2] and p[0, 3] == 0
        assert p[1, 0] == p[1, 1] and p[1, 2] == p[1, 3]


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_an_alpha_past_the_scores_float_range(dtype):
    """A finite alpha beyond float32's range over float32 (or half) scores: a number raised
    "value cannot be converted to type float without overflow" (the reference's ``u`` was made
    in the scores' dtype), and a float64 tensor alpha rounded to inf gave rows of zeros where
    the kernels take it; both are the float64 scores' argmax."""
    x = torch.tensor([[0.5, 0.2, -0.3], [1.0, 3.0, 2.9]], dtype=dtype)
    want = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=dtype)
    for backend in ("reference", "numba"):
        with sk.use_backend(backend):
            torch.testing.assert_close(sk.entmax(x, alpha=1e39), want, atol=0, rtol=0)
            torch.testing.assert_close(sk.as_entmax(x, alpha=1e300), want, atol=0, rtol=0)
            alpha = torch.full((2, 1), 1e300, dtype=F64)
            torch.testing.assert_close(sk.entmax(x, alpha=alpha), want, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------------------

def test_bad_arguments():
    x = randn(3, 4)
    with pytest.raises(ValueError, match="alpha"):
        sk.entmax(x, alpha=0.9)
    with pytest.raises(ValueError, match="alpha"):
        sk.entmax(x, alpha=torch.tensor([[0.5], [1.5], [1.5]], dtype=F64))
    with pytest.raises(ValueError, match="alpha"):
        sk.entmax(x, alpha=float("nan"))
    with pytest.raises(ValueError, match="alpha"):
        sk.entmax(x, alpha=torch.full((3, 4), 1.5, dtype=F64))
    with pytest.raises(TypeError, match="alpha"):
        sk.entmax(x, alpha="1.5")
    with pytest.raises(ValueError, match="alpha"):
        sk.as_entmax(x, alpha=0.5)
    with pytest.raises(TypeError):
        sk.sparsemax(torch.arange(4))
    with pytest.raises(TypeError):
        sk.entmax15(torch.arange(4))
    with pytest.raises(ValueError, match="n"):
        sk.as_entmax(x, n=0)
    with pytest.raises(ValueError, match="beta"):
        sk.as_entmax(x, beta=float("inf"))
    with pytest.raises(ValueError, match="mask"):
        sk.sparsemax(x, mask=torch.ones(2, 4, dtype=torch.bool))
