"""The numba exp: as accurate as torch's own exp against a higher-precision reference."""

import numpy as np
import pytest
import torch

from softmaxkit.kernels.cpu._exp import exp_array


def _relative_error(values: np.ndarray, x: np.ndarray) -> float:
    reference = np.exp(x.astype(np.longdouble))
    normal = reference > np.finfo(x.dtype).tiny
    return float(np.max(np.abs(values[normal] / reference[normal] - 1)))


@pytest.mark.parametrize("dtype, low, high", [(np.float32, -87.3, 88.7), (np.float64, -708.0, 709.0)])
def test_max_relative_error_is_no_worse_than_torch(dtype, low, high):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(low, high, 300_001), rng.uniform(-30, 0, 100_000),
                        rng.uniform(-1, 1, 100_000)]).astype(dtype)
    ours = np.empty_like(x)
    exp_array(x, ours, False)
    theirs = torch.exp(torch.from_numpy(x)).numpy()
    assert _relative_error(ours, x) <= _relative_error(theirs, x)
    assert _relative_error(ours, x) < (1.2e-7 if dtype == np.float32 else 2.3e-16)
    # the variant the softmax kernels use, on the softmax range x <= 0
    nonpositive = x[x <= 0]
    ours = np.empty_like(nonpositive)
    exp_array(nonpositive, ours, True)
    theirs = torch.exp(torch.from_numpy(nonpositive)).numpy()
    assert _relative_error(ours, nonpositive) <= _relative_error(theirs, nonpositive)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype):
    x = np.array([-np.inf, np.inf, np.nan, -1e4, 1e4, 0.0, -1e-30], dtype=dtype)
    out = np.empty_like(x)
    exp_array(x, out, False)
    assert out[0] == 0 and out[1] == np.inf and np.isnan(out[2])
    assert out[3] == 0 and out[4] == np.inf and out[5] == 1 and out[6] == 1
    exp_array(x, out, True)
    assert out[0] == 0 and np.isnan(out[2]) and out[3] == 0 and out[5] == 1 and out[6] == 1
