"""A NaN gradient arriving at an output that is a constant of the row (a ``-inf`` log-probability,
a weight that is exactly 0) is dropped by every backend, as the reference drops it.

Found by a hostile audit (2026-12-02): the entropy ``where(isfinite(logp), p logp, 0)`` sends NaN
back to ``-inf`` log-probabilities; the numba log-softmax and softmax backward kernels (``auto``
on large inputs) summed it into the row (every gradient of the row NaN), while sparsemax's and
entmax's reference spread a NaN from entries off the support over the row.
"""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels import dispatch
from softmaxkit.normalizers.softmax import logsumexp_reference

BACKENDS = ["reference", "numba"]


def _grads(fn, x, backend, upstream):
    leaf = x.clone().requires_grad_()
    with sk.use_backend(backend):
        out = fn(leaf)
    out.backward(upstream(out.detach()))
    return leaf.grad


def _rows(dtype, n=6, rows=4):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(1), dtype=dtype)
    x[0, :2] = -math.inf
    x[1, :3] = -30.0
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_log_softmax_entropy_gradient_is_finite(backend, dtype):
    # auto: 2048 rows take the numba backward kernel
    x = _rows(dtype, 512, 2048) if backend == "auto" else _rows(dtype)
    leaf = x.clone().requires_grad_()
    with sk.use_backend(backend):
        logp = sk.log_softmax(leaf)
    entropy = -torch.where(torch.isfinite(logp), logp.exp() * logp, torch.zeros_like(logp)).sum()
    entropy.backward()
    assert torch.isfinite(leaf.grad).all()
    assert leaf.grad[0, :2].eq(0).all()
    want = x.clone().requires_grad_()
    logp = sk.log_softmax(want.double()) if dtype == torch.float32 else sk.log_softmax(want)
    (-torch.where(torch.isfinite(logp), logp.exp() * logp, torch.zeros_like(logp)).sum()).backward()
    torch.testing.assert_close(leaf.grad, want.grad, rtol=1e-4, atol=1e-6)


def _nan_where_zero(out):
    g = torch.where(out == 0, torch.full_like(out, math.nan), torch.ones_like(out))
    g[..., -1] = 2.0
    return g


@pytest.mark.parametrize("fn", [sk.softmax, sk.sparsemax, sk.entmax15, lambda x: sk.entmax(x, alpha=2.5)],
                         ids=["softmax", "sparsemax", "entmax15", "entmax2.5"])
