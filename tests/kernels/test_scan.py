"""The first-column NaN scan behind the aten path, and the path itself on rows aten leaves NaN."""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels import dispatch
from softmaxkit.kernels.cpu import scan
from softmaxkit.kernels.cpu.scan import first_entries_have_nan, reaches_floor


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 7), (3, 1), (64, 33), (2, 3, 5), (5000, 3)])
def test_scan_finds_exactly_a_nan_in_the_first_column(dtype, shape):
    x = torch.randn(*shape, dtype=dtype)
    assert not first_entries_have_nan(x)
    flat = x.view(-1, shape[-1])
    if shape[-1] > 1:
        flat[-1, 1] = float("nan")          # not the first column: not reported
        assert not first_entries_have_nan(x)
    flat[-1, 0] = float("nan")
    assert first_entries_have_nan(x)
    flat[-1, 0] = float("inf")              # infinities are not NaN
    assert not first_entries_have_nan(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, 7, 32, 1001])
@pytest.mark.parametrize("floor", [float("-inf"), 0.0])
def test_floor_scan_finds_one_anywhere_and_nothing_else(floor, dtype, size):
    x = torch.randn(size, dtype=dtype).abs_().add_(1e-30)
    if floor < 0:
        x.neg_()
    assert not reaches_floor(x, floor)
    x[0] = float("inf")
    x[-1] = float("nan")
    if size > 2:
        x[1] = float("inf") if floor < 0 else 1e-45   # near the floor, not at it
    assert not reaches_floor(x, floor)
    for at in {0, size // 2, size - 1}:
        y = x.clone()
        y[at] = floor
        assert reaches_floor(y, floor)
    assert reaches_floor(torch.full((2, 3), floor, dtype=dtype), floor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [7, scan.PARALLEL_NUMEL + 12345])
@pytest.mark.parametrize("floor", [float("-inf"), 0.0])
def test_nan_or_floor_reports_each_kind_anywhere(floor, dtype, size):
    """One scan (on every thread past PARALLEL_NUMEL, in chunks: the last one partial) reports
    a NaN and a floor entry apart, wherever they lie, and nothing on an ordinary output."""
    x = torch.randn(size, dtype=dtype).abs_().add_(1e-30)
    if floor < 0:
        x.neg_()
    x[1] = float("inf") if floor < 0 else 1e-45   # near the floor, not at it
    assert scan.nan_or_floor(x, floor) == 0
    for at in {0, size // 2, size - 1}:
        y = x.clone()
        y[at] = floor
        assert scan.nan_or_floor(y, floor) == scan.FLOOR_FOUND
        y[(at + 3) % size] = float("nan")
        assert scan.nan_or_floor(y, floor) == scan.FLOOR_FOUND | scan.NAN_FOUND
        y[at] = 1.0 if floor == 0 else -1.0
        assert scan.nan_or_floor(y, floor) == scan.NAN_FOUND


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("rows", [1, 4, 5, 300])
def test_default_path_gives_the_reference_on_rows_aten_leaves_nan(op, rows):
    torch.manual_seed(rows)
    x = torch.randn(rows, 40)
    bad = [0, rows // 2, rows - 1]
    x[bad[0]] = float("-inf")
    x[bad[1], 3] = float("inf")
    x[bad[2], 7] = float("nan")
    got = getattr(sk, op)(x)
    with sk.use_backend("reference"):
        ref = getattr(sk, op)(x)
    torch.testing.assert_close(got, ref, equal_nan=True)
    if op == "softmax" and rows > 2:
        assert torch.equal(got[0], torch.zeros(40))


def test_shape_classes():
    assert dispatch.shape_class(1, 10 ** 6) == "one long row"
    assert dispatch.shape_class(1, 1000) == "one row"
    assert dispatch.shape_class(4096, 128) == "short rows"
    assert dispatch.shape_class(8, 50257) == "small"
    assert dispatch.shape_class(32, 128256) == "large"
    assert set(dispatch.SHAPE_CLASSES) >= {key[3] for key in dispatch.NUMBA_WINS}


def test_every_crossover_table_names_known_cells_and_the_host_uses_its_own():
    for (isa, vendor), table in dispatch.WINS_BY_CPU.items():
        assert isa in ("avx512", "avx2") and vendor in ("intel", "amd") and table
        for op, dtype, pass_, cls, threads in table:
            assert op in ("softmax", "log_softmax", "logsumexp") and dtype in ("float32", "float64")
            assert pass_ in ("fwd", "fwd+bwd") and cls in dispatch.SHAPE_CLASSES
            assert type(threads) is int and threads >= 1
    assert dispatch.NUMBA_WINS == dispatch.wins_for_cpu(dispatch.VECTOR_ISA, dispatch.CPU_VENDOR)


def test_a_cpu_takes_its_own_table_else_its_instruction_sets_else_none():
    for key, table in dispatch.WINS_BY_CPU.items():
        assert dispatch.wins_for_cpu(*key) is table
    assert dispatch.wins_for_cpu("avx2", "intel") is dispatch.WINS_BY_CPU[("avx2", "amd")]
    assert dispatch.wins_for_cpu("other", "intel") == frozenset()


@pytest.mark.parametrize("name, vendor", [("znver4", "amd"), ("znver2", "amd"), ("emeraldrapids", "intel"),
                                          ("skylake-avx512", "intel"), ("haswell", "intel")])
def test_the_vendor_comes_from_the_cpu_name_llvm_tunes_for(monkeypatch, name, vendor):
    import llvmlite.binding as ll
    from numba import config

    from softmaxkit.kernels.cpu import _intrinsics
    monkeypatch.setattr(config, "CPU_NAME", None, raising=False)
    monkeypatch.setattr(ll, "get_host_cpu_name", lambda: name)
    assert _intrinsics._host_cpu_vendor() == vendor
    monkeypatch.setattr(config, "CPU_NAME", name, raising=False)
    monkeypatch.setattr(ll, "get_host_cpu_name", lambda: "unused")
    assert _intrinsics._host_cpu_vendor() == vendor


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_vmap_and_func_grad_take_the_reference(op):
    """Under torch.func transforms there is no data pointer and no data-dependent branch:
    the dispatcher runs the reference (rows with nothing visible included)."""
    fn = getattr(sk, op)
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    x[0, 1] = float("-inf")
    torch.testing.assert_close(torch.vmap(fn)(x), fn(x), equal_nan=True)
    weights = torch.arange(6.0, dtype=torch.float64)

    def loss(r):
        y = fn(r)
        y = y if op == "logsumexp" else torch.where(torch.isfinite(y), y, torch.zeros_like(y)) * weights
        return y.sum()

    xr = x[1:].clone().requires_grad_()
    loss(xr).backward()
    torch.testing.assert_close(torch.func.grad(loss)(x[1:]), xr.grad)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_func_grad_through_the_entmax_family(name):
    fn = getattr(sk, name)
    x = torch.randn(3, 7, dtype=torch.float64)
    weights = torch.arange(7.0, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    (fn(xr) * weights).sum().backward()
    torch.testing.assert_close(torch.func.grad(lambda r: (fn(r) * weights).sum())(x), xr.grad)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_default_path_on_masking_fills_and_one_bad_row(threads, dtype, op):
    """-1e9 and finfo.min fills, +-inf, denormals, and one bad row among good rows (the
    good rows exact), on the lane's serial and parallel scans, under 1 and 2 threads."""
    from softmaxkit.kernels.cpu.scan import PARALLEL_ROWS

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (7, PARALLEL_ROWS + 3):
            torch.manual_seed(rows)
            x = torch.randn(rows, 33, dtype=dtype) * 3
            info = torch.finfo(dtype)
            x[1, ::2] = -1e9
            x[2, 1:] = info.min
            x[3, 4] = info.max
            x[4, :5] = info.tiny / 4
            x[5, 7] = float("-inf")
            x[rows // 2] = float("-inf")            # the bad row: aten gives NaN
            got = getattr(sk, op)(x)
            with sk.use_backend("reference"):
                ref = getattr(sk, op)(x)
            torch.testing.assert_close(got, ref, equal_nan=True, rtol=1e-5, atol=1e-6)
            assert not torch.isnan(got).any()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1, 3, 5, 300, 5000])
def test_log_softmax_gradient_at_minus_inf_is_the_references(dtype, rows):
    """The default path runs aten's backward; a -inf score (anywhere, in any row count the
    lane reads differently) still gets the reference's zero gradient, and its incoming
    gradient does not leak into the other entries."""
    torch.manual_seed(rows)
    x = torch.randn(rows, 9, dtype=dtype)
    x[rows - 1, 4] = float("-inf")
    x[rows // 2, 0] = float("-inf")
    g = torch.randn(rows, 9, dtype=dtype)
    got = x.clone().requires_grad_()
    sk.log_softmax(got).backward(g)
    ref = x.clone().requires_grad_()
    with sk.use_backend("reference"):
        sk.log_softmax(ref).backward(g)
    torch.testing.assert_close(got.grad, ref.grad)
    assert got.grad[rows - 1, 4] == 0 and got.grad[rows // 2, 0] == 0


@pytest.mark.parametrize("alpha", [None, 1.0, 1.3, 1.5, 2.0, 3.0, "tensor"])
def test_vmap_through_the_entmax_family(alpha):
    """torch.func.vmap (and vmap of grad) over sparsemax / entmax: the reference's autograd
    Function carries a vmap rule (the vmapped axis becomes one more row axis)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    x[0, 1, ::2] = float("-inf")
    x[1, 2] = float("-inf")
    x[2, 0, 1] = float("inf")
    if alpha is None:
        fn = sk.sparsemax
    else:
        a = torch.rand(3, 1, dtype=torch.float64) + 1.1 if alpha == "tensor" else alpha

        def fn(r):
            return sk.entmax(r, alpha=a)
    torch.testing.assert_close(torch.func.vmap(fn)(x), fn(x))
    if alpha != "tensor":   # (a per-row alpha of shape (3, 1) fixes the rows' layout)
        torch.testing.assert_close(torch.func.vmap(fn, in_dims=1)(x), fn(x.transpose(0, 1)))
    weights = torch.arange(6.0, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    (fn(xr) * weights).sum().backward()
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(lambda r: (fn(r) * weights).sum()))(x), xr.grad)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_compile_fullgraph_with_a_temperature(op):
    """torch.compile(fullgraph=True) traces the reference, overflowing rows included (no
    graph break from the row checks)."""
    torch._dynamo.reset()
    x = torch.randn(8, 30, generator=torch.Generator().manual_seed(2))
    x[1] = torch.finfo(torch.float32).min
    x[2, ::2] = float("-inf")

    def fn(r):
        return getattr(sk, op)(r, temperature=0.5)
    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(got, getattr(sk, op)(x.double(), temperature=0.5).float())


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("grad", [False, True])
def test_compile_fullgraph_on_the_default_call(op, grad):
    """The default call (no mask, temperature 1: the lane) under torch.compile(fullgraph=True):
    the lane asked the backend's context variable before asking whether dynamo traces, and
    dynamo cannot trace ``ContextVar.get`` (Unsupported: a graph break, an error with
    ``fullgraph``)."""
    torch._dynamo.reset()
    x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(3))
    x[1] = torch.finfo(torch.float32).min
    x[2, ::2] = float("-inf")
    xc = x.clone().requires_grad_(grad)
    got = torch.compile(getattr(sk, op), backend="aot_eager", fullgraph=True)(xc)
    want = getattr(sk, op)(x.double()).float()
    torch.testing.assert_close(got.detach(), want)
    if grad:
        w = torch.randn(want.shape, generator=torch.Generator().manual_seed(4))
        (got * w).sum().backward()
        xd = x.double().requires_grad_()
        (getattr(sk, op)(xd) * w.double()).sum().backward()
        torch.testing.assert_close(xc.grad, xd.grad.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1, 3, 300])
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp_gradient_on_the_default_path_is_the_softmax(dtype, rows, keepdim):
    """aten's logsumexp backward is exp(x - lse) with the rounded lse: at a -1e9 or finfo.min
    fill every entry would get 1. The default path gives softmax(x), as the reference."""
    x = torch.randn(rows, 4, dtype=dtype)
    x[0] = -1e9
    x[rows - 1] = torch.finfo(dtype).min
    x[rows // 2, 1] = 1e4
    x.requires_grad_()
    g = torch.randn(rows, 1, dtype=dtype) if keepdim else torch.randn(rows, dtype=dtype)
    (got,) = torch.autograd.grad(sk.logsumexp(x, keepdim=keepdim), x, g)
    expected = torch.softmax(x.detach().double(), -1).to(dtype) * g.reshape(rows, 1)
    torch.testing.assert_close(got, expected)


def test_a_small_input_takes_a_measured_win_only_past_the_launch_cost(monkeypatch):
    """The kernel's parallel launch costs more than a small softmax: 64 x 1000 stays with aten
    even where the table says the kernel wins on small inputs; 256 x 1000 takes it. aten's
    log-sum-exp is five ops, so the kernel takes it from 4096 entries. A single row runs the
    serial kernel, with no launch: the table alone decides."""
    threads = torch.get_num_threads()
    wins = {("softmax", torch.float32, False, threads): {"small"},
            ("logsumexp", torch.float32, False, threads): {"small", "one row"}}
    monkeypatch.setattr(dispatch, "_WIN_CLASSES", wins)
    assert not dispatch._numba_wins("softmax", torch.zeros(64, 1000))
    assert dispatch._numba_wins("softmax", torch.zeros(256, 1000))
    assert not dispatch._numba_wins("logsumexp", torch.zeros(2, 1000))
    assert dispatch._numba_wins("logsumexp", torch.zeros(16, 1000))
    assert dispatch._numba_wins("logsumexp", torch.zeros(1, 5000))   # one row: no launch
    assert not dispatch._numba_wins("softmax", torch.zeros(1, 5000))   # no one-row win in this table
    assert not dispatch._numba_wins("log_softmax", torch.zeros(256, 1000))   # no win in this table
    x = torch.zeros(1, 5000)
    torch.testing.assert_close(sk.logsumexp(x), torch.logsumexp(x, -1))


def test_a_toy_single_row_never_loads_the_kernels(monkeypatch):
    """Single rows shorter than the crossovers measure (1 x 4096) stay with aten even where
    the table has a one-row win: a toy call must not load the compiled kernels."""
    threads = torch.get_num_threads()
    wins = {(op, torch.float32, False, threads): {"one row"} for op in ("softmax", "logsumexp")}
    monkeypatch.setattr(dispatch, "_WIN_CLASSES", wins)
    for op in ("softmax", "logsumexp"):
        assert not dispatch._numba_wins(op, torch.zeros(3))
        assert not dispatch._numba_wins(op, torch.zeros(1, dispatch.ONE_ROW_MIN - 1))
        assert dispatch._numba_wins(op, torch.zeros(1, dispatch.ONE_ROW_MIN))
    assert not dispatch._numba_wins("softmax", torch.zeros(2, 5000))   # two rows: the launch threshold


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_per_sample_gradients_through_the_default_path(op):
    """vmap(grad(...)) (per-sample gradients) and vmap(jacrev(...)) on the default backend: the
    lanes must not branch on a wrapped tensor's values (log-softmax's look for -inf did)."""
    fn = getattr(sk, op)
    x = torch.randn(3, 5, 7, dtype=torch.float64)

    def loss(r):
        return fn(r).sum() if op == "logsumexp" else (fn(r) * torch.arange(7.0, dtype=r.dtype)).sum()

    per_sample = torch.vmap(torch.func.grad(loss))(x)
    with sk.use_backend("reference"):
        expected = torch.vmap(torch.func.grad(loss))(x)
    torch.testing.assert_close(per_sample, expected)
    assert torch.vmap(torch.func.jacrev(fn))(x).shape[0] == 3


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp", "sparsemax"])
def test_meta_and_fake_tensors_give_shapes_on_the_default_path(op):
    """Meta and fake tensors (FakeTensorMode, make_fx's fake tracing, export) have no data: the
    default path must not read their address (a fake tensor's crashed the process)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fn = getattr(sk, op)
    shape = (4,) if op == "logsumexp" else (4, 8)
    assert fn(torch.empty(4, 8, device="meta")).shape == shape
    with FakeTensorMode():
        assert fn(torch.empty(4, 8)).shape == shape
    graph = make_fx(lambda t: fn(t), tracing_mode="fake")(torch.randn(4, 8))
    torch.testing.assert_close(graph(torch.randn(4, 8).exp()).shape, torch.Size(shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "moved", "strided", "expanded", "offset"])
@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
def test_all_finite_on_every_layout(bad, layout, dtype):
    """The all-finite check reads a contiguous or permuted tensor's memory in one run (on every
    thread from 2^18 entries), anything else through ``aminmax``; each agrees with isfinite."""
    base = torch.randn(3, 700, 200, generator=torch.Generator().manual_seed(0), dtype=dtype)
    if bad is not None:
        base[2, 699, 150] = bad
    t = {"contiguous": base, "transposed": base.transpose(1, 2), "moved": base.movedim(0, -1),
         "strided": base[:, ::2], "expanded": base[:, :1].expand(3, 5, 200), "offset": base[1:]}[layout]
    assert dispatch.all_finite(t) == bool(torch.isfinite(t).all())


@pytest.mark.parametrize("count", [5, 300_000])   # the serial and the parallel pass
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_overflows_when_scaled_never_misses_an_overflow(dtype, count):
    """The aten path's look for a finite score whose ``x / T`` is ``-inf`` (a finfo.min fill
    over T < 1): True wherever ``x * scale`` overflows (it may also be True a rounding away
    from it), False for ``-inf`` scores and for scores that stay in range."""
    from softmaxkit.kernels.cpu.scan import overflows_when_scaled

    big = torch.finfo(dtype).max
    for scale in (2.0, 1e4, 1e300, 1e-300 + 1.5):
        x = torch.randn(count, dtype=dtype)
        x[-1] = -math.inf
        assert not overflows_when_scaled(x, scale) or bool(torch.isinf(x[:-1] * scale).any())
        for value in torch.linspace(-big, -big / 4, 41, dtype=torch.float64).tolist():
            y = x.clone()
            y[count // 2] = value
            exact = bool((torch.isinf(y * scale) & torch.isfinite(y)).any())
            if exact:
                assert overflows_when_scaled(y, scale), (scale, value)
    assert not overflows_when_scaled(torch.empty(0, dtype=dtype), 2.0)
