"""SoftPool against an im2col (F.unfold) reference and the paper's exp-weighted form."""

import pytest
import torch
import torch.nn.functional as F

from softmaxkit.ops import soft_pool, soft_pool2d


def unfold_reference(x, kernel_size, stride):
    """SoftPool written with ``F.unfold`` windows and ``torch.softmax``."""
    kh, kw = kernel_size
    n, c, h, w = x.shape
    cols = F.unfold(x, (kh, kw), stride=stride).view(n, c, kh * kw, -1)
    pooled = (torch.softmax(cols, dim=2) * cols).sum(2)
    ho, wo = (h - kh) // stride[0] + 1, (w - kw) // stride[1] + 1
    return pooled.view(n, c, ho, wo)


def exp_weighted(x, kernel_size, stride):
    """The paper's formula: sum(e^a * a) / sum(e^a) per window, via average pooling."""
    e = torch.exp(x)
    return F.avg_pool2d(e * x, kernel_size, stride) / F.avg_pool2d(e, kernel_size, stride)


@pytest.mark.parametrize("kernel_size, stride", [((2, 2), (2, 2)), ((3, 3), (2, 2)), ((2, 3), (1, 2)), ((1, 1), (1, 1))])
def test_matches_references(kernel_size, stride):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 10, generator=g, dtype=torch.float64)
    out = soft_pool2d(x, kernel_size, stride)
    torch.testing.assert_close(out, unfold_reference(x, kernel_size, stride))
    torch.testing.assert_close(out, exp_weighted(x, kernel_size, stride))
    assert out.shape == F.avg_pool2d(x, kernel_size, stride).shape
    if kernel_size == (1, 1):
        torch.testing.assert_close(out, x)


def test_gradient_against_unfold_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, 6, 7, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: soft_pool2d(t, 3, 2), (x,))
    upstream = torch.randn(2, 2, 2, 3, generator=g, dtype=torch.float64)
    grad, = torch.autograd.grad((soft_pool2d(x, 3, 2) * upstream).sum(), x)
    ref, = torch.autograd.grad((unfold_reference(x, (3, 3), (2, 2)) * upstream).sum(), x)
    torch.testing.assert_close(grad, ref)


def test_default_stride_3d_input_and_dtypes():
    x = torch.randn(3, 8, 8)
    torch.testing.assert_close(soft_pool2d(x, 2), unfold_reference(x[None], (2, 2), (2, 2))[0])
    half = soft_pool2d(x.half(), 2)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), soft_pool2d(x.half().float(), 2), rtol=1e-3, atol=1e-3)


def test_large_activations_do_not_overflow():
    x = torch.full((1, 1, 2, 2), 1000.0)
    x[0, 0, 0, 0] = 1001.0
    out = soft_pool2d(x, 2)
    w = torch.softmax(torch.tensor([1001.0, 1000, 1000, 1000], dtype=torch.float64), 0)
    assert torch.isfinite(out).all()
    assert out.item() == pytest.approx((w * torch.tensor([1001.0, 1000, 1000, 1000], dtype=torch.float64)).sum().item())


