"""The LLVM-level helpers of the numba kernels: 512-bit vectors and the estimated division."""

import numpy as np
import pytest
from numba import njit

from softmaxkit.kernels.cpu._exp import exp_nonpositive_fast
from softmaxkit.kernels.cpu import _intrinsics
from softmaxkit.kernels.cpu._intrinsics import WIDE_VECTORS, divide_finite, held_constant, is_nan, wide_vectors

_FAST = {"nsz", "contract", "arcp", "reassoc", "nnan"}


def _exp_sum(wide):
    @njit(fastmath=_FAST, error_model="numpy")
    def exp_sum(x, out):
        if wide:   # a constant of the closure: compiled in or out
            wide_vectors()
        total = x[0] - x[0]
        for i in range(x.shape[0]):
            e = exp_nonpositive_fast(x[i])
            out[i] = e
            total += e
        return total
    return exp_sum


_exp_sum_wide, _exp_sum_default = _exp_sum(True), _exp_sum(False)


@njit(fastmath=_FAST, error_model="numpy")
def _divide(a, b, out):
    for i in range(a.shape[0]):
        out[i] = divide_finite(a[i], b[i])


@njit(fastmath=_FAST, error_model="numpy")
def _nan_flags(x, out):
    for i in range(x.shape[0]):
        out[i] = is_nan(x[i])   # (x != x here may fold to False under nnan)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_is_nan_holds_under_nnan(dtype):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, np.finfo(dtype).max,
                  np.finfo(dtype).tiny / 4] * 5, dtype=dtype)
    x[3] = np.frombuffer(np.array([-1], dtype=np.int32 if dtype == np.float32 else np.int64).tobytes(),
                         dtype=dtype)[0]   # all bits set: a NaN with the sign bit
    out = np.zeros(x.shape, dtype=np.bool_)
    _nan_flags(x, out)
    np.testing.assert_array_equal(out, np.isnan(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wide_vectors_changes_the_registers_not_the_values(dtype):
    x = -np.abs(np.random.default_rng(0).standard_normal(1001) * 30).astype(dtype)
    x[::97] = -np.inf
    wide, default = np.empty_like(x), np.empty_like(x)
    s_wide, s_default = _exp_sum_wide(x, wide), _exp_sum_default(x, default)
    np.testing.assert_array_equal(wide, default)   # elementwise: the same operations per lane
    assert s_wide == pytest.approx(s_default, rel=10 * float(np.finfo(dtype).eps))   # only the summation order
    assembly = next(iter(_exp_sum_wide.inspect_asm().values()))
    assert ("zmm" in assembly) == WIDE_VECTORS


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_divide_finite_is_within_two_ulp_of_the_rounded_quotient(dtype):
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(4099) * 10.0 ** rng.integers(-30, 30, 4099)).astype(dtype)
    b = (rng.uniform(1, 4, 4099) * np.where(rng.random(4099) < 0.5, -1, 1)).astype(dtype)
    a[:5] = [0, np.finfo(dtype).tiny, np.finfo(dtype).max / 4, -1, 1]
    out = np.empty_like(a)
    _divide(a, b, out)
    exact = (a.astype(np.float64) / b.astype(np.float64)).astype(dtype)
    ulp = np.spacing(np.abs(exact).astype(dtype))
    assert np.all(np.abs(out.astype(np.float64) - exact) <= 2 * ulp)
    if dtype == np.float64:
        np.testing.assert_array_equal(out, a / b)   # no estimate in double precision


@pytest.mark.parametrize("features, isa", [
    ("+avx512f,+avx2,+fma,+sse4.2", "avx512"), ("+avx2,+fma,-avx512f", "avx2"),
    ("+avx2,-fma", "other"), ("+sse4.2,+neon", "other")])
def test_vector_isa_reads_the_features_numba_compiles_for(monkeypatch, features, isa):
    from numba import config
    monkeypatch.setattr(config, "CPU_FEATURES", features, raising=False)
    assert _intrinsics._host_vector_isa() == isa


@njit(fastmath=_FAST, error_model="numpy")
def _horner_held(x, out):
    for i in range(x.shape[0]):
        r = x[i]
        out[i] = (held_constant(np.float32(0.25)) * r + held_constant(np.float32(-1.5))) * r + held_constant(np.float32(3.0))


@njit(fastmath=_FAST, error_model="numpy")
def _horner_plain(x, out):
    for i in range(x.shape[0]):
        r = x[i]
        out[i] = (np.float32(0.25) * r + np.float32(-1.5)) * r + np.float32(3.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_held_constant_is_the_constant_bit_for_bit(dtype):
    @njit(error_model="numpy")
    def hold(x):
        return held_constant(x)
    for value in (0.0, -0.0, 1.5, -87.33654, 1e-45, 3.4e38, np.inf, -np.inf):
        v = dtype(value)
        assert dtype(hold(v)).tobytes() == v.tobytes()   # (numba returns a Python float)
    assert np.isnan(hold(dtype(np.nan)))


def test_a_loop_over_held_constants_gives_the_plain_loop_result():
    x = np.random.default_rng(0).standard_normal(1037).astype(np.float32)
    held, plain = np.empty_like(x), np.empty_like(x)
    _horner_held(x, held)
    _horner_plain(x, plain)
    np.testing.assert_array_equal(held, plain)
