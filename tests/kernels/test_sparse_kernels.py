"""numba sparsemax / entmax15 / entmax(alpha) against the sort- and bisection-based references."""

import pytest
import torch

import softmaxkit as sk

from ._inputs import adversarial

CASES = {
    "sparsemax": lambda x: sk.sparsemax(x),
    "entmax15": lambda x: sk.entmax15(x),
    "entmax_1.3": lambda x: sk.entmax(x, alpha=1.3),
    "entmax_3": lambda x: sk.entmax(x, alpha=3.0),
}


def _both(f, x):
    with sk.use_backend("numba"):
        fast = f(x)
    with sk.use_backend("reference"):
        ref = f(x)
    return fast, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_exact_against_sort_based_reference(name, dtype):
    x, special = adversarial(n=1500, dtype=dtype)
    fast, ref = _both(CASES[name], x)
    keep = [r for r in range(x.shape[0]) if r != special["nan"]]
    torch.testing.assert_close(fast[keep], ref[keep], rtol=0, atol=1e-6)
    assert torch.isnan(fast[special["nan"]]).all()
    assert torch.equal(fast[special["empty"]], torch.zeros(1500, dtype=dtype))


@pytest.mark.parametrize("name", ["entmax_1.3", "entmax_3"])
def test_general_alpha_against_bisection_reference(name):
    x, special = adversarial(n=800, dtype=torch.float64)
    fast, ref = _both(CASES[name], x)
    keep = [r for r in range(x.shape[0]) if r != special["nan"]]
    torch.testing.assert_close(fast[keep], ref[keep], rtol=0, atol=1e-9)


def test_long_rows_and_row_of_length_one():
    x = torch.randn(2, 200_000, dtype=torch.float64) * 2
    for name in ("sparsemax", "entmax15"):
        fast, ref = _both(CASES[name], x)
        torch.testing.assert_close(fast, ref, rtol=0, atol=1e-9)
    one = torch.randn(4, 1)
    for f in CASES.values():
        fast, ref = _both(f, one)
        assert torch.equal(fast, torch.ones(4, 1)) and torch.equal(ref, fast)


def test_per_row_alpha_tensor():
    x = torch.randn(3, 2, 50, dtype=torch.float64)
    alpha = torch.tensor([1.2, 1.5, 2.5], dtype=torch.float64).reshape(3, 1, 1)
    fast, ref = _both(lambda t: sk.entmax(t, alpha=alpha), x)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-9)


def test_gradcheck_scores_and_alpha_float64():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([[1.3], [1.7], [2.0], [2.6]], dtype=torch.float64, requires_grad=True)
    with sk.use_backend("numba"):
        assert torch.autograd.gradcheck(lambda t, a: sk.entmax(t, alpha=a), (x, alpha))
        assert torch.autograd.gradcheck(sk.sparsemax, (x,))
        assert torch.autograd.gradcheck(sk.entmax15, (x,))


def test_gradients_match_reference():
    x, special = adversarial(n=60, dtype=torch.float64)
    x = x.clone().requires_grad_()
    alpha = torch.full((10, 1), 1.6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(10, 60, dtype=torch.float64)
    grads = []
    for backend in ("numba", "reference"):
        with sk.use_backend(backend):
            grads.append(torch.autograd.grad(sk.entmax(x, alpha=alpha), (x, alpha), g))
    keep = [r for r in range(10) if r != special["nan"]]
    for fast, ref in zip(*grads):
        torch.testing.assert_close(fast[keep], ref[keep], rtol=1e-7, atol=1e-8)


def test_double_backward_float64():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([[1.3], [1.6], [2.2]], dtype=torch.float64, requires_grad=True)
    with sk.use_backend("numba"):
        assert torch.autograd.gradgradcheck(lambda t, a: sk.entmax(t, alpha=a), (x, alpha))
        assert torch.autograd.gradgradcheck(sk.sparsemax, (x,))
