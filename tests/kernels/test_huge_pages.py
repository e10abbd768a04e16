"""Large outputs backed by transparent huge pages, and the aten lane that writes into them.

The lane takes over from ``MIN_BYTES`` (32 MiB); the tests lower the threshold so that
small tensors take the same code path.
"""

import pytest
import torch
from torch.autograd import forward_ad

import softmaxkit as sk
from softmaxkit.kernels import memory
from softmaxkit.kernels import dispatch

F64 = torch.float64


@pytest.fixture
def every_output_is_large(monkeypatch):
    monkeypatch.setattr(memory, "MIN_BYTES", 0)


def _thp_offered() -> bool:
    return memory._madvise() is not None


def test_small_outputs_are_plain_and_large_ones_are_advised():
    small = memory.empty((4, 8), torch.float32)
    assert small.shape == (4, 8) and small.dtype == torch.float32 and small.is_contiguous()
    assert not memory.advise_huge_pages(small)
    large = memory.empty((memory.MIN_BYTES // 4 + 4096,), torch.float32)
    assert memory.advise_huge_pages(large) == _thp_offered()
    large.fill_(1.5)   # the memory is ordinary memory
    assert float(large[-1]) == 1.5 and float(large.sum()) == 1.5 * large.numel()


@pytest.mark.skipif(not _thp_offered(), reason="transparent huge pages are not offered (madvise or always)")
def test_the_advice_reaches_the_kernel():
    """The advised range shows up as huge-page backed memory in /proc/self/smaps once
    written (the kernel may still fall back to small pages when no 2 MiB page is free,
    so the test asks only that the mapping carries the hugepage flag)."""
    t = memory.empty((memory.MIN_BYTES // 8 + 8192,), F64)
    address = t.data_ptr()
    flags = []
    with open("/proc/self/smaps") as f:
        current = None
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(a, 16) for a in head.split("-"))
                current = low <= address + memory.HUGE_PAGE * 2 < high
            elif current and head == "VmFlags:":
                flags = line.split()[1:]
    assert "hg" in flags


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_the_huge_page_lane_equals_the_reference(every_output_is_large, op, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, 33, generator=g, dtype=dtype) * 4
    x[1, 2, :10] = float("-inf")            # some entries -inf: zero gradient there
    gy = torch.randn(x.shape, generator=g, dtype=dtype)
    outs = []
    for backend in ("auto", "reference"):
        xi = x.clone().requires_grad_()
        with sk.use_backend(backend):
            y = getattr(sk, op)(xi)
        (grad,) = torch.autograd.grad(y, xi, gy)
        outs.append((y, grad))
    lane = "_KernelSoftmax" if op == "log_softmax" and dispatch.numba_available() else "_AtenSoftmax"
    assert outs[0][0].grad_fn.name().startswith(lane)
    torch.testing.assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])
    with torch.no_grad():
        torch.testing.assert_close(getattr(sk, op)(x), outs[1][0])
    with torch.inference_mode():
        torch.testing.assert_close(getattr(sk, op)(x), outs[1][0])


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_the_huge_page_lane_leaves_bad_rows_to_the_reference(every_output_is_large, op):
    x = torch.randn(5, 20, dtype=F64)
    x[0] = float("-inf")
    x[2, 3] = float("nan")
    x[4, 1] = float("inf")
    xi = x.clone().requires_grad_()
    y = getattr(sk, op)(xi)
    with sk.use_backend("reference"):
        xr = x.clone().requires_grad_()
        want = getattr(sk, op)(xr)
    torch.testing.assert_close(y, want, equal_nan=True)
    gy = torch.randn_like(x)
    torch.testing.assert_close(torch.autograd.grad(y, xi, gy)[0], torch.autograd.grad(want, xr, gy)[0],
                               equal_nan=True)


@pytest.mark.parametrize("kernels", [True, False], ids=["numba", "no-numba"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_the_huge_page_log_softmax_passes_the_gradient_of_an_overflowed_score(every_output_is_large, monkeypatch,
                                                                              dtype, kernels):
    """finfo.max beside finfo.min: the finite score's output overflows to -inf, but the
    reference passes its incoming gradient (only a -inf score passes none). The large-output
    lane's backward must not take it for a masked entry, with the numba kernel's one-pass
    backward (which reads only the output) or with aten's."""
    if kernels and not dispatch.numba_available():
        pytest.skip("numba is not installed")
    if not kernels:
        monkeypatch.setattr(dispatch, "numba_available", lambda: False)
    fi = torch.finfo(dtype)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 300, dtype=dtype, generator=gen)
    x[2, 0], x[2, 1], x[2, 2] = fi.max, fi.min, float("-inf")
    x[3, :7] = float("-inf")
    g = torch.randn(x.shape, dtype=dtype, generator=gen)
    grads = []
    for backend in ("auto", "reference"):
        xi = x.clone().requires_grad_()
        with sk.use_backend(backend):
            y = sk.log_softmax(xi)
        grads.append(torch.autograd.grad(y, xi, g)[0])
        assert y[2, 1] == float("-inf")
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0][2, 1] == g[2, 1] and grads[0][2, 2] == 0 and (grads[0][3, :7] == 0).all()


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_the_huge_page_lane_has_higher_derivatives(every_output_is_large, op):
    x = torch.randn(3, 7, dtype=F64, requires_grad=True)
    fn = getattr(sk, op)
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_the_huge_page_lane_under_transforms(every_output_is_large, op):
    fn = getattr(sk, op)
    x = torch.randn(4, 3, 9, dtype=F64)
    torch.testing.assert_close(torch.vmap(fn)(x), getattr(torch, op)(x, -1))
    tangent = torch.randn_like(x)
    with forward_ad.dual_level():
        y = fn(forward_ad.make_dual(x, tangent))
        jvp = forward_ad.unpack_dual(y).tangent
    want = torch.func.jvp(lambda t: getattr(torch, op)(t, -1), (x,), (tangent,))[1]
    torch.testing.assert_close(jvp, want)


def test_logsumexp_gradient_into_a_large_output(every_output_is_large):
    x = torch.randn(4, 50, dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(sk.logsumexp(x).sum(), x)
    torch.testing.assert_close(grad, torch.softmax(x.detach(), -1))
    assert dispatch.plan("logsumexp", x) in ("aten", "numba")


def test_empty_like_keeps_the_device_and_gives_contiguous_memory():
    """Found on a GPU (2026-12-04): ``memory.empty_like`` of a CUDA tensor was a CPU tensor, so
    ``sk.logsumexp`` of a CUDA tensor failed in its backward (``torch.softmax(..., out=)`` on two
    devices). The meta device stands in for CUDA here."""
    x = torch.empty(4, 6, device="meta")
    for t in (x, x.t()):
        out = memory.empty_like(t)
        assert out.device == t.device and out.shape == t.shape and out.dtype == t.dtype
        assert out.is_contiguous()
