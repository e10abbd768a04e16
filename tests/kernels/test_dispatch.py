"""kernels.dispatch: backend names, nesting, threads, and which inputs reach a kernel."""

import threading

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels import dispatch
from softmaxkit.kernels.cpu import functions


def test_unknown_backend_lists_the_names():
    with pytest.raises(ValueError, match="'reference', 'numba', 'triton', 'auto'"):
        with sk.use_backend("cuda"):
            pass
    with pytest.raises(ValueError, match="algorithm must be one of"):
        with sk.use_backend("numba", algorithm="fast"):
            pass


def test_nesting_and_restoring():
    assert dispatch.current_backend() == "auto"
    with sk.use_backend("reference"):
        with sk.use_backend("numba"):
            assert dispatch.current_backend() == "numba"
        assert dispatch.current_backend() == "reference"
    assert dispatch.current_backend() == "auto"


def test_choice_is_per_thread():
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def worker():
        with sk.use_backend("reference"):
            inside.set()
            release.wait(5)
            seen["worker"] = dispatch.current_backend()

    t = threading.Thread(target=worker)
    t.start()
    inside.wait(5)
    seen["main"] = dispatch.current_backend()
    release.set()
    t.join()
    assert seen == {"worker": "reference", "main": "auto"}


def _chooses_kernel(op, x, backend, **kw):
    with sk.use_backend(backend):
        return dispatch.plan(op, x, kw.pop("dim", -1), kw.pop("mask", None), **kw) in ("numba", "triton")


