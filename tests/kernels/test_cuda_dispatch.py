"""``sk.softmax`` / ``log_softmax`` / ``logsumexp`` with the default backend on a CUDA tensor:
aten (the Triton kernels lost to it everywhere on an H200), with the reference's rows and
gradients. Skipped without a GPU; ``scripts/gpu-check.sh`` runs them."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels import dispatch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

INF = float("inf")
OPS = ["softmax", "log_softmax", "logsumexp"]


def _hostile(dtype):
    x = torch.randn(7, 33, generator=torch.Generator().manual_seed(0)) * 3
    x[1] = -INF                      # nothing visible
    x[2, 4] = INF                    # the limit
    x[3, :30] = -INF                 # three visible entries
    x[4, 0] = float("nan")
    x[5, 5] = -1e9                   # a masked_fill habit
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", OPS)
def test_auto_on_cuda_takes_aten_and_equals_the_reference(op, dtype):
    x = _hostile(dtype)
    upstream = torch.randn(x.shape if op != "logsumexp" else x.shape[:-1],
                           generator=torch.Generator().manual_seed(1)).to(dtype)
    upstream[6] = INF if op != "logsumexp" else upstream[6]
    leaf = x.cuda().requires_grad_()
    assert dispatch.plan(op, leaf, -1, None) == "aten"
    out = getattr(sk, op)(leaf, dim=-1)
    grad, = torch.autograd.grad(out, leaf, upstream.cuda())
    ref_leaf = x.clone().requires_grad_()
    with sk.use_backend("reference"):
        expected = getattr(sk, op)(ref_leaf, dim=-1)
    expected_grad, = torch.autograd.grad(expected, ref_leaf, upstream)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    assert out.dtype == dtype and grad.dtype == dtype
    torch.testing.assert_close(out.cpu(), expected.detach(), equal_nan=True, **tol)
    torch.testing.assert_close(grad.cpu(), expected_grad, equal_nan=True, **tol)


@pytest.mark.parametrize("op", OPS)
def test_cuda_mask_temperature_and_other_dims(op):
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(2))
    mask = torch.rand(4, 5, 6, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[0, 0] = False
    kw = {} if op == "logsumexp" else {"temperature": 0.7}
    for dim in (0, 1, -1):
        leaf = x.cuda().requires_grad_()
        out = getattr(sk, op)(leaf, dim=dim, mask=mask.cuda(), **kw)
        grad, = torch.autograd.grad(out.sum(), leaf)
        ref_leaf = x.clone().requires_grad_()
        with sk.use_backend("reference"):
            expected = getattr(sk, op)(ref_leaf, dim=dim, mask=mask, **kw)
        expected_grad, = torch.autograd.grad(expected.sum(), ref_leaf)
        torch.testing.assert_close(out.cpu(), expected.detach())
        torch.testing.assert_close(grad.cpu(), expected_grad, equal_nan=True)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_the_triton_backend_on_cuda(op):
    x = _hostile(torch.float32).cuda()
    with sk.use_backend("triton"):
        assert dispatch.plan(op, x, -1, None) == "triton"
        out = getattr(sk, op)(x, dim=-1)
    with sk.use_backend("reference"):
        expected = getattr(sk, op)(x.cpu(), dim=-1)
    torch.testing.assert_close(out.cpu(), expected, equal_nan=True)