def test_bad_input():
    x = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="kernel_size"):
        soft_pool2d(x, 5)
    with pytest.raises(ValueError, match="kernel_size"):
        soft_pool2d(x, 0)
    with pytest.raises(ValueError, match="stride"):
        soft_pool2d(x, 2, stride=(1, 0))
    with pytest.raises(ValueError, match="x"):
        soft_pool2d(torch.randn(4, 4), 2)
    with pytest.raises(TypeError, match="x"):
        soft_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.int64), 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_minus_inf_activations_have_weight_zero(dtype):
    """A -inf activation is left out of its window (not NaN); an all -inf window gives -inf,
    as max_pool2d does; gradients stay finite and are 0 at -inf entries."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64)
    x[0, 0, 0, 0] = float("-inf")                    # one -inf in the top-left window
    x[0, 1, 2:, 2:] = float("-inf")                  # a window of only -inf
    x = x.to(dtype).requires_grad_()
    out = soft_pool2d(x, 2)
    assert out.dtype == dtype and not torch.isnan(out).any()
    window = x.detach()[0, 0, :2, :2].flatten()[1:].double()
    expected = (torch.softmax(window, 0) * window).sum()
    torch.testing.assert_close(out[0, 0, 0, 0].double(), expected, rtol=1e-3 if dtype == torch.float16 else 1e-6,
                               atol=1e-3 if dtype == torch.float16 else 1e-6)
    assert out[0, 1, 1, 1] == float("-inf")
    assert out[0, 1, 1, 1] == F.max_pool2d(x.detach().float(), 2)[0, 1, 1, 1]
    assert torch.isfinite(out[0, 1, :1]).all()
    grad, = torch.autograd.grad(out.masked_fill(torch.isinf(out), 0).sum(), x)
    assert torch.isfinite(grad).all()
    assert grad[0, 0, 0, 0] == 0 and (grad[0, 1, 2:, 2:] == 0).all()


def test_minus_inf_gradcheck_and_nan_propagates():
    x = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.zeros_like(x, dtype=torch.bool)
    mask[0, 0, 0, 1] = mask[0, 0, 3, 3] = True
    torch.autograd.gradcheck(lambda a: soft_pool2d(a.masked_fill(mask, float("-inf")), 2),
                             (x.requires_grad_(),))
    y = x.detach().clone()
    y[0, 0, 0, 0] = float("nan")
    out = soft_pool2d(y, 2)
    assert torch.isnan(out[0, 0, 0, 0]) and not torch.isnan(out[0, 0, 1]).any()


def _hostile(shape, dtype, seed):
    """Scores of scale 5 with a lone -inf, a window of only -inf and a large value."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 5
    x[0, 0, 0, 0] = float("-inf")
    x[-1, -1, 2:5, 2:5] = float("-inf")
    x[0, -1, 1, 1] = 1e4
    return x.to(dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("window", [(2, 2, 2, 2), (3, 3, 2, 2), (2, 3, 1, 2), (3, 2, 3, 1), (5, 5, 1, 1), (1, 1, 1, 1)])
def test_kernel_equals_the_reference_forward_and_backward(window, dtype, threads):
    """The numba kernels (the default on the CPU) against the torch-ops reference, with -inf
    activations, a window of only -inf, overlapping windows and non-contiguous inputs."""
    kh, kw, sh, sw = window
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for layout in ("contiguous", "channels_last", "transposed"):
            x = _hostile((2, 3, 11, 10), dtype, seed=kh * 10 + kw)
            if layout == "channels_last":
                x = x.to(memory_format=torch.channels_last)
            elif layout == "transposed":
                x = x.transpose(-1, -2)
            x.requires_grad_()
            out = soft_pool2d(x, (kh, kw), (sh, sw))
            ref = soft_pool.reference(x, kh, kw, sh, sw)
            tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-6, "atol": 2e-5}
            torch.testing.assert_close(out, ref, **tol)
            assert torch.equal(out == float("-inf"), ref == float("-inf"))
            upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
            grad, = torch.autograd.grad(out, x, upstream)
            expected, = torch.autograd.grad(ref, x, upstream)
            torch.testing.assert_close(grad, expected, **tol)
    finally:
        torch.set_num_threads(before)


def test_nan_and_plus_inf_windows_take_the_reference():
    x = _hostile((2, 2, 6, 6), torch.float64, seed=5)
    x[0, 1, 0, 0] = float("nan")
    x[1, 0, 5, 5] = float("inf")
    x.requires_grad_()
    out = soft_pool2d(x, 2)
    ref = soft_pool.reference(x, 2, 2, 2, 2)
    torch.testing.assert_close(out, ref, equal_nan=True)
    assert out[1, 0, 2, 2] == float("inf") and torch.isnan(out[0, 1, 0, 0])
    grad, = torch.autograd.grad(out, x, torch.ones_like(out))
    expected, = torch.autograd.grad(ref, x, torch.ones_like(ref))
    torch.testing.assert_close(grad, expected, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_windows_of_only_nan_or_nan_and_minus_inf_give_nan(dtype):
    """The kernel's running maximum ignored a NaN, so a window holding nothing but NaN and
    -inf looked like a window of only -inf and gave -inf."""
    nan, inf = float("nan"), float("-inf")
    x = torch.tensor([[[[nan, inf, 1.0, 2.0], [inf, inf, 3.0, nan]]]], dtype=dtype)
    out = soft_pool2d(x, 2)
    assert torch.isnan(out).all()
    assert torch.isnan(soft_pool2d(torch.tensor([[[nan]]], dtype=dtype), 1)).all()
    assert soft_pool2d(torch.full((1, 2, 2), inf, dtype=dtype), 2).item() == inf


def test_second_order_gradients_empty_batches_and_transforms():
    x = torch.randn(1, 2, 6, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: soft_pool2d(t, (3, 2), (2, 1)), (x,))
    empty = torch.randn(0, 3, 8, 8, requires_grad=True)
    out = soft_pool2d(empty, 2)
    assert out.shape == (0, 3, 4, 4)
    out.sum().backward()
    assert empty.grad.shape == empty.shape
    batch = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(lambda t: soft_pool2d(t, 2))(batch), soft_pool2d(batch, 2))
    grad = torch.func.grad(lambda t: soft_pool2d(t, 2).sum())(batch)
    expected, = torch.autograd.grad(soft_pool2d(batch.requires_grad_(), 2).sum(), batch)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_on_windows_of_finfo_extremes_and_mask_fills(dtype):
    """A window of finfo.max activations summed e * a past the largest float (inf, where the
    reference gives finfo.max); the kernel now sums e * (a - m)."""
    finfo = torch.finfo(dtype)
    x = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(4), dtype=dtype)
    x[0, 0, :2, :2] = finfo.max
    x[0, 1, :2, :2] = finfo.min
    x[1, 0, :2, 2:] = -1e9
    x[1, 1, 0, 0] = finfo.max
    x.requires_grad_()
    out = soft_pool2d(x, 2)
    ref = soft_pool.reference(x, 2, 2, 2, 2)
    assert out[0, 0, 0, 0] == finfo.max and out[0, 1, 0, 0] == finfo.min
    torch.testing.assert_close(out, ref)
    grad, = torch.autograd.grad(out.sum(), x)
    expected, = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("dtype,big", [(torch.float64, 1e308), (torch.float32, 2e38)])