def test_covered_inputs():
    big = torch.randn(4, dispatch.AUTO_MIN_NUMEL // 4)
    small = torch.randn(2, 8)
    assert _chooses_kernel("sparsemax", big, "auto")
    assert not _chooses_kernel("sparsemax", small, "auto")        # too small for auto
    assert _chooses_kernel("softmax", small, "numba")             # forced
    assert _chooses_kernel("softmax", big.double(), "numba")
    assert not _chooses_kernel("softmax", big, "reference")
    assert not _chooses_kernel("softmax", big, "triton")          # CPU tensor: no Triton


@pytest.mark.parametrize("case", ["transposed", "dim0", "mask", "float16", "tensor_temperature",
                                  "alpha_near_one", "integer", "not_a_tensor"])
def test_uncovered_inputs_go_to_the_reference(case):
    x = torch.randn(64, 64)
    op, kw = "softmax", {}
    if case == "transposed":
        x = x.t()
    elif case == "dim0":
        kw["dim"] = 0
    elif case == "mask":
        kw["mask"] = torch.ones(64, 64, dtype=torch.bool)
    elif case == "float16":
        x = x.half()
    elif case == "tensor_temperature":
        kw["temperature"] = torch.tensor(2.0)
    elif case == "alpha_near_one":
        op, kw = "entmax", {"alpha": 1.01}
    elif case == "integer":
        x = torch.ones(64, 64, dtype=torch.long)
    else:
        x = [[1.0, 2.0]]
    assert not _chooses_kernel(op, x, "numba", **kw)


def test_public_functions_route_through_the_dispatch(monkeypatch):
    calls = []
    for name in ("softmax", "forward_only"):   # with and without a gradient to record
        original = getattr(functions, name)
        monkeypatch.setattr(functions, name, lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    x = torch.randn(8, 300)
    with sk.use_backend("numba"):
        p = sk.softmax(x)
        sk.softmax(x, mask=x > 0)        # masked: reference
        sk.softmax(x.t(), dim=0)         # not the last contiguous axis: reference
    assert calls == [1]
    with sk.use_backend("reference"):
        torch.testing.assert_close(p, sk.softmax(x))
        assert sk.normalize(x, "softmax").shape == x.shape


def test_reference_errors_still_raised_under_numba():
    with sk.use_backend("numba"):
        with pytest.raises(ValueError, match="temperature"):
            sk.softmax(torch.randn(3, 4), temperature=-1.0)
        with pytest.raises(ValueError, match="alpha"):
            sk.entmax(torch.randn(3, 4), alpha=0.5)
        with pytest.raises(ValueError):
            sk.softmax(torch.randn(3, 4), dim=5)


def test_thread_count_follows_torch():
    import threading

    import numba

    from softmaxkit.kernels.cpu import _pool_thread_count, sync_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert sync_threads() == 1 and numba.get_num_threads() == 1 == _pool_thread_count()
        torch.set_num_threads(2)
        expected = min(2, numba.config.NUMBA_NUM_THREADS)
        assert sync_threads() == expected and numba.get_num_threads() == expected == _pool_thread_count()
        seen = []

        def in_another_thread():   # numba's count is per thread: the fast read must be too
            torch.set_num_threads(1)
            seen.append((sync_threads(), numba.get_num_threads(), _pool_thread_count()))

        worker = threading.Thread(target=in_another_thread)
        worker.start()
        worker.join()
        assert seen == [(1, 1, 1)]
        assert numba.get_num_threads() == expected == _pool_thread_count()
    finally:
        torch.set_num_threads(before)
        sync_threads()


@pytest.mark.parametrize("backend", ["numba", "auto"])
@pytest.mark.parametrize("shape", [(5, 0), (0, 0), (2, 3, 0)])
def test_empty_normalized_axis_under_every_backend(backend, shape):
    x = torch.randn(shape)
    with sk.use_backend(backend):
        for fn in (sk.softmax, sk.log_softmax, sk.sparsemax, sk.entmax15):
            assert fn(x).shape == x.shape
        assert sk.softmax(x, temperature=3.0).shape == x.shape
        assert sk.entmax(x, alpha=1.3).shape == x.shape
        assert sk.logsumexp(x).shape == x.shape[:-1]
        assert sk.logsumexp(x, keepdim=True).shape == x.shape[:-1] + (1,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fill", [-1e9, 1e4, "min"])
def test_aten_logsumexp_gradient_is_the_softmax(dtype, fill):
    # the aten path (here a mask and a transposed input) must not take aten's backward
    # exp(x - lse) with lse rounded (1 instead of 1/n for a -1e9 or finfo.min row)
    fill = torch.finfo(dtype).min if fill == "min" else fill
    x = torch.full((3, 6), fill, dtype=dtype)
    x[1] = torch.arange(6, dtype=dtype)
    mask = torch.tensor([True] * 5 + [False])
    for kw, xin in (({"mask": mask}, x), ({"dim": 0}, x.t())):
        xa = xin.clone().requires_grad_(True)
        xr = xin.clone().requires_grad_(True)
        with sk.use_backend("auto"):
            ga, = torch.autograd.grad(sk.logsumexp(xa, **kw).sum(), xa)
        with sk.use_backend("reference"):
            gr, = torch.autograd.grad(sk.logsumexp(xr, **kw).sum(), xr)
        torch.testing.assert_close(ga, gr)
        assert float(gr.sum()) == pytest.approx(3.0)


def test_aten_logsumexp_double_backward():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, False, True, True])
    assert torch.autograd.gradgradcheck(lambda t: sk.logsumexp(t, mask=mask), (x,))
    assert torch.autograd.gradgradcheck(lambda t: sk.logsumexp(t.t(), dim=0), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("parallel_scan", [False, True])
def test_log_softmax_lane_gradient_at_minus_inf_entries(monkeypatch, dtype, parallel_scan):
    """The aten lane's log-softmax (below the huge-page size) finds its -inf outputs (which
    must pass no gradient and stay out of the row sums) and its NaN rows with one numba scan
    (on every thread from scan.PARALLEL_NUMEL entries), then hooks the output; aten's backward
    runs. Either way the gradient is the reference's, and double backward and vmap hold.
    (The numba backward through an autograd Function took 5-9% longer on 1024 x 1000 and
    16384 x 128, float32 and float64, 2026-12-03.)"""
    from softmaxkit.kernels.cpu import scan
    monkeypatch.setattr(scan, "PARALLEL_NUMEL", 0 if parallel_scan else 1 << 18)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 3, 40, generator=g, dtype=dtype) * 5
    x[1, 2, :13] = float("-inf")
    x[4, 0, 39] = float("-inf")
    gy = torch.randn(x.shape, generator=g, dtype=dtype)
    outs = []
    for backend in ("auto", "reference"):
        xi = x.clone().requires_grad_()
        with sk.use_backend(backend):
            y = sk.log_softmax(xi)
        outs.append((y, torch.autograd.grad(y, xi, gy)[0]))
    assert outs[0][0].grad_fn.name() == "LogSoftmaxBackward0"
    torch.testing.assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])
    assert (outs[0][1][1, 2, :13] == 0).all()
    xd = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sk.log_softmax, (xd,))
    assert torch.autograd.gradgradcheck(sk.log_softmax, (xd,))
    torch.testing.assert_close(torch.vmap(sk.log_softmax)(x), torch.log_softmax(x, -1))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_long_float32_rows_take_the_kernel_and_keep_every_row_exact(op, threads):
    """Rows of LONG_FLOAT32_ROW entries or more go to the numba kernel under auto (blockwise
    sums: the probabilities sum to 1 far closer than aten's 1e-4); the rows the kernel leaves
    to the reference (nothing visible, NaN, +inf) among ordinary ones come out as it has them."""
    n = dispatch.LONG_FLOAT32_ROW
    x = torch.randn(6, n, generator=torch.Generator().manual_seed(3)) * 4
    x[1] = float("-inf")
    x[2, 7] = float("nan")
    x[3, 11] = float("inf")
    x[4, : n // 2] = -1e9
    x[5, ::3] = torch.finfo(torch.float32).min
    assert dispatch.plan(op, x) == "numba" and dispatch.plan(op, x[:1]) == "numba"
    fn = getattr(sk, op)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for grad in (False, True):
            xi = x.clone().requires_grad_(grad)
            out = fn(xi)
            with sk.use_backend("reference"):
                expected = fn(x.double())
            torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6, equal_nan=True)
            if op == "softmax":
                sums = out.double().sum(-1)
                assert (sums[[0, 3, 4, 5]] - 1).abs().max() < 1e-5 and sums[1] == 0
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_lane_gradient_of_a_row_with_an_infinite_score(monkeypatch, rows, op, dtype):
    """Where auto takes the kernel with a gradient (its forward, then a backward that reads
    only the output), a row whose maximum is +inf has the limit as its output (equal weights
    on the +inf entries) and a zero gradient. Nothing in the output tells that row from an
    ordinary one, so the kernel's forward reports it and the call takes the full path (the
    backward from the output gave y (g - <y, g>) there). A row with nothing visible stays on
    the kernel's path (its output, all 0 or all -inf, passes no gradient)."""
    monkeypatch.setattr(dispatch, "_wins", lambda *args: True)
    monkeypatch.setattr(dispatch, "_ONE_ROW_WINS", True)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(rows, 5000, generator=g, dtype=dtype) * 3
    x[0, [3, 40]] = float("inf")
    gy = torch.randn(x.shape, generator=g, dtype=dtype)
    fn = getattr(sk, op)

    def value_and_grad(x, backend):
        xi = x.clone().requires_grad_()
        with sk.use_backend(backend):
            y = fn(xi)
        return y, torch.autograd.grad(y, xi, gy[: len(x)])[0]

    (y, grad), (want_y, want_grad) = value_and_grad(x, "auto"), value_and_grad(x, "reference")
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(grad, want_grad)
    assert (grad[0] == 0).all()
    if rows > 1:
        x[0] = float("-inf")
        (y, grad), (want_y, want_grad) = value_and_grad(x, "auto"), value_and_grad(x, "reference")
        assert y.grad_fn.name().startswith("_KernelSoftmax")
        torch.testing.assert_close(y, want_y)
        torch.testing.assert_close(grad, want_grad)
        assert (grad[0] == 0).all()


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp", "sparsemax", "entmax15"])
@pytest.mark.parametrize("backend", ["numba", "auto"])
def test_batched_gradients_through_the_kernels(op, backend):
    """``is_grads_batched=True`` (vectorised jacobian / hessian) runs the backward under vmap,
    where a kernel cannot read the gradient's address: the kernels' backward then takes its
    torch formula (it raised "Batching rule not implemented for aten::detach")."""
    fn = getattr(sk, op)
    x = torch.randn(300, 60, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    with sk.use_backend(backend):
        y = fn(x)
    v = torch.randn((3,) + y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
    (batched,) = torch.autograd.grad(y, x, v, is_grads_batched=True)
    with sk.use_backend("reference"):
        y_ref = fn(x)
    for i in range(3):
        (one,) = torch.autograd.grad(y_ref, x, v[i], retain_graph=True)
        torch.testing.assert_close(batched[i], one)
    with sk.use_backend(backend):
        jac = torch.autograd.functional.jacobian(fn, x[:2].detach(), vectorize=True)
    assert torch.isfinite(jac).all()


def test_long_float32_rows_along_another_axis_skip_aten():
    """A float32 row of 2^18 entries or more takes the kernel on the last axis (aten sums a
    row in one running float32 sum); along another axis, which the kernels do not cover, it
    went to aten all the same, and now takes the reference."""
    x = torch.randn(dispatch.LONG_FLOAT32_ROW, 2)
    assert dispatch.plan("softmax", x, 0, None) == "reference"
    assert dispatch.plan("softmax", x.double(), 0, None) == "aten"
    assert dispatch.plan("softmax", torch.randn(1000, 2), 0, None) == "aten"
    exact = torch.softmax(x.double(), 0)
    assert ((sk.softmax(x, dim=0).double() - exact).abs() / exact).max() < 2e-6