def test_nan_gradient_at_zero_weights_is_dropped_alike(fn):
    x = _rows(torch.float64)
    got = {backend: _grads(fn, x, backend, _nan_where_zero) for backend in BACKENDS}
    for backend in BACKENDS:
        assert torch.isfinite(got[backend]).all(), backend
    torch.testing.assert_close(got["numba"], got["reference"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [sk.sparsemax, sk.entmax15, lambda x: sk.entmax(x, alpha=1.3),
                                lambda x: sk.entmax(x, alpha=3.0)],
                         ids=["sparsemax", "entmax15", "entmax1.3", "entmax3"])
def test_nan_gradient_on_the_support_stays_on_the_support(fn, dtype):
    """A NaN incoming gradient at an entry of positive weight makes that row's gradient NaN on
    the support and leaves exactly 0 off it (a weight that is exactly 0 passes no gradient),
    on every backend and row length (the sparse references spread it over the whole row, where
    the kernels kept it on the support)."""
    for n in (6, 3000):
        x = torch.randn(4, n, generator=torch.Generator().manual_seed(2), dtype=dtype) * 3
        x[:, 0] = -math.inf
        x[:, 1] = -1e4

        def nan_at_top(out):
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
            g[2, out[2].argmax()] = math.nan
            return g

        got = {backend: _grads(fn, x, backend, nan_at_top) for backend in BACKENDS + ["auto"]}
        with sk.use_backend("reference"):
            support = fn(x) > 0
        for backend, grad in got.items():
            assert torch.isnan(grad[2][support[2]]).all(), backend
            assert (grad[2][~support[2]] == 0).all(), backend
            assert torch.isfinite(grad[[0, 1, 3]]).all(), backend
            torch.testing.assert_close(grad, got["reference"], equal_nan=True, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("alpha", [2.5, 3.0])
def test_entmax_bisection_runs_on_meta_tensors(alpha):
    out = sk.entmax(torch.empty(4, 8, device="meta"), alpha=alpha)
    assert out.shape == (4, 8) and out.device.type == "meta"


# An infinite gradient at a probability of 0: torch.special.entr(p) = -p log p has derivative
# -log(p) - 1 = +inf there. aten's softmax backward (the auto backend's lane) and the
# log-sum-exp backward took 0 * inf = NaN into the row (audit 2026-12-02).
def _entropy_grad(backend, x, mask=None, create_graph=False, **kwargs):
    leaf = x.clone().requires_grad_()
    with sk.use_backend(backend):
        p = sk.softmax(leaf, mask=mask, **kwargs)
    (grad,) = torch.autograd.grad(torch.special.entr(p).sum(), leaf, create_graph=create_graph)
    return grad


def _scores(rows, n, dtype, seed=2):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    x[1::3, 1] = -math.inf   # not the first row: aten's NaN rows are found by their first entry
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
@pytest.mark.parametrize("shape", [(2, 5), (3000, 40), (600, 1000)], ids=["small", "many-rows", "long"])
@pytest.mark.parametrize("case", ["-inf", "mask", "temperature"])
def test_softmax_entropy_gradient_at_zero_probabilities(case, shape, backend, dtype):
    x = _scores(*shape, dtype)
    mask, kwargs = None, {}
    if case == "mask":
        mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) > 0.3
        mask[:, 0] = True
    elif case == "temperature":
        kwargs["temperature"] = 0.5
    got = _entropy_grad(backend, x, mask, **kwargs)
    want = _entropy_grad("reference", x.double(), mask, **kwargs)
    assert torch.isfinite(got).all()
    assert got[1::3, 1].eq(0).all()
    tol = {torch.float32: 1e-4, torch.float64: 1e-10}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_softmax_entropy_gradient_on_huge_pages():
    x = _scores(8192, 1024, torch.float32)   # 32 MiB: auto's aten softmax on huge pages
    got = _entropy_grad("auto", x)
    assert torch.isfinite(got).all() and got[1::3, 1].eq(0).all()
    torch.testing.assert_close(got.double(), _entropy_grad("reference", x.double()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "numba"])
def test_softmax_entropy_gradient_keeps_its_graph(backend):
    x = _scores(64, 16, torch.float64)
    got = _entropy_grad(backend, x, create_graph=True)
    assert got.requires_grad and torch.isfinite(got).all()
    torch.testing.assert_close(got.detach(), _entropy_grad("reference", x))


@pytest.mark.parametrize("backend", ["auto", "numba"])
def test_softmax_batched_gradients_drop_infinite_upstream_at_zeros(backend):
    x = _scores(4, 8, torch.float64)
    upstream = torch.ones(3, 4, 8, dtype=torch.float64)
    upstream[:, 1::3, 1] = math.inf
    upstream[1] *= 2

    def grads(b):
        leaf = x.clone().requires_grad_()
        with sk.use_backend(b):
            p = sk.softmax(leaf)
        return torch.autograd.grad(p, leaf, upstream, is_grads_batched=True)[0]

    got = grads(backend)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, grads("reference"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
@pytest.mark.parametrize("rows", [3, 3000])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_logsumexp_non_finite_upstream_skips_constant_entries(value, rows, backend, dtype):
    x = _scores(rows, 12, dtype)
    x[2] = -math.inf   # a row with nothing visible: its log-sum-exp is a constant
    leaf = x.clone().requires_grad_()
    with sk.use_backend(backend):
        lse = sk.logsumexp(leaf, dim=-1)
    upstream = torch.ones_like(lse)
    upstream[1::3] = value
    lse.backward(upstream)
    grad = leaf.grad
    assert grad[1::3, 1].eq(0).all() and grad[2].eq(0).all()
    assert (grad[1::3, 2:] == value).all() if value == math.inf else grad[1::3, 2:].isnan().all()
    others = torch.ones(rows, dtype=torch.bool)
    others[1::3] = False
    others[2] = False
    torch.testing.assert_close(grad[others], torch.softmax(x[others].double(), -1).to(dtype))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("backend", ["auto", "numba"])
@pytest.mark.parametrize("shape", [(5, 40), (3000, 40), (600, 1000)], ids=["few", "many", "long"])
def test_entropy_gradient_at_underflowed_probabilities_matches_the_reference(shape, backend, threads):
    """A visible score whose probability underflows to exactly 0 (a -1e9 fill beside ordinary
    scores) gets entr's infinite derivative too: the reference's quotient took ``inf * 0 = NaN``
    into the row, the kernels dropped it. Every backend now drops it (the limit: ``p_j`` times a
    derivative of order ``log p_j`` is 0), one bad row among good rows, on 1 and 2 threads."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    x[1] = torch.finfo(torch.float32).min
    x[2, ::2] = -1e9
    x[3, 0] = math.inf
    x[4, 1] = math.nan
    x[0, 3] = -math.inf
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = _entropy_grad(backend, x)
        want = _entropy_grad("reference", x)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.isfinite(got[2]).all() and got[2, ::2].eq(0).all()
    assert torch.isnan(got[4]).all() and torch.isfinite(got[torch.arange(shape[0]) != 4]).all()


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("bad", ["nan", "+inf", "all -inf"])
@pytest.mark.parametrize("shape", [(1, 40), (6, 40), (64, 4096)])
def test_small_aten_lane_with_gradient_sends_bad_rows_to_the_reference(bad, log, shape):
    """A small input recording a gradient takes aten with one scan of its output: a row aten
    leaves NaN (a NaN score, a +inf, nothing visible) goes to the full path, which gives the
    reference's values and gradient; rows of zero probability pass no gradient, even an
    infinite one; the good rows are untouched."""
    fn = sk.log_softmax if log else sk.softmax
    x = torch.randn(*shape, dtype=torch.float64) * 3
    r = shape[0] // 2
    x[r, :3] = {"nan": float("nan"), "+inf": float("inf"), "all -inf": float("-inf")}[bad]
    if bad == "all -inf":
        x[r] = float("-inf")
    x[-1, -1] = float("-inf")   # a zero probability (in another row when there are several)
    g = torch.randn(shape, dtype=torch.float64)
    g[-1, -1] = float("inf")
    x.requires_grad_()
    out = fn(x)
    (dx,) = torch.autograd.grad(out, x, g)
    with sk.use_backend("reference"):
        ref = fn(x)
        (dref,) = torch.autograd.grad(ref, x, g)
    torch.testing.assert_close(out, ref, equal_nan=True)
    torch.testing.assert_close(dx, dref, equal_nan=True)
    if shape[0] > 1:
        assert torch.isfinite(dx[-1]).all()


@pytest.mark.parametrize("backend", ["auto", "numba"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 7), (9, 4096), (9, 40000), (2, 1 << 18)])
def test_log_softmax_gradient_where_finite_scores_overflow_to_minus_inf(shape, dtype, backend):
    """finfo.max beside finfo.min in one row: ``x - max`` overflows to -inf, so the output is
    -inf at a finite score. That entry is not masked: the reference passes its incoming
    gradient and keeps it in the row's sum; only a -inf score passes none. The aten lane
    (one scan up to 2^18 entries, torch's amin above) and the numba kernel (which leaves
    such a row to the reference; float32 rows of 2^18 take it under auto too) agree."""
    fi = torch.finfo(dtype)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, dtype=dtype, generator=gen)
    x[-1, 0], x[-1, 1], x[-1, 2] = fi.max, fi.min, float("-inf")
    g = torch.randn(shape, dtype=dtype, generator=gen)
    xa, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    with sk.use_backend(backend):
        ya = sk.log_softmax(xa)
        yf = sk.log_softmax(x)   # the forward alone (the lane's kernel call)
    torch.testing.assert_close(yf, ya.detach())
    with sk.use_backend("reference"):
        yr = sk.log_softmax(xr)
    torch.testing.assert_close(ya, yr)
    (da,) = torch.autograd.grad(ya, xa, g)
    (dr,) = torch.autograd.grad(yr, xr, g)
    # (the finfo.max entry's gradient is g - sum(g): summation order shows at n = 40000)
    torch.testing.assert_close(da, dr, rtol=1e-5, atol=fi.eps * shape[1] ** 0.5 * 10)
    assert da[-1, 1] == g[-1, 1] and da[-1, 2] == 0


_UPSTREAM_PATTERNS = {   # name: (index, value) pairs written into a random upstream gradient
    "nan on the support": [((2, 5), math.nan)],
    "+inf on the support": [((2, 5), math.inf)],
    "-inf on the support": [((2, 5), -math.inf)],
    "+inf and -inf on the support": [((2, 5), math.inf), ((2, 4), -math.inf)],
    "inf at zero probabilities": [((2, 0), math.inf), ((2, 1), math.inf)],
    "nan at zero probabilities": [((2, 0), math.nan), ((2, 1), math.nan)],
    "nan in a row with nothing visible": [((3, 2), math.nan)],
    # (times finfo.max) -max/2 at the row's top entry puts <p, g> near -p_top max/2, so
    # aten's g_1 - <p, g> overflows at the zero probability alone, out of reach of a look at
    # the first column
    "finfo.max at a zero probability": [("top", -0.5), ((2, 1), 1.0)],
}


@pytest.mark.parametrize("shape, large_outputs, dead_row", [
    ((4, 6), False, False), ((4, 3000), False, False), ((4, 3000), True, False), ((4, 70000), False, False),
    ((300, 1000), False, False), ((4, 3000), False, True), ((4, 70000), False, True)],
    ids=["tiny", "small", "huge-page-lane", "above-2^18", "many-rows", "small-full-path", "above-2^18-full-path"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_non_finite_upstream_gradients_match_the_reference(op, dtype, shape, large_outputs, dead_row, monkeypatch):
    """A NaN or an infinity arriving anywhere in a row: every backend and lane (the small aten
    lane's one scan, the hooks above 2^18 entries, the kernel, the large-output lane, and,
    with a row of nothing visible, the full path) gives the reference's gradient. An entry of
    probability 0 (a -inf score, an underflow) is a constant of its row: its softmax gradient
    is exactly 0 even where the row's <p, g> is not finite (aten's 0 * inf is NaN there, and
    the numba kernel took an infinite <p, g> for a finite one); a -inf score's log-softmax
    gradient is 0 (aten's 0 - 0 * NaN)."""
    if large_outputs:
        from softmaxkit.kernels import memory
        monkeypatch.setattr(memory, "MIN_BYTES", 0)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(shape, generator=gen, dtype=dtype) * 3
    x[:, 0] = -math.inf
    x[:, 1] = -1e4   # underflows: probability exactly 0, log-probability finite
    if dead_row:
        x[3] = -math.inf
    for name, entries in _UPSTREAM_PATTERNS.items():
        if name == "nan in a row with nothing visible" and not dead_row:
            continue
        g = torch.randn(shape, generator=gen, dtype=dtype)
        for index, value in entries:
            if name.startswith("finfo.max"):
                index, value = ((2, int(x[2].argmax())) if index == "top" else index), value * torch.finfo(dtype).max
            g[index] = value
        got = {backend: _grads(getattr(sk, op), x, backend, lambda out: g) for backend in BACKENDS + ["auto"]}
        for backend in ("numba", "auto"):
            if (name.startswith("finfo.max") and backend == "auto" and op == "softmax"
                    and (x.numel() > dispatch.SERIAL_SCAN_NUMEL or large_outputs)):
                # Known gap: above 2^18 entries (and on the large-output lane) aten's softmax
                # runs with no scan for zero probabilities, and its hook reads one column, so
                # a finite incoming gradient near finfo.max that overflows g_j - <p, g> at a
                # zero probability alone leaves that entry NaN (the reference's is 0).
                continue
            torch.testing.assert_close(got[backend], got["reference"], equal_nan=True, rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"{backend}, {name}: {m}")
        zero_grad = got["reference"][2, :2] if op == "softmax" else got["reference"][2, :1]
        assert (zero_grad == 0).all(), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
@pytest.mark.parametrize("shape", [(1, 32000), (64, 4096), (3, 5, 700)])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_logsumexp_non_finite_upstream_skips_underflowed_entries(value, shape, backend, dtype):
    """A finite score whose ``exp`` underflows to 0 (a ``-1e9`` fill) is a constant of its
    log-sum-exp, as a ``-inf`` one: an infinite or NaN incoming gradient leaves it exactly 0
    (the reference's sum backward gave it ``inf * 0 = NaN``, where the kernels and aten's lane
    gave 0)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=dtype) * 3
    x[..., 3] = -1e9
    x[..., 5] = -math.inf
    leaf = x.clone().requires_grad_()
    with sk.use_backend(backend):
        lse = sk.logsumexp(leaf, dim=-1)
    upstream = torch.full_like(lse, value)
    (grad,) = torch.autograd.grad(lse, leaf, upstream)
    assert grad[..., 3].eq(0).all() and grad[..., 5].eq(0).all()
    assert (grad[..., 6:] == value).all() if value == math.inf else grad[..., 6:].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 32000), (64, 4096), (3, 5, 700)])
def test_kernel_logsumexp_lane_matches_the_reference(shape, dtype):
    """The lane's kernel log-sum-exp with a gradient (``auto`` where the kernel wins): value,
    gradient (finite, infinite and NaN incoming ones), a graph of the gradient, and the rows
    it must leave to the full path (nothing visible, ``+inf``, NaN)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5), dtype=dtype) * 3
    x[..., 2] = -1e9
    x[..., 4] = -math.inf
    leaf, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = dispatch._kernel_logsumexp(leaf)
    want = logsumexp_reference(ref, dim=-1)
    assert type(got.grad_fn).__name__ == "_KernelLogSumExpBackward"
    torch.testing.assert_close(got, want)
    upstream = torch.randn_like(want)
    upstream.view(-1)[0] = math.inf
    if upstream.numel() > 1:
        upstream.view(-1)[-1] = math.nan
    (g_got,) = torch.autograd.grad(got, leaf, upstream, create_graph=False, retain_graph=True)
    (g_want,) = torch.autograd.grad(want, ref, upstream, retain_graph=True)
    torch.testing.assert_close(g_got, g_want, equal_nan=True)
    (h_got,) = torch.autograd.grad(got, leaf, torch.ones_like(got), create_graph=True)
    (h_want,) = torch.autograd.grad(want, ref, torch.ones_like(want), create_graph=True)
    torch.testing.assert_close(h_got, h_want)
    for bad in (math.nan, math.inf, "all -inf"):
        y = x.clone()
        if bad == "all -inf":
            y.view(-1, shape[-1])[0] = -math.inf
        else:
            y.view(-1, shape[-1])[0, 7] = bad
        assert dispatch._kernel_logsumexp(y.requires_grad_()) is None


