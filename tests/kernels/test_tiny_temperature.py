"""Temperatures so small that ``x / T`` overflows float32 at finite scores, on every backend,
against the float64 definition.

Found by the function audit: zeros over a ``T`` whose reciprocal overflows gave NaN rows
(``0 * inf``), and ``[3, 4, 4]`` over ``T = 1e-38`` gave ``+inf`` at all three entries, so the
mass was shared by the 3 as well (float64: half on each 4). The reference now computes
such rows as ``(x - max) / T`` and the kernels leave them to it.
"""

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
