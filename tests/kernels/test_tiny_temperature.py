"""Temperatures so small that ``x / T`` overflows float32 at finite scores, on every backend,
against the float64 definition.

Found by the function audit: zeros over a ``T`` whose reciprocal overflows gave NaN rows
(``0 * inf``), and ``[3, 4, 4]`` over ``T = 1e-38`` gave ``+inf`` at all three entries, so the
mass was shared by the 3 as well (float64: half on each 4). The reference now computes
such rows as ``(x - max) / T`` and the kernels leave them to it.
"""

import math
import warnings

import pytest
import torch

import softmaxkit as sk

F32 = torch.float32
FMIN = torch.finfo(F32).min


def _batch(rows_per_kind=1):
    x = torch.randn(7, 40, generator=torch.Generator().manual_seed(0))
    x[0] = 0.0                               # 0 / T with 1 / T = inf: NaN before
    x[1, :3] = torch.tensor([3.0, 4.0, 4.0])  # 3 / T and 4 / T both +inf before
    x[2] = FMIN
    x[2, 5] = FMIN * 0.999                   # every entry -inf over T < 1: all mass on entry 5
    x[3, 7] = float("inf")                   # a +inf score keeps its limit
    x[4, 9] = float("nan")                   # a NaN row stays NaN
    x[5] = -1e38
    x[5, 1] = 0.0
    return x.repeat(rows_per_kind, 1)


CASES = [(backend, None) for backend in ("reference", "auto")] + [
    ("numba", algorithm) for algorithm in ("three_pass", "two_pass", "online")]


@pytest.mark.parametrize("temperature", [1e-50, 1e-45, 1e-40, 1e-38, 1e-5])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(("backend", "algorithm"), CASES)
def test_matches_the_float64_definition(backend, algorithm, op, temperature):
    x = _batch(rows_per_kind=40)   # 280 x 40: auto's aten path recomputes the rows it flags
    want = getattr(sk, op)(x.double(), temperature=temperature).float()
    original = x.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sk.use_backend(backend, algorithm=algorithm):
            got = getattr(sk, op)(x, temperature=temperature)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.equal(x.nan_to_num(), original.nan_to_num()), "the input was modified"
    # the rows that never overflowed are exactly what they were without the others
    with sk.use_backend(backend, algorithm=algorithm):
        alone = getattr(sk, op)(x[6:7].contiguous(), temperature=temperature)
    torch.testing.assert_close(got[6:7], alone, rtol=0, atol=0)


