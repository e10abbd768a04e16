"""Kernels on every finite input: hostile rows, the issue-12 reproducers, the flag protocol."""

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import softmaxkit as sk
from softmaxkit import algorithms
from softmaxkit.kernels import dispatch
from softmaxkit.kernels.cpu import softmax as softmax_kernels

F32, F64 = torch.float32, torch.float64
KINDS = ("normal", "big", "min", "max", "minmax", "fill", "denormal", "posinf", "neginf", "nan", "huge_fill")
BAD_KINDS = ("min", "max", "minmax", "fill", "denormal", "posinf", "neginf", "nan", "huge_fill", "big")


def _row(kind, n, dtype, g):
    fi = torch.finfo(dtype)
    r = torch.randn(n, generator=g, dtype=F64).to(dtype)
    if kind == "big":
        r = r * 1e12
    elif kind == "min":
        r[:] = fi.min
    elif kind == "max":
        r[:] = fi.max
    elif kind == "minmax":
        r[::2] = fi.max
        r[1::2] = fi.min
    elif kind == "fill":                         # scores.masked_fill(~mask, -1e9)
        r[torch.rand(n, generator=g) < 0.6] = -1e9
    elif kind == "huge_fill":
        r[:] = -1e9 if dtype == F32 else -1e17
    elif kind == "denormal":
        r = r * fi.tiny / 8
    elif kind == "posinf":
        r[n // 2] = float("inf")
    elif kind == "neginf":
        r[:] = float("-inf")
    elif kind == "nan":
        r[n // 3] = float("nan")
    return r


def _tol(dtype):
    return {"rtol": 2e-5, "atol": 1e-6} if dtype == F32 else {"rtol": 1e-10, "atol": 1e-13}


def _call(op, x, param):
    if op in ("softmax", "log_softmax"):
        return getattr(sk, op)(x, temperature=param)
    if op == "entmax":
        return sk.entmax(x, alpha=param)
    if op == "softmax_topk":
        return sk.softmax_topk(x, min(param, x.shape[-1]))
    return getattr(sk, op)(x)


def _same(a, b, dtype):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for u, v in zip(a, b):
        if u.is_floating_point():
            torch.testing.assert_close(u, v, equal_nan=True, **_tol(dtype))
        else:
            assert torch.equal(u, v)


def _rows_of(out, keep):
    return tuple(u[keep] for u in out) if isinstance(out, tuple) else out[keep]


def _exact(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for u, v in zip(a, b):
        assert torch.equal(u.nan_to_num(7.0), v.nan_to_num(7.0))


OPS = st.sampled_from([
    ("softmax", st.sampled_from([1.0, 3.0, 1e-3, 1e-30, 1e20])),
    ("log_softmax", st.sampled_from([1.0, 0.5, 1e-30, 1e25])),
    ("logsumexp", st.just(None)),
    ("sparsemax", st.just(None)),
    ("entmax15", st.just(None)),
    ("entmax", st.sampled_from([1.05, 1.3, 3.0, 4.0])),
    ("softmax_topk", st.sampled_from([1, 3, 40])),
])


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kernels_equal_the_reference_on_hostile_batches(threads, data):
    op, params = data.draw(OPS)
    param = data.draw(params)
    dtype = data.draw(st.sampled_from([F32, F64]))
    n = data.draw(st.integers(1, 40))
    kinds = data.draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.stack([_row(k, n, dtype, g) for k in kinds])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)   # no kernel raised
            with sk.use_backend("numba"):
                got = _call(op, x, param)
            with sk.use_backend("auto"):
                auto = _call(op, x, param)
        with sk.use_backend("reference"):
            want = _call(op, x, param)
    finally:
        torch.set_num_threads(before)
    _same(got, want, dtype)
    _same(auto, want, dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op,param", [("softmax", 3.0), ("log_softmax", 1e-30), ("logsumexp", None),
                                      ("sparsemax", None), ("entmax15", None), ("entmax", 1.3),
                                      ("entmax", 4.0), ("softmax_topk", 5)])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_one_bad_row_leaves_the_good_rows_exact(threads, op, param, dtype):
    g = torch.Generator().manual_seed(1)
    good = torch.randn(48, 300, generator=g, dtype=dtype) * 3
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with sk.use_backend("numba"):
            alone = _call(op, good, param)
            for kind in BAD_KINDS:
                x = good.clone()
                x[20] = _row(kind, 300, dtype, g)
                out = _call(op, x, param)
                keep = torch.ones(48, dtype=torch.bool)
                keep[20] = False
                _exact(_rows_of(out, keep), _rows_of(alone, keep))
                with sk.use_backend("reference"):
                    _same(out, _call(op, x, param), dtype)
    finally:
        torch.set_num_threads(before)


# ---- the reproducers of issue 12 --------------------------------------------------------

@pytest.mark.parametrize("backend", ["numba", "auto"])
def test_entmax_after_a_minus_1e9_row(backend):
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    x[50] = -1e9
    with sk.use_backend(backend):
        p = sk.entmax(x, alpha=1.3)
    torch.testing.assert_close(p.sum(-1), torch.ones(64))
    with sk.use_backend("reference"):
        torch.testing.assert_close(p, sk.entmax(x, alpha=1.3), **_tol(F32))


@pytest.mark.parametrize("backend", ["numba", "auto"])
@pytest.mark.parametrize("algorithm", ["three_pass", "two_pass", "online"])
def test_softmax_temperature_after_a_finfo_min_row(backend, algorithm):
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    x[50] = torch.finfo(torch.float32).min
    with sk.use_backend(backend, algorithm=algorithm):
        p = sk.softmax(x, temperature=3.0)
    torch.testing.assert_close(p.sum(-1), torch.ones(64))
    with sk.use_backend("reference"):
        torch.testing.assert_close(p, sk.softmax(x, temperature=3.0))


@pytest.mark.parametrize("fill", [-1e9, torch.finfo(torch.float32).min])
@pytest.mark.parametrize("op", ["sparsemax", "entmax15"])
def test_sparse_rows_under_a_mask_fill_sum_to_one(fill, op):
    x = torch.randn(8, 100, generator=torch.Generator().manual_seed(2))
    mask = torch.rand(8, 100, generator=torch.Generator().manual_seed(3)) < 0.3
    x = x.masked_fill(~mask, fill)
    x[3] = fill
    with sk.use_backend("numba"):
        p = getattr(sk, op)(x)
    torch.testing.assert_close(p.sum(-1), torch.ones(8))
    with sk.use_backend("reference"):
        torch.testing.assert_close(p, getattr(sk, op)(x))


@pytest.mark.parametrize("dtype,scale", [(F32, 1e8), (F32, 1e30), (F64, 1e17), (F64, 1e300)])
@pytest.mark.parametrize("alpha", [1.3, 3.0])
def test_entmax_large_scores_do_not_raise(dtype, scale, alpha):
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(4), dtype=dtype) * scale
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with sk.use_backend("numba"):
            p = sk.entmax(x, alpha=alpha)
    with sk.use_backend("reference"):
        torch.testing.assert_close(p, sk.entmax(x, alpha=alpha), **_tol(dtype))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("temperature", [1e-12, 1e-40, 1e30])
