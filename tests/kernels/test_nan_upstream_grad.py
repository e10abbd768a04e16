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


@pytest.mark.parametrize("alpha", [2.5, 3.0])
def test_entmax_bisection_runs_on_meta_tensors(alpha):
    out = sk.entmax(torch.empty(4, 8, device="meta"), alpha=alpha)
    assert out.shape == (4, 8) and out.device.type == "meta"
