"""Shared inputs for the kernel tests: random rows plus the adversarial ones."""

import torch

INF = float("inf")


def adversarial(n: int = 257, dtype=torch.float32, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """Rows of length ``n``: random, +-1e4, -inf entries, all -inf, a +inf, a NaN.

    Returns the tensor and a dict naming the special rows.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(10, n, generator=g, dtype=torch.float64) * 3
    x[1] *= 1e4 / 3                      # scores of magnitude 1e4
    x[2, ::3] = -INF                     # some -inf entries
    x[3] = -INF                          # nothing visible
    x[4, 5] = INF                        # a +inf entry
    x[4, 9] = INF
    x[5, 7] = float("nan")               # a NaN
    x[6] = 1e4                           # all equal, large
    x[6, 0] = -1e4
    x[7] = x[7] * 1e-3                   # nearly uniform
    x[8, 3] = 60.0                       # one dominant entry
    return x.to(dtype), {"nan": 5, "inf": 4, "empty": 3}