@pytest.mark.parametrize("backend", ["numba", "auto"])
def test_softmax_temperature_extremes(op, temperature, backend):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5)) * 100
    x[1] *= 1e8
    with sk.use_backend(backend):
        got = getattr(sk, op)(x, temperature=temperature)
    with sk.use_backend("reference"):
        want = getattr(sk, op)(x, temperature=temperature)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", ["reference", "numba", "auto"])
@pytest.mark.parametrize("algorithm", ["three_pass", "two_pass", "online"])
def test_rows_whose_every_entry_overflows_over_the_temperature(op, backend, algorithm):
    """finfo.min (or -1e38) over T < 1 overflows to -inf at every entry of the row: that
    row is still a row of (equal or finite) scores, as float64 sees it, not an empty row."""
    info = torch.finfo(F32)
    x = torch.randn(9, 40, generator=torch.Generator().manual_seed(8))
    x[1] = info.min
    x[3] = -1e38
    x[5] = info.min
    x[5, 7] = info.min * 0.999        # one entry above the rest: all the mass
    x[7] = info.min
    x[7, ::3] = float("-inf")         # masked entries stay masked
    want = getattr(sk, op)(x.double(), temperature=0.5)
    xr = x.clone().requires_grad_(True)
    with sk.use_backend(backend, algorithm=algorithm):
        got = getattr(sk, op)(xr, temperature=0.5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    (g,) = torch.autograd.grad(got.masked_fill(got == float("-inf"), 0).sum(), xr)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("alpha", [3.0, 5.0, 10.0])
def test_float32_entmax_reference_solves_in_float64(alpha):
    x = torch.randn(16, 200, generator=torch.Generator().manual_seed(6), dtype=F64) * 3
    with sk.use_backend("reference"):
        p32 = sk.entmax(x.float(), alpha=alpha)
        p64 = sk.entmax(x.float().double(), alpha=alpha)
    assert float((p32.double() - p64).abs().max()) < 1e-6


@pytest.mark.parametrize("alpha", [10.0, 100.0, 1e4])
def test_entmax_of_large_alpha_on_scores_closer_than_its_rounding(alpha):
    """With alpha - 1 >= 1 the reference solves for ``theta - 1/u``: in ``1 + u (z - theta)``,
    ``theta`` sits next to ``1/u`` and scores 1e-30 apart came out uniform at alpha = 100 (exact,
    and the kernel: ``[0.505, 0, 0, 0.495, 0]``), so one row gave two answers by batch size."""
    x = torch.tensor([[6.6135e-31, 2.6692e-31, 6.1677e-32, 6.2132e-31, -4.5191e-31]], dtype=F64)
    with sk.use_backend("reference"):
        reference = sk.entmax(x, alpha=alpha)
    with sk.use_backend("numba"):
        kernel = sk.entmax(x, alpha=alpha)
    torch.testing.assert_close(reference, kernel, rtol=1e-12, atol=1e-15)
    if alpha == 100.0:
        assert reference[0, 1] == reference[0, 2] == reference[0, 4] == 0
        torch.testing.assert_close(reference[0, [0, 3]], torch.tensor([0.5053315708518632, 0.4946684291481368],
                                                                      dtype=F64))
    wide = torch.randn(8, 300, generator=torch.Generator().manual_seed(9), dtype=F64) * 1e-30
    with sk.use_backend("reference"):
        reference = sk.entmax(wide, alpha=alpha)
    with sk.use_backend("numba"):
        kernel = sk.entmax(wide, alpha=alpha)
    torch.testing.assert_close(reference, kernel, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", ["numba", "auto"])
def test_logsumexp_gradient_with_create_graph_on_fill_and_nan_rows(backend):
    """The kernel's create_graph backward formed exp(x - lse) from the rounded lse: each entry of
    a row of finfo.min (or finfo.max) fills got gradient 1, not 1/n, and a NaN row got 0."""
    x = torch.full((1024, 16), torch.finfo(F64).min, dtype=F64)
    x[1] = torch.finfo(F64).max
    x[2, :] = 1e30
    x[2, 0] = -1e30
    x[3, 5] = float("nan")
    x[4:] = torch.randn(1020, 16, generator=torch.Generator().manual_seed(2), dtype=F64)
    xr = x.clone().requires_grad_()
    with sk.use_backend(backend):
        (g,) = torch.autograd.grad(sk.logsumexp(xr).sum(), xr, create_graph=True)
    x_ref = x.clone().requires_grad_()
    with sk.use_backend("reference"):
        (expected,) = torch.autograd.grad(sk.logsumexp(x_ref).sum(), x_ref)
    torch.testing.assert_close(g, expected, equal_nan=True)
    assert torch.isnan(g[3]).all() and g.requires_grad
    torch.testing.assert_close(g[0], torch.full((16,), 1 / 16, dtype=F64))


def test_two_pass_softmax_beyond_its_exact_range():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(7))
    x[1] *= 1e10
    x[2] = torch.finfo(torch.float32).min
    x[3, :10] = torch.finfo(torch.float32).max
    x.requires_grad_()
    p = algorithms.two_pass_softmax(x)
    with sk.use_backend("reference"):
        torch.testing.assert_close(p, sk.softmax(x))
    p.sum().backward()
    assert not bool(torch.isnan(x.grad).any())


def test_a_kernel_that_raises_leaves_no_unwritten_row(monkeypatch):
    """A kernel stopping half-way: its unfinished rows are recomputed by the reference."""
    real = softmax_kernels.normalize_rows

    def half_then_raise(x, out, lse, special, scale, algorithm, mode):
        real(x[:3], out[:3], lse[:3], special[:3], scale, algorithm, mode)
        out[3:] = float("nan")
        raise ZeroDivisionError("simulated failure in a worker thread")

    monkeypatch.setattr(softmax_kernels, "normalize_rows", half_then_raise)
    x = torch.randn(8, 50, generator=torch.Generator().manual_seed(8), requires_grad=True)
    with sk.use_backend("numba"), pytest.warns(RuntimeWarning, match="softmax.*ZeroDivisionError"):
        p = sk.softmax(x)
    with sk.use_backend("reference"):
        want = sk.softmax(x)
    torch.testing.assert_close(p, want)
    g = torch.randn(8, 50, generator=torch.Generator().manual_seed(9))
    (got_grad,) = torch.autograd.grad(p, x, g)
    (want_grad,) = torch.autograd.grad(want, x, g)
    torch.testing.assert_close(got_grad, want_grad)


# ---- softmax_topk: one tie order on both paths --------------------------------------------

@pytest.mark.parametrize("log", [False, True])
def test_topk_tie_order_is_the_same_on_kernel_and_reference(log):
    fn = sk.log_softmax_topk if log else sk.softmax_topk
    x = torch.zeros(2, 300)
    x[0, [250, 5, 100]] = 3.0                 # equal scores
    x[1] = -1e4                               # probabilities that underflow to 0 ...
    x[1, 299] = 0.0
    x[1, 200:210] = -200.0                    # ... below higher (also underflowing) scores
    for k in (1, 4, 12, 300):
        with sk.use_backend("numba"):
            got = fn(x, k)
        with sk.use_backend("reference"):
            want = fn(x, k)
        assert torch.equal(got[1], want[1]), k
        torch.testing.assert_close(got[0], want[0])
        values = got[0]
        # decreasing values, equal values by increasing index
        assert bool((values[:, 1:] <= values[:, :-1]).all())
        same = values[:, 1:] == values[:, :-1]
        assert bool((got[1][:, 1:] > got[1][:, :-1])[same].all())


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_topk_ties_between_minus_inf_and_underflowing_scores(log, dtype):
    """A k-th score of ``-inf`` (or of ``-finfo.max``) ties with the ``-inf`` entries left out:
    the smallest indices among them are taken, as the reference does (the kernel returned the
    selected scores' own indices)."""
    fn = sk.log_softmax_topk if log else sk.softmax_topk
    inf = float("inf")
    x = torch.tensor([[0.0, -inf, -inf, -800.0, -801.0, -inf, 0.5],
                      [0.0, -inf, -torch.finfo(dtype).max, -inf, -inf, 1.0, -inf]], dtype=dtype)
    for k in (3, 4, 5, 7):
        with sk.use_backend("numba"):
            got = fn(x, k)
        with sk.use_backend("reference"):
            want = fn(x, k)
        assert torch.equal(got[1], want[1]), (k, got[1], want[1])
        torch.testing.assert_close(got[0], want[0])


@pytest.mark.parametrize("backend", ["numba", "auto"])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_softmax_gradient_at_minus_inf_entries_of_a_nan_row(backend, dtype):
    """The reference gives a ``-inf`` entry gradient 0, as a masked one, even in a row that a NaN
    makes NaN; the kernel's backward gave ``0 * NaN``."""
    x = torch.randn(3, 300000 if backend == "auto" else 50, dtype=dtype)
    x[0, 4], x[0, 6], x[1, 9] = float("nan"), float("-inf"), float("-inf")
    g = torch.randn_like(x)

    def grad(name):
        leaf = x.clone().requires_grad_()
        with sk.use_backend(name):
            return torch.autograd.grad(sk.softmax(leaf), leaf, g)[0]

    got, want = grad(backend), grad("reference")
    assert got[0, 6] == 0 and got[1, 9] == 0
    torch.testing.assert_close(got, want, equal_nan=True)


# ---- the aten path of auto ------------------------------------------------------------------

def test_auto_calls_aten_where_no_kernel_measurably_wins():
    x = torch.randn(4, 100)
    assert dispatch.plan("softmax", x, -1, None, temperature=1.0) in ("aten", "numba")
    with sk.use_backend("reference"):
        assert dispatch.plan("softmax", x, -1, None) == "reference"


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("dtype", [F64, torch.float16])
def test_aten_path_matches_the_reference_with_masks_and_gradients(op, dtype):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(5, 3, 40, generator=g, dtype=F64)
    x[0, 1] = float("-inf")                   # nothing visible
    x[1, 0, 3] = float("inf")
    x[2, 2, :7] = float("-inf")               # some -inf entries
    x[3, 1, 5] = float("nan")
    mask = torch.rand(5, 1, 40, generator=g) < 0.7
    mask[4] = False                           # fully masked rows
    for m in (None, mask):
        for dim in (-1, 1):
            mm = m if dim == -1 or m is None else m.expand(5, 3, 40)
            outs = []
            for backend in ("auto", "reference"):
                xi = x.to(dtype).requires_grad_()
                with sk.use_backend(backend):
                    kw = {"keepdim": True} if op == "logsumexp" else {"temperature": 0.7}
                    y = getattr(sk, op)(xi, dim=dim, mask=mm, **kw)
                gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(11), dtype=F64).to(dtype)
                (grad,) = torch.autograd.grad(y, xi, gy)
                outs.append((y, grad))
            tol = {"rtol": 1e-3, "atol": 1e-3} if dtype == torch.float16 else {}
            torch.testing.assert_close(outs[0][0], outs[1][0], equal_nan=True, **tol)
            torch.testing.assert_close(outs[0][1], outs[1][1], equal_nan=True, **tol)


