r"""The numba kernels behind :func:`softmaxkit.ops.soft_pool2d`, parallel over the
(batch, channel) planes.

For a window ``R`` with maximum ``m``:

.. math:: \tilde a_R = m + \frac{\sum_{i \in R} e^{a_i - m} (a_i - m)}{\sum_{i \in R} e^{a_i - m}},
          \qquad \frac{\partial \tilde a_R}{\partial a_i} = w_i (1 + a_i - \tilde a_R),
          \quad w_i = \frac{e^{a_i - m}}{\sum_{j \in R} e^{a_j - m}}

The loops run over a whole row of windows at a time, one window offset ``(a, b)`` after
another, so that the innermost loop (over the windows of the row) vectorises, exponential
included (:func:`~softmaxkit.kernels.cpu._exp.exp_nonpositive`). The forward keeps each
window's ``m`` and ``sum e^{a_i - m}`` for the backward. A ``-inf`` activation has weight 0
and gradient 0; a window of only ``-inf`` gives ``-inf`` and no gradient. A window holding a
NaN or a ``+inf`` is not computed here: its plane is flagged and the caller takes the
reference. Overlapping windows add their gradients into the same entries, so one thread owns
each plane.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels.cpu._exp import exp_nonpositive
from ..kernels.cpu._intrinsics import cast_like
from ..kernels.cpu.parallel import parallel_njit


@parallel_njit(cache=True, error_model="numpy")
def soft_pool_forward(x, out, shift, total, kh, kw, sh, sw, odd_planes):
    """``out[p, i, j]``: SoftPool of the window at ``(i sh, j sw)`` of plane ``p`` of ``x``
    ``(P, H, W)``, with the window's maximum in ``shift`` and ``sum e^{a - m}`` in ``total``
    (both shaped as ``out``); ``odd_planes[p] = 1`` where a window of plane ``p`` holds a NaN or
    a ``+inf`` (that plane's output is then not all written)."""
    planes, rows, cols = out.shape
    ninf = cast_like(-np.inf, x[0, 0, 0])
    zero = cast_like(0.0, x[0, 0, 0])
    for p in prange(planes):
        weighted = np.empty(cols, x.dtype)
        for i in range(rows):
            m = shift[p, i]
            t = total[p, i]
            m[:] = ninf
            t[:] = zero
            weighted[:] = zero
            for a in range(kh):
                line = x[p, i * sh + a]
                for b in range(kw):
                    for j in range(cols):
                        v = line[j * sw + b]
                        m[j] = v if v > m[j] or v != v else m[j]   # (a NaN sticks: NaN > v is False)
            for a in range(kh):
                line = x[p, i * sh + a]
                for b in range(kw):
                    for j in range(cols):
                        v = line[j * sw + b]
                        e = exp_nonpositive(v - m[j])
                        t[j] += e
                        # relative to m: sum e a of a window of finfo.max overflowed (0 where e = 0)
                        weighted[j] += e * (v - m[j]) if e > zero else zero
            o = out[p, i]
            for j in range(cols):
                if m[j] == -ninf or m[j] != m[j]:   # a +inf, or a NaN, in the window
                    odd_planes[p] = 1
                elif m[j] == ninf:
                    o[j] = ninf
                else:
                    o[j] = m[j] + weighted[j] / t[j]


@parallel_njit(cache=True, error_model="numpy")
def soft_pool_backward(x, out, shift, total, grad, dx, kh, kw, sh, sw):
    """``dx += grad * w_i (1 + a_i - out)`` over every window (``dx`` zeroed by the caller),
    from the forward's ``out``, ``shift`` and ``total``; for inputs whose forward flagged no plane."""
    planes, rows, cols = out.shape
    ninf = cast_like(-np.inf, x[0, 0, 0])
    zero = cast_like(0.0, x[0, 0, 0])
    one = cast_like(1.0, x[0, 0, 0])
    for p in prange(planes):
        scale = np.empty(cols, x.dtype)
        for i in range(rows):
            m = shift[p, i]
            o = out[p, i]
            g = grad[p, i]
            t = total[p, i]
            for j in range(cols):
                scale[j] = g[j] / t[j] if m[j] > ninf else zero
            for a in range(kh):
                line = x[p, i * sh + a]
                dline = dx[p, i * sh + a]
                for b in range(kw):
                    for j in range(cols):
                        v = line[j * sw + b]
                        e = exp_nonpositive(v - m[j])
                        d = scale[j] * e * (one + (v - o[j]))   # (1 + a rounds to a at finfo.max)
                        dline[j * sw + b] += d if e > zero else zero   # (weight 0: v - o may be -inf)
