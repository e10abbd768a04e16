"""numba sparsemax / entmax15 / entmax(alpha) against the sort- and bisection-based references."""

import pytest
import torch

import softmaxkit as sk

from ._inputs import adversarial

CASES = {
    "sparsemax": lambda x: sk.sparsemax(x),
    "entmax15": lambda x: sk.entmax15(x),
    "entmax_1.3": lambda x: sk.entmax(x, alpha=1.3),
    "entmax_3": lambda x: sk.entmax(x, alpha=3.0),
}


def _both(f, x):
    with sk.use_backend("numba"):
        fast = f(x)
    with sk.use_backend("reference"):
        ref = f(x)
    return fast, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_exact_against_sort_based_reference(name, dtype):
    x, special = adversarial(n=1500, dtype=dtype)
    fast, ref = _both(CASES[name], x)
    keep = [r for r in range(x.shape[0]) if r != special["nan"]]
    torch.testing.assert_close(fast[keep], ref[keep], rtol=0, atol=1e-6)
    assert torch.isnan(fast[special["nan"]]).all()
    assert torch.equal(fast[special["empty"]], torch.zeros(1500, dtype=dtype))


@pytest.mark.parametrize("name", ["entmax_1.3", "entmax_3"])
def test_general_alpha_against_bisection_reference(name):
    x, special = adversarial(n=800, dtype=torch.float64)
    fast, ref = _both(CASES[name], x)
    keep = [r for r in range(x.shape[0]) if r != special["nan"]]
    torch.testing.assert_close(fast[keep], ref[keep], rtol=0, atol=1e-9)


def test_long_rows_and_row_of_length_one():
    x = torch.randn(2, 200_000, dtype=torch.float64) * 2
    for name in ("sparsemax", "entmax15"):
        fast, ref = _both(CASES[name], x)
        torch.testing.assert_close(fast, ref, rtol=0, atol=1e-9)
    one = torch.randn(4, 1)
    for f in CASES.values():
        fast, ref = _both(f, one)
        assert torch.equal(fast, torch.ones(4, 1)) and torch.equal(ref, fast)


def test_per_row_alpha_tensor():
    x = torch.randn(3, 2, 50, dtype=torch.float64)
    alpha = torch.tensor([1.2, 1.5, 2.5], dtype=torch.float64).reshape(3, 1, 1)
    fast, ref = _both(lambda t: sk.entmax(t, alpha=alpha), x)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-9)


def test_gradcheck_scores_and_alpha_float64():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([[1.3], [1.7], [2.0], [2.6]], dtype=torch.float64, requires_grad=True)
    with sk.use_backend("numba"):
        assert torch.autograd.gradcheck(lambda t, a: sk.entmax(t, alpha=a), (x, alpha))
        assert torch.autograd.gradcheck(sk.sparsemax, (x,))
        assert torch.autograd.gradcheck(sk.entmax15, (x,))