def test_kernel_logsumexp_gradcheck():
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(6), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(dispatch._kernel_logsumexp, (x,))
    assert torch.autograd.gradgradcheck(dispatch._kernel_logsumexp, (x,))


@pytest.mark.parametrize("backend", ["numba", "auto"])
@pytest.mark.parametrize("dtype, top", [(torch.float32, 100.0), (torch.float64, 720.0)])
def test_log_softmax_infinite_upstream_at_subnormal_probabilities(backend, dtype, top):
    """A row whose other probabilities are subnormal (one score 100 above them in float32, 720
    in float64) and an infinite incoming gradient: the reference's ``g_j - e^{y_j} sum g`` is
    ``-inf`` there, and the kernel's backward, whose fast ``e^y`` flushed a subnormal to 0, gave
    ``0 * inf = NaN`` (hostile sweep, 2026-12-04)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4096, generator=g, dtype=dtype) * 3
    x[0, 1] = top
    upstream = torch.randn(64, 4096, generator=g, dtype=dtype)
    upstream[:, -1] = float("inf")
    got = _grads(lambda t: sk.log_softmax(t, dim=-1), x, backend, lambda out: upstream)
    expected = _grads(lambda t: sk.log_softmax(t, dim=-1), x, "reference", lambda out: upstream)
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got[torch.isinf(got)], expected[torch.isinf(expected)])
    assert torch.isinf(got[0, 2:]).sum() > 1000   # the case is exercised: subnormal entries got -inf
    finite = torch.isfinite(expected)
    torch.testing.assert_close(got[finite], expected[finite])


@pytest.mark.parametrize("dtype, gap", [(torch.float32, 103.5), (torch.float64, 744.0)])
@pytest.mark.parametrize("op", ["softmax", "logsumexp"])
def test_infinite_upstream_where_the_quotient_underflows(op, dtype, gap):
    """An entry whose ``exp`` is a nonzero subnormal but whose probability ``exp / sum`` rounds
    to 0 (ten equal scores, one ``gap`` below): an infinite incoming gradient there passes
    nothing, on every backend. The reference, which dropped it only where ``exp`` was exactly
    0, made the softmax's whole row NaN (the quotient's backward, ``inf * 0``) and passed
    ``inf`` to the log-sum-exp's entry, where the kernels give 0 (found by a hostile sweep,
    2026-12-04)."""
    x = torch.zeros(3, 11, dtype=dtype)
    x[:, -1] = -gap
    upstream = torch.ones(3, 11, dtype=dtype) if op == "softmax" else torch.ones(3, dtype=dtype)

    def fn(t):
        return sk.softmax(t) if op == "softmax" else sk.logsumexp(t)

    with sk.use_backend("reference"):
        assert fn(x)[0, -1] == 0 if op == "softmax" else True
    if op == "softmax":
        upstream[:, -1] = math.inf
    else:
        upstream[:] = math.inf   # d lse / dx_last = p_last * inf
    grads = {b: _grads(fn, x, b, lambda out: upstream) for b in BACKENDS + ["auto"]}
    for backend, grad in grads.items():
        assert not grad.isnan().any(), backend
        assert (grad[:, -1] == 0).all(), backend
        if op == "softmax":
            torch.testing.assert_close(grad, grads["numba"], atol=torch.finfo(dtype).eps, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.7, 3.0])
def test_entmax_infinite_upstream_on_the_support(alpha, dtype, threads):
    """One infinite incoming gradient on the support: the alpha gradient is that infinity
    (the numba backward's row sums gave ``inf - inf = NaN``), and the scores' gradient is the
    reference's (past alpha = 2 its leave-one-out form gave the smallest weight ``+inf``, the
    reference ``inf - inf``); rows of finite gradients beside it are unchanged."""
    x = torch.tensor([[1.0, 0.9, 0.5, -3.0, 0.7], [0.0, 0.3, -5.0, -6.0, -7.0]] * 3, dtype=dtype)
    upstream = torch.randn(6, 5, generator=torch.Generator().manual_seed(7), dtype=dtype)
    upstream[0, 0] = math.inf
    upstream[1, 0] = -math.inf
    results = {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for backend in BACKENDS:
            xi = x.clone().requires_grad_()
            a = torch.full((6, 1), alpha, dtype=dtype, requires_grad=True)
            with sk.use_backend(backend):
                out = sk.entmax(xi, alpha=a)
            results[backend] = torch.autograd.grad(out, (xi, a), upstream)
    finally:
        torch.set_num_threads(before)
    (dx_ref, da_ref), (dx, da) = results["reference"], results["numba"]
    assert torch.isinf(da_ref[:2]).all()
    torch.testing.assert_close(da, da_ref, equal_nan=True)
    torch.testing.assert_close(dx, dx_ref, equal_nan=True)


def _one_hot_row_and_huge_upstream(shape, dtype, d=-1):
    """Scores whose row 1 along ``d`` is one entry and underflowed zeros, and an incoming gradient
    of -0.9 finfo.max at that entry and +0.9 finfo.max at a zero: ``g_j - <y, g>`` overflows
    to +inf at the zero alone, where aten's backward gives ``0 * inf = NaN`` (the row's other
    entries, and its first one, stay finite), and the reference gives 0."""
    big = torch.finfo(dtype).max
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4), dtype=dtype).movedim(d, -1)
    x[1, 1:] = -1e4 if dtype == torch.float32 else -1e6
    g = torch.zeros_like(x)
    g[1, 0], g[1, 5] = -0.9 * big, 0.9 * big
    return x.movedim(-1, d), g.movedim(-1, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("case", ["lane", "huge pages", "mask", "temperature", "dim 0"])
def test_a_huge_finite_gradient_at_a_zero_probability_passes_nothing(case, threads, dtype):
    """Three threads: a count the crossover table does not list, so auto takes aten with hooks;
    ``huge pages``: outputs of 32 MiB and more (aten on huge pages, its own autograd Function)."""
    shape = {"huge pages": (2048, 4096 if dtype == torch.float32 else 2048)}.get(case, (8, 50000))
    d = 0 if case == "dim 0" else -1
    x, g = _one_hot_row_and_huge_upstream(shape if d == -1 else shape[::-1], dtype, d)
    kwargs = {"mask": torch.ones(shape[-1], dtype=torch.bool)} if case == "mask" else {}
    if case == "temperature":
        kwargs["temperature"] = 2.0
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        grads = {}
        for backend in ("auto", "reference"):
            leaf = x.clone().requires_grad_()
            with sk.use_backend(backend):
                grads[backend], = torch.autograd.grad(sk.softmax(leaf, dim=d, **kwargs), leaf, g)
    finally:
        torch.set_num_threads(before)
    got, want = grads["auto"], grads["reference"]
    assert not got.isnan().any()
    row = got.movedim(d, -1)[1]
    assert row[1:].eq(0).all()
    # (a kernel's probability 1 may be 1 - eps: then its entry is eps |g|, not 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=4 * torch.finfo(dtype).eps * 0.9 * torch.finfo(dtype).max)


@pytest.mark.parametrize("dtype, gap", [(torch.float32, 88.0), (torch.float64, 709.0)])
@pytest.mark.parametrize("shape", [(1, 32000), (64, 4096), (3, 5, 700)])
@pytest.mark.parametrize("dead_row", [False, True])   # True: the numba Function of the full path
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_logsumexp_infinite_upstream_reaches_a_subnormal_probability(backend, dead_row, shape, dtype, gap):
    """An entry ``gap`` below its row's maximum has a subnormal probability, which the kernels'
    fast ``exp`` flushes to 0: under an infinite incoming gradient the reference's ``p * inf`` is
    ``inf`` there, and the kernels' backward gave 0 (found by a fuzz of auto against the
    reference, 2026-12-04). A row with nothing visible sends the call to the full path."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=dtype)
    x[..., 3] = x.amax(-1) - gap   # exp a subnormal, and so its quotient by a sum below 6e4
    if dead_row:
        x.view(-1, shape[-1])[-1] = -math.inf
    upstream = torch.full(shape[:-1], math.inf, dtype=dtype)
    got = _grads(lambda t: sk.logsumexp(t, dim=-1), x, backend, lambda out: upstream)
    want = _grads(lambda t: sk.logsumexp(t, dim=-1), x, "reference", lambda out: upstream)
    live = got.reshape(-1, shape[-1])[:-1] if dead_row else got
    assert (live[..., 3] == math.inf).all()
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype, gap", [(torch.float32, 103.5), (torch.float64, 744.0)])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_infinite_upstream_elsewhere_leaves_an_underflowed_quotient_zero(backend, dtype, gap):
    """An entry whose ``exp`` is a subnormal but whose probability rounds to 0 (ten equal scores,
    one ``gap`` below) is a constant of its row: an infinite incoming gradient at another entry
    gives it 0, as the kernels and aten's lane do; the reference passed it ``e_j * inf`` through
    the row's sum (NaN; found by a fuzz of auto against the reference, 2026-12-04)."""
    x = torch.zeros(3, 11, dtype=dtype)
    x[:, -1] = -gap
    upstream = torch.ones(3, 11, dtype=dtype)
    upstream[:, 0] = math.inf
    grad = _grads(lambda t: sk.softmax(t, dim=-1), x, backend, lambda out: upstream)
    assert (grad[:, -1] == 0).all()
    assert grad[:, 0].isnan().all() and (grad[:, 1:-1] == -math.inf).all()


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dtype, gap", [(torch.float32, 100.0), (torch.float64, 740.0)])
def test_log_softmax_infinite_upstream_where_exp_y_underflows_but_the_probability_does_not(dtype, gap, rows):
    """1000 equal maxima and one score ``gap`` below: its ``e^{x - max}`` is a subnormal, its
    ``e^y = e^{x - max} / 1000`` rounds to 0. Under an infinite incoming gradient the reference's
    ``p * inf`` is ``inf`` there (``-inf`` in ``dx``); the numba backward took ``0 * inf = NaN``
    (found by a fuzz of auto against the reference, 2026-12-04)."""
    x = torch.zeros(rows, 1001, dtype=dtype)
    x[:, -1] = -gap
    upstream = torch.ones(rows, 1001, dtype=dtype)
    upstream[:, 0] = math.inf
    got = _grads(lambda t: sk.log_softmax(t, dim=-1), x, "numba", lambda out: upstream)
    want = _grads(lambda t: sk.log_softmax(t, dim=-1), x, "reference", lambda out: upstream)
    assert (want[:, -1] == -math.inf).all()
    torch.testing.assert_close(got, want, equal_nan=True)