def test_the_limit_of_a_tiny_temperature_is_the_argmax():
    x = torch.tensor([[3.0, 4.0, 4.0, -1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    got = sk.softmax(x, temperature=1e-40)
    want = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4, [0.0, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(got, want)


def test_tensor_temperature_too():
    x = _batch()
    t = torch.tensor([[1e-40], [1e-38], [0.5], [1e-45], [1.0], [1e-39], [2.0]], dtype=torch.float64)
    torch.testing.assert_close(sk.softmax(x, temperature=t.float()),
                               sk.softmax(x.double(), temperature=t).float(),
                               rtol=1e-5, atol=1e-6, equal_nan=True)


def _gradient(op, x, temperature, upstream):
    x = x.detach().requires_grad_()
    return torch.autograd.grad(getattr(sk, op)(x, temperature=temperature), x, upstream)[0]


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(("backend", "algorithm"), CASES)
def test_gradient_where_the_reciprocal_overflows(backend, algorithm, op, temperature):
    """``1 / T`` overflows float32 (it is 1e40 or 1e300 in float64): the gradient is float64's
    rounded to float32, 0 at each probability 0 and at a lone maximum, finite or +-inf where
    ``g / T`` is not 0, never ``0 * inf = NaN`` (found by the hostile sweep: NaN on every
    backend). A log-probability that overflows to ``-inf`` at a finite score passes ``g_j / T``
    and keeps ``g_j`` in its row's sum, as in float64."""
    x = _batch(rows_per_kind=40)
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    want = _gradient(op, x.double(), temperature, upstream.double()).float()
    with sk.use_backend(backend, algorithm=algorithm):
        got = _gradient(op, x, temperature, upstream)
    kind = (torch.arange(x.shape[0]) % 7).unsqueeze(-1).expand(x.shape)
    # (a NaN row's gradient: NaN, or 0 where float64's e^(z - m) underflows)
    compared = kind != 4
    torch.testing.assert_close(got[compared], want[compared], rtol=1e-4, atol=1e-6, equal_nan=True)
    assert not got[(kind != 3) & (kind != 4)].isnan().any()
    assert got[4].isnan().any()


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_float64_gradient_where_the_reciprocal_overflows(op):
    """In float64 itself (``T = 1e-310``, ``1 / T = inf``) the gradient is the limit: it
    is 0 where the float64 gradient at ``T = 1e-300`` is, and infinite with its sign
    elsewhere; no NaN."""
    x = _batch().double()
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    good = [0, 1, 2, 5, 6]
    got = _gradient(op, x, 1e-310, upstream)[good]
    near = _gradient(op, x, 1e-300, upstream)[good]
    assert not got.isnan().any()
    assert torch.equal(got.sign(), near.sign())
    assert torch.isinf(got[near != 0]).all()


@pytest.mark.parametrize("temperature", [0.5, torch.tensor(0.5)])
@pytest.mark.parametrize("backend", ["reference", "auto", "numba"])
def test_log_softmax_of_a_finfo_min_fill_over_a_temperature_below_one(backend, temperature):
    """``finfo.min`` fills over ``T = 0.5``: ``x / T`` overflows to ``-inf`` at finite scores.
    Their log-probabilities are ``-inf`` (as float64's ``-6.8e38`` rounds), their gradient
    ``g_j / T``, and their ``g_j`` counts in the row's sum; a ``-inf`` score passes nothing
    (was: the overflowed entries passed nothing either, on every backend)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 300, generator=gen)
    x[:3, 100:] = FMIN
    x[1, 7] = float("-inf")
    upstream = torch.randn(x.shape, generator=gen)
    t64 = temperature.double() if isinstance(temperature, torch.Tensor) else temperature
    x64 = x.double().requires_grad_()
    y64 = sk.log_softmax(x64, temperature=t64)
    (want,) = torch.autograd.grad(y64, x64, upstream.double())
    xs = x.clone().requires_grad_()
    with sk.use_backend(backend):
        y = sk.log_softmax(xs, temperature=temperature)
    (got,) = torch.autograd.grad(y, xs, upstream)
    torch.testing.assert_close(y, y64.float(), rtol=1e-5, atol=1e-5)
    assert (y[:3, 100:] == float("-inf")).all()
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    assert got[1, 7] == 0
    torch.testing.assert_close(got[0, 100:], upstream[0, 100:] / 0.5)


@pytest.mark.parametrize("backend", ["reference", "numba", "auto"])
def test_a_temperature_whose_reciprocal_underflows_keeps_an_infinite_score(backend):
    """Audit 2026-12-03: x * (1 / T) with 1 / T = 1e-300 rounded to 0 in float32 made a +inf
    score inf * 0 = NaN (the whole row NaN); x / T is +inf there, and the row its limit."""
    inf = float("inf")
    x = torch.tensor([[inf, inf, 0.0], [-3e38, 3e38, 1.0], [1.0, 2.0, 3.0]])
    with sk.use_backend(backend):
        for temperature in (1e300, 1e39):
            out = sk.softmax(x, temperature=temperature)
            assert out[0].tolist() == [0.5, 0.5, 0.0]
            expected = torch.softmax(x[1:].double() / temperature, -1).float()
            torch.testing.assert_close(out[1:], expected)
            torch.testing.assert_close(sk.log_softmax(x, temperature=temperature)[0, :2],
                                       torch.full((2,), -math.log(2)))


@pytest.mark.parametrize("rows", [1, 3, 300])   # the kernel's serial entry, the aten path, the parallel kernel
@pytest.mark.parametrize("dtype", [F32, torch.float64])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", ["auto", "numba", "reference"])
def test_a_fill_that_overflows_over_the_temperature_leaves_the_other_scores_exact(backend, op, dtype, rows):
    """Scores near 1000 beside ``finfo.min`` fills, over ``T = 0.01``: the fills' ``x / T`` is
    ``-inf``, so the reference takes the row as ``(x - max) / T`` (float64's view). The aten
    path and the numba softmax took the others' rounded ``x / T`` instead: probabilities
    0.524 / 0.476 came out 0.5234 / 0.4766 (the log-softmax kernel already left such rows to
    the reference; aten's log-softmax was 0.005 off at -24.7)."""
    fill = torch.finfo(dtype).min
    x = torch.full((rows, 3000), fill, dtype=dtype)
    x[:, :3] = torch.tensor([1000.001, 1000.0, 999.75], dtype=dtype)
    with sk.use_backend(backend):
        out = getattr(sk, op)(x, dim=-1, temperature=0.01)
    z = (x.double() - x.double().amax(-1, keepdim=True)) / 0.01
    expected = getattr(torch, op)(z, -1).to(dtype)
    torch.testing.assert_close(out, expected)
