"""Three ways to compute softmax exactly, and the online normalizer state they share.

* Three-pass: max; sum of ``exp(x - max)``; divide. What every framework does.
* Two-pass (Dukhan & Ablavatski 2020, arXiv 2001.04438): each ``e^{x_i}`` is kept as a
  (mantissa, exponent) pair ``m_i 2^{n_i}``, so the sum needs no prior max pass; the
  second pass rescales by the largest exponent.
* Online (Milakov & Gimelshein 2018, arXiv 1805.02867): one pass keeps a running
  maximum ``m`` and a running sum ``d`` rescaled whenever ``m`` grows; a second pass
  divides. :class:`OnlineSoftmaxState` is that running ``(m, d)``, with an associative
  merge, so blocks of a row can be reduced in any order: attention and the
  linear cross-entropy reuse it.

These are the reference implementations of the algorithms, vectorised in PyTorch; the
numba kernels in :mod:`softmaxkit.kernels.cpu` implement the same passes per row.
All three are exact (to floating-point rounding) and follow the package conventions:
``mask`` (True = visible), ``-inf`` entries masked, all-masked rows give zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._checks import can_branch_on, check_int_in_range
from ._rows import compute_dtype, nonzero_or_one, prepare_rows

__all__ = ["OnlineSoftmaxState", "three_pass_softmax", "two_pass_softmax", "online_softmax"]

_LOG2E = 1.0 / math.log(2.0)
#: Largest |score| whose range reduction the two-pass form keeps exact (as the kernel's).
TWO_PASS_LIMIT = 1.0e6
# Cody-Waite split of ln 2 (fdlibm's constants): n * hi is exact for the exponents that occur,
# so that x - n ln 2, computed in float64, loses no accuracy.
_LN2_SPLIT = {torch.float64: (6.93147180369123816490e-01, 1.90821492927058770002e-10)}


@dataclass(frozen=True)
class OnlineSoftmaxState:
    r"""Running softmax normalizer ``(m, d)`` of the rows seen so far (Milakov & Gimelshein 2018).

    ``m`` is the running maximum and ``d = \sum_j e^{x_j - m}`` the running sum, both of
    the row shape (the input shape with ``dim`` removed). Two states merge as

    .. math:: (m, d) \oplus (m', d') = \big(M,\ d\,e^{m - M} + d'\,e^{m' - M}\big),\quad M = \max(m, m')

    which is associative and commutative with identity ``(-inf, 0)``: any split of a
    row into blocks, reduced in any order, gives the state of the whole row.

    ``m`` is detached: every quantity derived from the state (``logsumexp``, ``probs``)
    is invariant to the reference point, so gradients flow through ``d`` only and are
    exact. A row whose maximum is ``+inf`` keeps ``m = +inf`` and ``d`` = the number of
    its ``+inf`` entries (the limit of the definition); an empty row is ``(-inf, 0)``.

    Example:
        >>> x = torch.randn(4, 1000)
        >>> s = OnlineSoftmaxState.from_block(x[:, :300]).update(x[:, 300:])
        >>> torch.allclose(s.logsumexp(), torch.logsumexp(x, -1))
        True
    """

    m: torch.Tensor
    d: torch.Tensor

    @classmethod
    def empty(cls, shape, dtype: torch.dtype = torch.float32, device=None) -> OnlineSoftmaxState:
        """The identity state ``(-inf, 0)`` for rows of the given (reduced) shape."""
        dtype = compute_dtype(dtype)
        return cls(torch.full(tuple(shape), float("-inf"), dtype=dtype, device=device),
                   torch.zeros(tuple(shape), dtype=dtype, device=device))

    @classmethod
    def from_block(cls, x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> OnlineSoftmaxState:
        """The state of one block of scores along ``dim`` (visible entries only)."""
        rows = prepare_rows(x, dim, mask)
        z = rows.x
        if z.shape[-1] == 0:
            return cls.empty(z.shape[:-1], z.dtype, z.device)
        m = z.detach().masked_fill(~rows.visible, float("-inf")).amax(-1)
        inf_rows = m == float("inf")
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).unsqueeze(-1)
        usable = rows.visible & ~torch.isinf(z)
        terms = torch.exp(torch.where(usable, z, m_safe) - m_safe)
        d = torch.where(usable, terms, torch.zeros_like(terms)).sum(-1)
        n_inf = (rows.visible & (z == float("inf"))).sum(-1).to(d.dtype)
        d = torch.where(inf_rows, n_inf, d)
        return cls(m, d)

    def update(self, block: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> OnlineSoftmaxState:
        """This state merged with the state of ``block`` (a new state; ``self`` is unchanged)."""
        return self.merge(OnlineSoftmaxState.from_block(block, dim, mask))

    def merge(self, other: OnlineSoftmaxState) -> OnlineSoftmaxState:
        """The associative merge ``(m, d) ⊕ (m', d')``."""
        if not isinstance(other, OnlineSoftmaxState):
            raise TypeError(f"other must be an OnlineSoftmaxState, got {type(other).__name__}")
        if self.m.shape != other.m.shape:
            raise ValueError(f"other holds rows of shape {tuple(other.m.shape)}, this state {tuple(self.m.shape)}")
        big = torch.maximum(self.m, other.m)
        return OnlineSoftmaxState(big, self._rescaled(big) + other._rescaled(big))

    def _rescaled(self, big: torch.Tensor) -> torch.Tensor:
        """``d * e^{m - big}``, with ``e^0 = 1`` where ``m == big`` (also for infinite ``m``)."""
        gap = torch.where(self.m == big, torch.zeros_like(self.m), self.m - big)
        return self.d * torch.exp(gap)

    def logsumexp(self) -> torch.Tensor:
        """``m + log d``: ``-inf`` for an empty row, ``+inf`` for a row with a ``+inf`` entry."""
        finite = torch.isfinite(self.m)
        safe_d = nonzero_or_one(self.d)
        out = torch.where(finite, self.m, torch.zeros_like(self.m)) + torch.log(safe_d)
        out = torch.where(self.d == 0, torch.full_like(out, float("-inf")), out)
        return torch.where(self.m == float("inf"), self.m, out)

    def probs(self, x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Softmax weights of ``x`` (a block of the row, or the whole row) under this state."""
        rows = prepare_rows(x, dim, mask)
        m = self.m.unsqueeze(-1)
        d = self.d.unsqueeze(-1)
        usable = rows.visible & ~torch.isinf(rows.x) & torch.isfinite(m)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(torch.where(usable, rows.x, m_safe) - m_safe)
        p = torch.where(usable, e, torch.zeros_like(e)) / nonzero_or_one(d)
        at_inf = rows.visible & (rows.x == float("inf")) & (m == float("inf"))
        p = torch.where(m == float("inf"), at_inf.to(p.dtype) / nonzero_or_one(d), p)
        return rows.restore(rows.zero_invisible(p))   # (a NaN row's d is NaN: masked entries stay 0)


def _rows_or_result(x, dim, mask):
    """The rows to run an algorithm on, or the result when no pass is needed: an empty
    axis, or visible ``+inf`` entries (whose limit the state gives directly; under a transform,
    where no branch on the values is allowed, the state gives every row)."""
    rows = prepare_rows(x, dim, mask)
    if rows.x.shape[-1] == 0:
        return rows, rows.restore(rows.x.clone())
    if not can_branch_on(rows.x) or bool((rows.visible & (rows.x == float("inf"))).any()):
        return rows, OnlineSoftmaxState.from_block(x, dim, mask).probs(x, dim, mask)
    return rows, None


def three_pass_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Softmax by three passes over the row: max, sum of exponentials, divide.

    .. math:: m = \max_j x_j,\quad d = \sum_j e^{x_j - m},\quad y_i = e^{x_i - m} / d
    """
    rows, done = _rows_or_result(x, dim, mask)
    if done is not None:
        return done
    z = rows.x
    return rows.restore(rows.zero_invisible(_three_pass_rows(z, rows.visible & ~torch.isinf(z))))


def _three_pass_rows(z, finite):
    m = z.detach().masked_fill(~finite, float("-inf")).amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.where(finite, torch.exp(torch.where(finite, z, m) - m), torch.zeros_like(z))
    d = e.sum(-1, keepdim=True)
    return e / nonzero_or_one(d)


def two_pass_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Two-pass softmax with (mantissa, exponent) pairs (Dukhan & Ablavatski 2020).

    Pass 1 writes each :math:`e^{x_i} = \mu_i 2^{n_i}` with :math:`n_i = \mathrm{round}(x_i \log_2 e)`
    and :math:`\mu_i = e^{x_i - n_i \ln 2} \in [2^{-1/2}, 2^{1/2}]`, and accumulates the sum as a pair

    .. math:: N = \max_i n_i,\quad S = \sum_i \mu_i\, 2^{n_i - N}

    (no maximum of ``x`` is needed first, and nothing overflows: every term is at most
    :math:`\sqrt 2`). Pass 2 recomputes the pairs and writes :math:`y_i = \mu_i 2^{n_i - N} / S`.
    Dukhan & Ablavatski (2020), "Two-Pass Softmax Algorithm", arXiv 2001.04438.

    The range reduction ``x - n ln 2`` is exact only while ``|x| <=`` :data:`TWO_PASS_LIMIT`;
    rows with a larger finite score are computed with the row maximum (three-pass), as
    the numba kernel does.
    """
    rows, done = _rows_or_result(x, dim, mask)
    if done is not None:
        return done
    z = rows.x
    finite = rows.visible & ~torch.isinf(z)
    big = (finite & (z.detach().abs() > TWO_PASS_LIMIT)).any(-1, keepdim=True)
    finite = finite & ~big
    zs = torch.where(finite, z, torch.zeros_like(z))
    n = torch.round(zs.detach() * _LOG2E)
    # the reduction in float64 (as the kernel's): float32's split of ln 2 keeps n * hi exact
    # only for |n| < 512 (|x| < 355), and a relative error of 3e-4 at |x| = 1e4 followed
    ln2_hi, ln2_lo = _LN2_SPLIT[torch.float64]
    wide = zs.double()
    n64 = n.double()
    mantissa = torch.exp((wide - n64 * ln2_hi) - n64 * ln2_lo).to(z.dtype)
    exponent = torch.where(finite, n, torch.full_like(n, float("-inf")))
    top = exponent.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    shift = torch.where(finite, n - top, torch.zeros_like(n))
    scaled = torch.where(finite, mantissa * torch.exp2(shift), torch.zeros_like(mantissa))
    total = scaled.sum(-1, keepdim=True)
    p = scaled / nonzero_or_one(total)
    if not can_branch_on(big) or bool(big.any()):
        p = torch.where(big, _three_pass_rows(z, rows.visible & ~torch.isinf(z)), p)
    return rows.restore(rows.zero_invisible(p))


def online_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                   block_size: int = 1024) -> torch.Tensor:
    r"""Online-normalizer softmax (Milakov & Gimelshein 2018).

    Pass 1 reads the row once, block by block, keeping :class:`OnlineSoftmaxState`:

    .. math:: m_j = \max(m_{j-1}, x_j),\quad d_j = d_{j-1} e^{m_{j-1} - m_j} + e^{x_j - m_j}

    pass 2 writes :math:`y_i = e^{x_i - m}/d`. Milakov & Gimelshein (2018), "Online
    normalizer calculation for softmax", arXiv 1805.02867.

    Args:
        block_size: entries per block of the first pass (the result does not depend on it).
    """
    block_size = check_int_in_range(block_size, "block_size", 1)
    rows = prepare_rows(x, dim, mask)
    z, visible = rows.x, rows.visible
    state = OnlineSoftmaxState.empty(z.shape[:-1], z.dtype, z.device)
    for start in range(0, z.shape[-1], block_size):
        state = state.update(z[..., start:start + block_size], mask=visible[..., start:start + block_size])
    if z.shape[-1] == 0:
        return rows.restore(z.clone())
    p = state.probs(z, mask=visible)
    return rows.restore(p)
