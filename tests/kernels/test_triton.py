"""Triton softmax: compiled on CUDA, or run by the Triton interpreter on CPU (``tests/conftest.py``
sets ``TRITON_INTERPRET=1`` before triton is imported when there is no GPU)."""

import os

import pytest

pytest.importorskip("triton")

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


def test_interpreter_is_active_without_gpu():
    if DEVICE == "cuda":
        pytest.skip("a GPU runs the kernels compiled")
    import triton

    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert triton.knobs.runtime.interpret


def test_triton_softmax_matches_reference():
    from softmaxkit.kernels.gpu import softmax as gpu

    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    x[1, 3] = float("-inf")
    x[2] = float("-inf")
    out = gpu.softmax(x, temperature=0.5)
    expected = torch.softmax(x / 0.5, -1)
    expected[2] = 0
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0, 1e-30, 3e-39, 1e30, 8e37])
def test_triton_softmax_equals_the_reference_on_hostile_rows_forward_and_backward(temperature, op):
    """Audit 2026-12-03: the kernel scaled x before subtracting the maximum, so 3e38 over
    T = 0.5 read as +inf (two entries sharing the weight); its backward gave a row whose
    maximum is +inf the gradient y (g - <y, g>) where the reference's is 0; and an infinite
    incoming gradient at a probability 0 made the row NaN. The log-softmax (2026-12-04): a
    finite score whose output is -inf ((x - m) / T past finfo.max) passes its gradient."""
    import softmaxkit as sk
    from softmaxkit.kernels.gpu import softmax as gpu

    inf = float("inf")
    x = torch.tensor([[3e38, 2.9e38, 0.0, 1.0], [inf, inf, 0.0, 1.0], [-inf, -inf, -inf, -inf],
                      [1.0, 2.0, -inf, 0.5], [-3e38, 3e38, 1.0, 0.0], [1e-45, 3e-45, 0.0, -1e-45]])
    x = torch.cat([x, torch.randn(3, 4, generator=torch.Generator().manual_seed(2)) * 10,
                   torch.randn(2, 4, generator=torch.Generator().manual_seed(4)) * 300])
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    upstream[3, 2] = inf   # at a probability 0
    leaf = x.clone().to(DEVICE).requires_grad_()
    out = getattr(gpu, op)(leaf, temperature=temperature)
    grad, = torch.autograd.grad(out, leaf, upstream.to(DEVICE))
    with sk.use_backend("reference"):
        ref_leaf = x.clone().requires_grad_()
        expected = getattr(sk, op)(ref_leaf, temperature=temperature)
        expected_grad, = torch.autograd.grad(expected, ref_leaf, upstream)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.cpu(), expected_grad, atol=1e-5, rtol=1e-4)
    assert grad[1].eq(0).all()


def test_triton_softmax_strided_rows_nan_and_bad_temperature():
    """A strided view (every other column, every other row, a transpose) is read as such: the
    kernel steps rows at one stride with unit columns, and before the fix read the wrong
    entries and wrote past the output. A row holding NaN is NaN throughout, as in torch."""
    from softmaxkit.kernels.gpu import softmax as gpu

    base = torch.randn(8, 40, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for x in (base[:, ::2], base[::2], base.t()):
        torch.testing.assert_close(gpu.softmax(x, temperature=0.5), torch.softmax(x / 0.5, -1))
    x = base[:2].clone()
    x[0, 7] = float("nan")
    out = gpu.softmax(x)
    assert out[0].isnan().all()
    torch.testing.assert_close(out[1], torch.softmax(x[1], -1))
    # next to a +inf the weights were the +inf indicator, which read the NaN as 0 (audit 2026-12-02)
    mixed = torch.tensor([[float("nan"), float("inf"), 1.0], [float("inf"), 2.0, float("inf")]]).to(DEVICE)
    out = gpu.softmax(mixed)
    assert out[0].isnan().all()
    torch.testing.assert_close(out[1], torch.tensor([0.5, 0.0, 0.5]).to(DEVICE))
    for bad in (0.0, -1.0, float("nan"), 1e-40, 1e300):   # (1 / T beyond a normal float32: the reference's)
        with pytest.raises(ValueError, match="temperature"):
            gpu.softmax(x, temperature=bad)
    with pytest.raises(TypeError, match="x must be"):
        gpu.softmax([1.0, 2.0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_triton_softmax_long_rows_and_half_precision_within_flash_attention_rule(op, dtype):
    """Rows over several tiles (9000 entries: three of 4096), a NaN row, a row of -inf, a +inf
    entry; the forward and the backward kernel's error against float64 at most 2x (3x for
    the gradient) that of torch's own op in the same dtype, plus one rounding of the dtype."""
    import softmaxkit as sk
    from softmaxkit.kernels.gpu import softmax as gpu

    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 9000, generator=g) * 4
    x[0, 5], x[1], x[2, 7000] = float("nan"), float("-inf"), float("inf")
    upstream = torch.randn(x.shape, generator=g)
    with sk.use_backend("reference"):
        expected = getattr(sk, op)(x)
    torch.testing.assert_close(getattr(gpu, op)(x.to(DEVICE)).cpu(), expected, equal_nan=True)

    good = x[3:].to(dtype)
    leaf = good.to(DEVICE).requires_grad_()
    out = getattr(gpu, op)(leaf)
    grad, = torch.autograd.grad(out, leaf, upstream[3:].to(dtype).to(DEVICE))
    exact_leaf = good.double().requires_grad_()
    exact = getattr(torch, op)(exact_leaf, -1)
    exact_grad, = torch.autograd.grad(exact, exact_leaf, upstream[3:].to(dtype).double())
    torch_leaf = good.to(DEVICE).requires_grad_()
    theirs = getattr(torch, op)(torch_leaf, -1)
    torch_grad, = torch.autograd.grad(theirs, torch_leaf, upstream[3:].to(dtype).to(DEVICE))
    floor = torch.finfo(dtype).eps * exact.abs().max().item()
    err = (out.cpu().double() - exact).abs().max().item()
    torch_err = (theirs.cpu().double() - exact).abs().max().item()
    assert err <= 2 * torch_err + floor, (err, torch_err)
    grad_floor = torch.finfo(dtype).eps * exact_grad.abs().max().item()
    grad_err = (grad.cpu().double() - exact_grad).abs().max().item()
    torch_grad_err = (torch_grad.cpu().double() - exact_grad).abs().max().item()
    assert grad_err <= 3 * torch_grad_err + grad_floor, (grad_err, torch_grad_err)