@pytest.mark.parametrize("center", [0.0, 3e4, 9e5, -9e5])
def test_two_pass_float32_keeps_its_precision_at_large_scores(center):
    """``two_pass`` reduces ``x`` itself (no row maximum first): past ``|x| = 2^15`` its ``n ln2``
    split no longer gave exact products, 5e-6 relative error at scores near 9e5 (1e-7 for
    the other algorithms); the reduction now takes exact products by FMA."""
    gen = torch.Generator().manual_seed(0)
    x = (center + torch.randn(3, 5000, generator=gen, dtype=F64)).to(F32)
    truth = torch.softmax(x.double(), -1)
    with sk.use_backend("numba", algorithm="two_pass"):
        p = sk.softmax(x)
    big = truth > 1e-4
    assert ((p.double() - truth).abs() / truth)[big].max() < 3e-7


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp", "sparsemax", "entmax15", "entmax"])
def test_a_kernel_output_can_be_modified_in_place_as_torchs_own(op):
    """Audit 2026-12-03: the kernels' autograd Functions returned a reshape of their output, a
    view made inside a custom Function, so ``p.mul_(2)`` raised at once (where the reference
    and torch's ops allow it). Now the in-place op works, without a gradient as with one; with
    one, the backward then refuses the modified output, as torch.softmax's does."""
    x = torch.randn(3, 40, 300)
    with dispatch.use_backend("numba"):
        out = getattr(sk, op)(x)
        expected = out * 2
        torch.testing.assert_close(out.mul_(2), expected)
        leaf = x.clone().requires_grad_()
        out = getattr(sk, op)(leaf)
        out.mul_(2)   # (raised "a view ... created inside a custom Function")
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.softmax(x.clone().requires_grad_(), -1).mul_(2).sum().backward()