@pytest.mark.parametrize("create_graph", [False, True])
def test_a_window_spanning_more_than_finfo_max_has_a_finite_gradient(dtype, big, create_graph):
    """``[big, big, -big, 0]``: the weight of ``-big`` is exactly 0, but ``a_i - out`` overflowed to
    ``-inf`` and ``0 * -inf`` made its gradient NaN, in the kernel and in the reference
    (hostile audit, 2026-12-02)."""
    x = torch.tensor([big, big, -big, 0.0], dtype=dtype).view(1, 1, 2, 2).requires_grad_()
    g, = torch.autograd.grad(soft_pool2d(x, 2).sum(), x, create_graph=create_graph)
    torch.testing.assert_close(g.detach(), torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=dtype).view(1, 1, 2, 2))


def test_batched_gradients_equal_a_loop():
    """``is_grads_batched`` (vectorised ``jacobian``): the kernel's backward read the batched
    gradient's data (no batching rule for ``detach``); it now takes the torch-op backward."""
    x = torch.randn(2, 2, 5, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64, requires_grad=True)
    out = soft_pool2d(x, (2, 3), (1, 2))
    grads = torch.randn(3, *out.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (batched,) = torch.autograd.grad(out, x, grads, is_grads_batched=True, retain_graph=True)
    torch.testing.assert_close(batched, torch.stack([torch.autograd.grad(out, x, g, retain_graph=True)[0]
                                                     for g in grads]), rtol=0, atol=1e-12)
    jacobian = torch.autograd.functional.jacobian(lambda t: soft_pool2d(t, 2), x[:1, :1].detach(), vectorize=True)
    assert jacobian.shape == (1, 1, 2, 3, 1, 1, 5, 6)


def test_a_first_order_gradient_by_the_reference_has_no_graph():
    """A window with a NaN takes the reference backward, which tested ``is_grad_enabled()`` inside
    ``enable_grad()``: every first-order gradient was built with ``create_graph=True``."""
    x = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    x[0, 0, 0, 0] = float("nan")
    x.requires_grad_()
    (grad,) = torch.autograd.grad(soft_pool2d(x, 2).sum(), x)
    assert not grad.requires_grad and grad.grad_fn is None
    assert torch.isnan(grad[0, 0, :2, :2]).all() and torch.isfinite(grad[0, 0, 2:]).all()


def test_a_stride_past_the_input_keeps_the_first_window():
    """A stride of 10**29 reached the numba kernel as a Python int past int64 (a TypingError;
    found by a hostile sweep, 2026-12-04); any stride past the input leaves the first window,
    as one equal to the input does."""
    x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    for stride in (10**29, (10**29, 3), (6, 10**20)):
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        expected = soft_pool2d(x, 2, stride=(min(sh, 5), min(sw, 7)))
        torch.testing.assert_close(soft_pool2d(x, 2, stride=stride), expected)
