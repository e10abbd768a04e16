"""A process forked after the parent ran parallel kernels (multiprocessing's default start
method on Linux, a DataLoader's workers) runs every kernel, on their serial twins, instead
of being killed by GNU OpenMP at its first parallel launch."""

import multiprocessing
import sys
import warnings

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels.cpu import parallel
from softmaxkit.kernels.cpu.scan import first_entries_have_nan

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork start method")


def _fwd_bwd(fn, x, **kw):
    x = x.detach().requires_grad_()
    y = fn(x, **kw)
    (g,) = torch.autograd.grad(y, x, torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
    return y.detach(), g


def _attention(x, name):
    x = x.nan_to_num(neginf=0.0).view(1, 2, 300, 64)
    q, k, v = (x[:, :, i::3, :8].contiguous().requires_grad_() for i in range(3))
    out = sk.attention(q, k, v, name, is_causal=True, method="fused")
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    return out.detach(), torch.cat([g.flatten() for g in grads])


CASES = {
    "softmax": lambda x: _fwd_bwd(sk.softmax, x),
    "log_softmax": lambda x: _fwd_bwd(sk.log_softmax, x),
    "logsumexp": lambda x: _fwd_bwd(sk.logsumexp, x),
    "softmax, temperature": lambda x: _fwd_bwd(sk.softmax, x, temperature=0.3),
    "sparsemax": lambda x: _fwd_bwd(sk.sparsemax, x),
    "entmax15": lambda x: _fwd_bwd(sk.entmax15, x),
    "entmax 1.3": lambda x: _fwd_bwd(sk.entmax, x, alpha=1.3),
    "softmax_topk": lambda x: sk.softmax_topk(x, 7),
    "soft_pool2d": lambda x: _fwd_bwd(sk.ops.soft_pool2d, x[:, :128].reshape(2, 4, 64, 64), kernel_size=2),
    "sigmoid attention": lambda x: _attention(x, "sigmoid"),
    "entmax15 attention": lambda x: _attention(x, "entmax15"),
}


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.where(a == b, 0.0, (a - b).abs()).max())   # (equal infinities: 0; NaN: NaN)


def _child(queue) -> None:
    torch.set_num_threads(1)   # as a DataLoader worker does (aten's own OpenMP pool does not survive fork either)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(256, 150, generator=gen, dtype=torch.float64)
        x[3, ::2] = float("-inf")
        diffs = {}
        for name, case in CASES.items():
            with sk.use_backend("numba"):
                got = case(x)
            with sk.use_backend("reference"):
                want = case(x)
            diffs[name] = max(_distance(a, b) for a, b in zip(got, want))
        nan_rows = torch.zeros(5000, 3, dtype=torch.float64)
        nan_rows[4321, 0] = float("nan")
        found_nan = first_entries_have_nan(nan_rows)
        queue.put((parallel.pool_inherited(), diffs, found_nan, sorted(parallel.serial_twins_made())))
    except BaseException as exc:  # report it: the parent's assertion names it
        queue.put(repr(exc))


def test_a_forked_child_runs_the_kernels_serially():
    with sk.use_backend("numba"):   # start numba's OpenMP pool in this process
        sk.softmax(torch.randn(64, 4096))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # (3.12+: fork of a threaded process)
        child = context.Process(target=_child, args=(queue,))
        child.start()
    child.join(600)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, f"the forked child ended with {child.exitcode}"
    result = queue.get(timeout=10)
    assert not isinstance(result, str), result
    inherited, diffs, found_nan, twins = result
    assert set(twins) == {"normalize_rows", "normalize_rows_at", "backward_rows", "backward_rows_at",
                          "entmax_rows",
                          "entmax_backward_rows", "entmax_attend", "entmax_tile_grad", "softmax_topk_rows",
                          "soft_pool_forward", "soft_pool_backward", "elementwise_forward",
                          "elementwise_backward", "_scan_parallel"}
    assert inherited
    assert found_nan
    assert set(diffs) == set(CASES)
    for name, diff in diffs.items():
        assert diff <= 1e-12, (name, diff)


def test_this_process_keeps_its_parallel_kernels():
    """Only a forked child swaps the kernels: here :func:`runnable` hands back each parallel
    kernel itself."""
    from softmaxkit.kernels.cpu import softmax as kernels

    assert not parallel.pool_inherited()
    assert parallel.runnable(kernels.normalize_rows) is kernels.normalize_rows