# Found by the hostile sweep of 2026-12-04 (evening).

@pytest.mark.parametrize("shape", [(8, 4), (300, 512), (2, 300000)], ids=["small", "kernel", "long"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_a_row_holding_a_nan_has_a_nan_gradient_at_every_visible_entry(op, shape):
    """The reference gave 0 at entries of probability 0 in a NaN row (a ``-1e9`` fill whose
    ``exp`` underflowed, a ``+inf`` entry standing in as a constant), aten and the kernels NaN
    throughout; now every backend gives NaN at every visible entry of the row, 0 at hidden
    ones, and leaves the other rows alone."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    x[::2, 0], x[::2, 1], x[::2, 2] = float("inf"), float("nan"), -1e9
    x[1::2, 2] = -1e9
    mask = torch.ones(shape[-1], dtype=torch.bool)
    mask[3] = False
    for kwargs in ({}, {"mask": mask}):
        grads = {}
        for backend in ("reference", "numba", "auto"):
            leaf = x.clone().requires_grad_()
            with sk.use_backend(backend):
                out = getattr(sk, op)(leaf, **kwargs)
            grads[backend], = torch.autograd.grad(out, leaf, torch.ones_like(out))
        for backend, grad in grads.items():
            hidden = ~mask if kwargs else torch.zeros_like(mask)
            assert grad[::2][:, ~hidden].isnan().all(), backend
            assert grad[::2][:, hidden].eq(0).all(), backend
            assert not grad[1::2].isnan().any(), backend
            torch.testing.assert_close(grad[1::2], grads["reference"][1::2])


@pytest.mark.parametrize("n", [1 << 18, 1 << 20])
@pytest.mark.parametrize("op", ["log_softmax", "softmax"])
def test_long_peaked_float32_row_gradient_is_as_accurate_as_the_reference(op, n):
    """A long float32 row dominated by one entry: the gradient there carries the whole error of
    the row's sum. The kernel's backward summed the row in one running float32 sum, 43 ulps of
    sum(g) off at 2^20 entries (the reference: 1); it now sums blocks and adds them in float64."""
    g = torch.Generator().manual_seed(0)
    x, upstream = torch.randn(1, n, generator=g) * 1e4, torch.randn(1, n, generator=g)
    leaf64 = x.double().requires_grad_()
    truth, = torch.autograd.grad(getattr(torch, op)(leaf64, -1), leaf64, upstream.double())
    errors = {}
    for backend in ("reference", "numba"):
        leaf = x.clone().requires_grad_()
        with sk.use_backend(backend):
            out = getattr(sk, op)(leaf)
        got, = torch.autograd.grad(out, leaf, upstream)
        errors[backend] = float((got.double() - truth).abs().max())
    # at least one ulp of sum(g), the scale of the error at the top entry
    floor = float(torch.finfo(F32).eps * upstream.double().sum().abs())
    assert errors["numba"] <= 2 * max(errors["reference"], floor), errors