def test_gradients_match_reference():
    x, special = adversarial(n=60, dtype=torch.float64)
    x = x.clone().requires_grad_()
    alpha = torch.full((10, 1), 1.6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(10, 60, dtype=torch.float64)
    grads = []
    for backend in ("numba", "reference"):
        with sk.use_backend(backend):
            grads.append(torch.autograd.grad(sk.entmax(x, alpha=alpha), (x, alpha), g))
    keep = [r for r in range(10) if r != special["nan"]]
    for fast, ref in zip(*grads):
        torch.testing.assert_close(fast[keep], ref[keep], rtol=1e-7, atol=1e-8)


def test_double_backward_float64():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([[1.3], [1.6], [2.2]], dtype=torch.float64, requires_grad=True)
    with sk.use_backend("numba"):
        assert torch.autograd.gradgradcheck(lambda t, a: sk.entmax(t, alpha=a), (x, alpha))
        assert torch.autograd.gradgradcheck(sk.sparsemax, (x,))


@pytest.mark.parametrize("alpha", [1.05, 1.3, 2.5, 4.0])
def test_double_backward_float32_is_the_references(alpha):
    """A graph of the gradient (``create_graph=True``) through the kernel: the reference's
    closed forms in float64, so the float32 gradients and second derivatives agree with the
    reference's to float32 rounding (the old alpha-gradient form was 3e-4 off at alpha = 1.05)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 30, generator=g, dtype=torch.float64) * 2).float().requires_grad_()
    a = torch.full((5, 1), alpha, requires_grad=True)
    v = torch.randn(5, 30, generator=g)
    results = []
    for backend in ("numba", "reference"):
        with sk.use_backend(backend):
            gx, ga = torch.autograd.grad((sk.entmax(x, alpha=a) * v).sum(), (x, a), create_graph=True)
            results.append((gx, ga) + torch.autograd.grad(gx.square().sum() + ga.sum(), (x, a)))
    for fast, ref in zip(*results):
        torch.testing.assert_close(fast, ref, rtol=2e-6, atol=2e-6 * float(ref.abs().max()))


# ----------------------------------------------------------------------------------------
# the row kernels of the fused path: visible prefix, in place, thresholds, p v from the support
# ----------------------------------------------------------------------------------------

ALPHAS = [2.0, 1.5, 1.3, 2.5]


def _reference_rows(x, alpha, visible):
    with sk.use_backend("reference"):
        return sk.entmax(x, mask=visible, alpha=alpha)


def _prefix_rows(dtype, seed=0):
    """Rows of 300 with a visible prefix each (0 to 300), -inf entries inside it, hostile rows."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(12, 300, generator=g, dtype=torch.float64) * 3).to(dtype)
    x[1, ::4] = float("-inf")
    x[2] = 7.0                               # ties: the support is the whole prefix
    x[3, 10] = 1e4
    x[4] = -1e9
    x[4, 5] = 0.0                            # one entry among -1e9 fills
    x[5] *= 1e-30                            # nearly equal (and denormal in float32)
    x[6, :50] = torch.finfo(dtype).max / 4
    x[6, 50:] = -torch.finfo(dtype).max / 4
    stop = torch.tensor([300, 290, 280, 1, 0, 300, 299, 64, 65, 31, 33, 150])
    # entries past the prefix hold anything (the kernel must not read them)
    x[torch.arange(300) >= stop[:, None]] = float("nan")
    return x, stop


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_in_place_rows_with_a_visible_prefix(alpha, dtype):
    from softmaxkit.kernels.cpu.sparse_functions import entmax_in_place

    x, stop = _prefix_rows(dtype)
    visible = (torch.arange(300) < stop[:, None]) & (x != float("-inf"))
    want = _reference_rows(x.double().masked_fill(~visible, 0.0), alpha, visible)
    z = x.clone()
    tau, shift, todo = entmax_in_place(z, alpha, stop)
    assert not todo.any()
    torch.testing.assert_close(z.double(), want, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-10)
    # the threshold, relative to the row maximum, rebuilds the weights on visible entries,
    # huge rows included: p = [u (x - shift) - tau]_+^(1/u)
    u = alpha - 1.0
    relative = x.masked_fill(~visible, float("-inf")) - shift.to(dtype).unsqueeze(-1)   # in the scores' dtype
    rebuilt = (u * relative.double() - tau.unsqueeze(-1)).clamp_min(0) ** (1 / u)
    keep = visible.any(-1)
    torch.testing.assert_close(rebuilt[keep], want[keep], rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-9)
    assert (tau[~keep] == 0).all() and (shift[~keep] == 0).all()


@pytest.mark.parametrize("alpha", ALPHAS)
def test_in_place_rows_flag_nan_and_plus_inf_and_leave_them(alpha):
    from softmaxkit.kernels.cpu.sparse_functions import entmax_in_place

    x = torch.randn(4, 100, dtype=torch.float64)
    x[1, 7] = float("nan")
    x[2, 9] = float("inf")
    x[3, 60] = float("nan")                  # past the prefix of row 3: ignored
    stop = torch.tensor([100, 100, 100, 50])
    z = x.clone()
    _, _, todo = entmax_in_place(z, alpha, stop)
    assert todo.tolist() == [False, True, True, False]
    assert torch.equal(z[1:3].isnan(), x[1:3].isnan()) and torch.equal(z[2], x[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_attend_equals_weights_times_values(alpha, dtype):
    from softmaxkit.kernels.cpu.sparse_functions import entmax_attend

    x, stop = _prefix_rows(dtype, seed=1)
    heads, rows = 3, 4
    x = x.reshape(heads, rows, 300).contiguous()
    stop = stop.reshape(heads, rows)
    v = torch.randn(heads, 300, 16, dtype=dtype, generator=torch.Generator().manual_seed(2))
    visible = (torch.arange(300) < stop.unsqueeze(-1)) & (x != float("-inf"))
    p = _reference_rows(x.double().masked_fill(~visible, 0.0), alpha, visible)
    want = torch.matmul(p, v.double())
    out, tau, shift, todo = entmax_attend(x, v, alpha, stop)
    assert not todo.any() and out.dtype == dtype
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-10)
    vs = v[:, :, :0].contiguous()   # d = 0: nothing to write
    assert entmax_attend(x, vs, alpha, stop)[0].shape == (heads, rows, 0)


@pytest.mark.parametrize("op", ["sparsemax", "entmax15", "entmax"])
def test_masked_rows_run_on_the_kernels_and_equal_the_reference(op):
    """A bool mask no longer sends sparsemax / entmax to the sort-based reference: masked
    entries become -inf scores of the kernel; NaN and +inf under the mask are ignored, rows
    with nothing visible give zeros, a visible +inf row is spliced from the reference."""
    from softmaxkit.kernels import dispatch

    g = torch.Generator().manual_seed(7)
    x = (torch.randn(64, 400, generator=g, dtype=torch.float64) * 2).requires_grad_()
    mask = torch.rand(64, 400, generator=g) > 0.4
    mask[3] = False
    mask[5, :] = True
    with torch.no_grad():
        x[4, ~mask[4]] = float("nan")
        x[6, ~mask[6]] = float("inf")
        x[5, 17] = float("inf")              # visible +inf: the reference's row
    fn = {"sparsemax": sk.sparsemax, "entmax15": sk.entmax15,
          "entmax": lambda t, mask: sk.entmax(t, mask=mask, alpha=1.7)}[op]
    params = {"alpha": 1.7} if op == "entmax" else {}
    assert dispatch.plan(op, x, -1, mask, **params) == "numba"
    gy = torch.randn(64, 400, generator=g, dtype=torch.float64)
    res = []
    for backend in ("auto", "reference"):
        with sk.use_backend(backend):
            y = fn(x, mask=mask)
            res.append((y, torch.autograd.grad(y, x, gy)[0]))
    (y, gx), (ry, rgx) = res
    keep = torch.ones(64, dtype=torch.bool)
    keep[5] = False                          # +inf row: compared with NaN allowed
    torch.testing.assert_close(y[keep], ry[keep], rtol=0, atol=1e-10)
    torch.testing.assert_close(y[5], ry[5], rtol=0, atol=1e-10, equal_nan=True)
    assert torch.equal(y[3], torch.zeros(400, dtype=torch.float64))
    assert (y[~mask] == 0).all()
    torch.testing.assert_close(gx[keep], rgx[keep], rtol=0, atol=1e-9)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_tile_grad_equals_autograd_of_the_reference(alpha):
    from softmaxkit.kernels.cpu.sparse_functions import entmax_in_place, entmax_tile_grad

    x, stop = _prefix_rows(torch.float64, seed=3)
    x = x[[0, 1, 2, 5, 7, 8, 9, 10, 11, 3, 4]].contiguous()   # finite-magnitude rows, then tiny prefixes
    stop = stop[[0, 1, 2, 5, 7, 8, 9, 10, 11, 3, 4]]
    visible = (torch.arange(300) < stop[:, None]) & (x != float("-inf"))
    xr = x.masked_fill(~visible, 0.0).requires_grad_()
    gy = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    want = _reference_rows(xr, alpha, visible)
    (want_dx,) = torch.autograd.grad(want, xr, gy)
    tau, shift, _ = entmax_in_place(x.clone(), alpha, stop)
    z, dp = x.clone(), gy.clone()
    entmax_tile_grad(z, dp, alpha, tau, shift, stop)
    torch.testing.assert_close(z, want.detach(), rtol=0, atol=1e-9)
    torch.testing.assert_close(dp, want_dx, rtol=0, atol=1e-9)


def test_kernels_leave_torch_thread_count_alone():
    """numba's OpenMP launches reset the thread count torch reads; the kernel wrappers put it back
    (else a user's torch.set_num_threads(1) silently becomes an oversubscribed team)."""
    from softmaxkit.kernels.cpu.sparse_functions import entmax_attend, entmax_tile_grad

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        x = torch.randn(64, 500, requires_grad=True)
        with sk.use_backend("numba"):
            y = sk.entmax15(x, mask=torch.rand(64, 500) > 0.2)
            assert torch.get_num_threads() == 1
            y.sum().backward()
            assert torch.get_num_threads() == 1
        z = torch.randn(2, 32, 100)
        _, tau, shift, _ = entmax_attend(z, torch.randn(2, 100, 8), 1.5)
        assert torch.get_num_threads() == 1
        entmax_tile_grad(z, torch.randn(2, 32, 100), 1.5, tau, shift)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("alpha", [1.01, 1.05, 1.07, 1.2, 1.5, 1.9])
def test_float32_alpha_gradient_is_as_accurate_as_the_references(alpha):
    """Audit 2026-12-03: below alpha = 2 the kernel's alpha gradient divided a difference of
    nearly equal sums of the float32 p by (alpha - 1)^2: 1e-4 relative error at alpha = 1.05,
    where the reference (the expm1 form, now the kernel's too) has 2e-6."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 50, generator=gen) * 2
    upstream = torch.randn(16, 50, generator=gen)
    errors = _float32_alpha_gradient_errors(x, upstream, alpha, lambda exact: 1e-3)
    assert errors["numba"] <= 3 * errors["reference"] + 1e-7, errors


def _float32_alpha_gradient_errors(x, upstream, alpha, floor):
    """The largest relative error (denominators at least ``floor(exact)``) of the gradient in a
    float32 per-row alpha, numba and reference, against the float64 reference's."""
    rows = x.shape[0]
    exact_alpha = torch.full((rows, 1), alpha, dtype=torch.float64, requires_grad=True)
    with sk.use_backend("reference"):
        exact, = torch.autograd.grad(sk.entmax(x.double(), alpha=exact_alpha), exact_alpha, upstream.double())
    errors = {}
    for backend in ("numba", "reference"):
        a = torch.full((rows, 1), alpha, requires_grad=True)
        with sk.use_backend(backend):
            got, = torch.autograd.grad(sk.entmax(x, alpha=a), a, upstream)
        errors[backend] = ((got.double() - exact).abs() / exact.abs().clamp_min(floor(exact))).max().item()
    return errors


@pytest.mark.parametrize("alpha, offset, scale", [(2.0, 1.0, 1e-7), (2.0, 1.0, 1e-5), (5.0, 0.0, 10.0)])
def test_float32_alpha_gradient_from_alpha_two_is_as_accurate_as_the_references(alpha, offset, scale):
    """Sweep 2026-12-05: from alpha = 2 on, the kernel's alpha gradient took sum(p) as 1, which
    the float32 output meets only to its rounding, and the terms then did not sum to 0: at
    alpha = 2 on near-flat rows of 500 its error was 1.7e-3 relative (the reference's 5e-8), at
    alpha = 5 on peaked rows 2.6e-7 (4.7e-9)."""
    gen = torch.Generator().manual_seed(0)
    x = (offset + torch.randn(16, 500, generator=gen, dtype=torch.float64) * scale).float()
    upstream = torch.randn(16, 500, generator=gen)
    errors = _float32_alpha_gradient_errors(x, upstream, alpha, lambda exact: 1e-3 * exact.abs().max().item())
    assert errors["numba"] <= 3 * errors["reference"] + 1e-7, errors


@pytest.mark.parametrize("alpha", [1.3, 1.5])
def test_a_float64_alpha_over_float32_scores_gets_its_gradient_in_float64(alpha):
    """Sweep 2026-12-05: the kernel rounded the alpha gradient to the scores' float32 before
    autograd took it back to the float64 alpha (5e-8 relative off the reference, which keeps
    such an alpha in float64; at alpha = 2 on near-flat rows 4.9x the reference's error)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 500, generator=gen) * 2
    upstream = torch.randn(16, 500, generator=gen)
    got = {}
    for backend in ("numba", "reference"):
        a = torch.full((16, 1), alpha, dtype=torch.float64, requires_grad=True)
        with sk.use_backend(backend):
            got[backend], = torch.autograd.grad(sk.entmax(x, alpha=a), a, upstream)
    torch.testing.assert_close(got["numba"], got["reference"], rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_alpha_gradient_ignores_an_infinite_incoming_gradient_at_probability_zero(backend):
    """Audit 2026-12-03: the reference's alpha gradient was inf * 0 = NaN there (the kernel's 0):
    an entry at p = 0 is constant in alpha."""
    x = torch.tensor([[3.0, 1.0, -2.0, 0.5]] * 2, dtype=torch.float64)
    alpha = torch.full((2, 1), 1.5, dtype=torch.float64, requires_grad=True)
    leaf = x.clone().requires_grad_()
    with sk.use_backend(backend):
        out = sk.entmax(leaf, alpha=alpha)
    assert out[0, 2] == 0
    upstream = torch.tensor([[0.3, -0.2, float("inf"), 0.1]] * 2, dtype=torch.float64)
    grad_x, grad_alpha = torch.autograd.grad(out, (leaf, alpha), upstream)
    assert torch.isfinite(grad_alpha).all() and torch.isfinite(grad_x).all()
    finite = upstream.masked_fill(torch.isinf(upstream), 0.0)
    with sk.use_backend(backend):
        expected, = torch.autograd.grad(sk.entmax(x, alpha=alpha), alpha, finite)
    torch.testing.assert_close(grad_alpha, expected)
