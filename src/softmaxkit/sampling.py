"""Sampling through softmax: Gumbel-softmax, straight-through, temperature in the
probability domain, and top-k / top-p / min-p decoding over large vocabularies.

Every sampler draws its randomness from ``generator`` (a ``torch.Generator``), so a
seeded generator makes it deterministic.
"""

from __future__ import annotations

from numbers import Real
from typing import cast

import torch

from . import functional as F
from . import topk as _topk
from ._checks import can_branch_on, check_dim, check_floating, check_int_in_range, check_positive
from ._rows import compute_dtype

__all__ = ["soften", "gumbel_softmax", "straight_through", "sample"]


def soften(p: torch.Tensor, T: float | torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Temperature applied in the probability domain.

    .. math:: \mathrm{soften}(p, T)_i = \frac{p_i^{1/T}}{\sum_j p_j^{1/T}}

    For ``p = softmax(z)`` this equals ``softmax(z / T)``: ``T > 1`` flattens, ``T < 1``
    sharpens (Hinton, Vinyals & Dean 2015, "Distilling the knowledge in a neural
    network", arXiv 1503.02531). Zero entries stay exactly zero (with zero gradient); a
    row of zeros gives zeros.

    Args:
        p: non-negative weights (need not sum to one), any shape.
        T: temperature, finite and ``> 0``, a number or a tensor broadcastable to ``p``.
        dim: the axis normalised.
    """
    check_floating(p, "p")
    if can_branch_on(p) and (bool((p < 0).any()) or bool(torch.isnan(p).any())):
        raise ValueError("p must be non-negative (probabilities or unnormalised weights), got a negative or NaN entry")
    check_positive(T, "T", finite=True)
    if isinstance(T, torch.Tensor):
        try:
            torch.broadcast_shapes(T.shape, p.shape)
        except RuntimeError:
            raise ValueError(f"T of shape {tuple(T.shape)} does not broadcast to p of shape {tuple(p.shape)}") from None
    positive = p > 0
    log_p = torch.where(positive, torch.log(torch.where(positive, p, torch.ones_like(p))),
                        torch.full_like(p, float("-inf")))
    return F.softmax(log_p, dim=dim, temperature=T)


def _check_tau(tau) -> None:
    check_positive(tau, "tau", allow_tensor=False, finite=True)


def _one_hot_argmax(y: torch.Tensor, dim: int, drawable: torch.Tensor) -> torch.Tensor:
    """One-hot of ``argmax y`` along ``dim``; all zeros where ``drawable`` (keepdim) is False,
    i.e. a row with no finite-or-+inf logit (all ``-inf``), as every normalizer returns zeros
    for an all-masked row."""
    if y.dim() == 0:   # one entry: the one-hot is 1 (0 where it is -inf)
        return drawable.to(y.dtype).reshape(())
    if y.shape[dim] == 0:
        return torch.zeros_like(y)
    index = y.argmax(dim, keepdim=True)
    return torch.zeros_like(y).scatter_(dim, index, drawable.to(y.dtype))


def _drawable(logits: torch.Tensor, dim: int) -> torch.Tensor:
    """keepdim bool: the row has an entry that is not ``-inf``."""
    return (logits.detach() != float("-inf")).any(dim, keepdim=True)


def gumbel_softmax(logits: torch.Tensor, tau: float = 1.0, hard: bool = False, dim: int = -1,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Gumbel-softmax (concrete) relaxation of a categorical sample.

    .. math:: y = \mathrm{softmax}\big((\text{logits} + g) / \tau\big),\quad g_i = -\log E_i,\ E_i \sim \mathrm{Exp}(1)

    (``g`` is standard Gumbel noise). ``hard=True`` returns the one-hot ``argmax y`` in
    the forward pass with the gradient of ``y`` (straight-through). ``-inf`` logits are
    never drawn; a row of all ``-inf`` has nothing to draw and gives zeros (``hard`` or
    not) with zero gradient, the all-masked-row rule of every normalizer. Jang, Gu & Poole
    (2016), "Categorical Reparameterization with Gumbel-Softmax", arXiv 1611.01144; Maddison,
    Mnih & Teh (2016), "The Concrete Distribution", arXiv 1611.00712.

    Args:
        logits: unnormalised log-probabilities, any shape.
        tau: temperature, finite and ``> 0``.
        hard: return one-hot samples (straight-through gradient).
        dim: the category axis.
        generator: the source of randomness.
    """
    check_floating(logits, "logits")
    _check_tau(tau)
    if not isinstance(hard, bool):
        raise TypeError(f"hard must be a bool, got {type(hard).__name__}")
    _check_generator(generator)
    dim = check_dim(logits, dim)
    z = logits.to(compute_dtype(logits.dtype))
    exponential = torch.empty_like(z).exponential_(generator=generator)
    gumbel = -torch.log(exponential.clamp_min(torch.finfo(z.dtype).tiny))
    y = F.softmax(z + gumbel, dim=dim, temperature=tau)
    if hard:
        y = _one_hot_argmax(y.detach(), dim, _drawable(z, dim)) - y.detach() + y
    return y.to(logits.dtype)


def straight_through(logits: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""One-hot ``argmax(logits)`` forward, gradient of ``softmax(logits / tau)`` backward.

    .. math::

        y = \mathrm{onehot}(\arg\max_i \text{logits}_i) + s - \mathrm{sg}(s),\quad
        s = \mathrm{softmax}(\text{logits}/\tau)

    (``sg`` = stop-gradient). Deterministic: the straight-through estimator of Bengio,
    Léonard & Courville (2013), "Estimating or Propagating Gradients Through Stochastic
    Neurons", arXiv 1308.3432, with the softmax surrogate gradient. A row of all ``-inf``
    gives zeros with zero gradient (the all-masked-row rule of every normalizer).
    """
    check_floating(logits, "logits")
    _check_tau(tau)
    dim = check_dim(logits, dim)
    soft = F.softmax(logits, dim=dim, temperature=tau)
    hard = _one_hot_argmax(logits.detach(), dim, _drawable(logits, dim)).to(soft.dtype)
    return hard - soft.detach() + soft


# ----------------------------------------------------------------------------------------
# decoding
# ----------------------------------------------------------------------------------------

#: Width of the blocks whose maxima pre-select the top-k candidates in :func:`_blocked_topk`.
_TOPK_BLOCK = 64


def _blocked_topk(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` of each row of a 2-d ``z``, sorted descending, equal values by increasing
    index (at the cut too: of tied entries the lowest indices are kept, whatever the backend):
    the numba kernel where it runs (:func:`_kernel_topk`), else in plain torch as follows.

    Split the row into blocks of :data:`_TOPK_BLOCK` and take each block's maximum. Let
    ``t`` be the ``k``-th largest block maximum: ``k`` entries are ``>= t``, so every
    top-``k`` entry is ``>= t`` and lies in a block whose maximum is ``>= t``, i.e. in
    one of the ``k`` blocks with the largest maxima (ties at ``t`` are tied in the
    answer too). Only those ``k`` blocks (and the ragged tail) are searched: one pass
    of ``amax`` over the row instead of a selection over all of it. ``torch.topk`` leaves the
    order of equal values unspecified; :func:`_lowest_indices_at_ties` then applies the rule.
    """
    rows, length = z.shape
    blocks = length // _TOPK_BLOCK
    if blocks <= 2 * k:
        values, indices = torch.topk(z, k, dim=-1)
        return _lowest_indices_at_ties(z, values, indices)
    found = _kernel_topk(z, k)
    if found is not None:
        return found
    main = z[:, :blocks * _TOPK_BLOCK].reshape(rows, blocks, _TOPK_BLOCK)
    best_blocks = main.amax(-1).topk(k, dim=-1, sorted=False).indices
    offsets = torch.arange(_TOPK_BLOCK, device=z.device)
    candidates = (best_blocks.unsqueeze(-1) * _TOPK_BLOCK + offsets).reshape(rows, k * _TOPK_BLOCK)
    if blocks * _TOPK_BLOCK < length:
        tail = torch.arange(blocks * _TOPK_BLOCK, length, device=z.device).expand(rows, -1)
        candidates = torch.cat([candidates, tail], dim=-1)
    values, position = z.gather(-1, candidates).topk(k, dim=-1)
    return _lowest_indices_at_ties(z, values, candidates.gather(-1, position))


def _lowest_indices_at_ties(z: torch.Tensor, values: torch.Tensor, indices: torch.Tensor):
    """A top-``k`` ``(values, indices)`` of ``z``'s rows (any order among equal values) in the
    documented order: decreasing value, equal values by increasing index, and where entries
    equal to the ``k``-th value lie past the cut, the lowest indices among them kept. One
    comparison pass over ``z`` finds such rows; only those are searched again."""
    k = values.shape[-1]
    kth = values[:, -1:]
    # (a row whose top holds NaN keeps it, torch ranks it first: the caller's check refuses the row)
    crossing = ((z == kth).sum(-1) > (values == kth).sum(-1)) & ~torch.isnan(values).any(-1)
    if bool(crossing.any()):
        rows = crossing.nonzero().squeeze(-1)
        zc, kc = z[rows], kth[rows]
        above = zc > kc
        tied = zc == kc
        keep = above | (tied & (tied.cumsum(-1) <= k - above.sum(-1, keepdim=True)))
        indices = indices.index_put((rows,), keep.nonzero()[:, 1].reshape(-1, k))
    indices = indices.sort(-1).values
    values, order = z.gather(-1, indices).sort(dim=-1, descending=True, stable=True)
    return values, indices.gather(-1, order)


def _kernel_topk(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The same search in one numba kernel (:func:`softmaxkit.kernels.cpu.topk.topk`: chunk maxima
    and the search in one read of each row, equal values by increasing index) on a contiguous
    CPU float32/float64 ``z`` under the ``auto`` or ``numba`` backend; None elsewhere, or when a
    row holds a NaN or a ``+inf`` logit (the torch search then runs, and the caller's checks
    see the row as torch orders it). At 64 x 128256, k = 50 on 2 AVX2 cores: about 2x faster
    than the ``amax`` and two ``topk`` calls."""
    from .kernels import dispatch

    if (z.device.type != "cpu" or z.dtype not in (torch.float32, torch.float64) or not z.is_contiguous()
            or dispatch.current_backend() not in ("auto", "numba") or not dispatch.numba_available()
            or torch.compiler.is_compiling()):
        return None
    from .kernels.cpu import topk as cpu_topk

    return cpu_topk.topk(z, k)


#: The fused kernel's heap pays per insertion: at 64 x 128256 (logits randn * 2, 2 threads) it
#: took 9-25 ms for k = 64-1024 against 15-62 ms for torch.topk + logsumexp, but 313 ms
#: against 87 ms at k = 4096.
_FUSED_TOPK_MAX_K = 1024


def _top_probs(scaled: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(scaled)`` over the whole row at its ``k`` largest entries, sorted descending,
    and their indices (``scaled`` 2-d).

    The one place that picks the implementation: the fused kernel
    :func:`softmaxkit.softmax_topk` (one pass: online normaliser and a
    size-``k`` heap) where it is implemented and ``k`` is at most
    :data:`_FUSED_TOPK_MAX_K`, otherwise ``logsumexp`` plus :func:`_blocked_topk`.
    """
    try:
        if k > _FUSED_TOPK_MAX_K:
            raise NotImplementedError
        probs, indices = _topk.softmax_topk(scaled, k, dim=-1)
    except NotImplementedError:
        values, indices = _blocked_topk(scaled, k)
        return torch.exp(values - torch.logsumexp(scaled, dim=-1, keepdim=True)), indices
    return _by_score(scaled, probs, indices)


def _by_score(scaled: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor):
    """``probs`` at ``indices`` ordered by their score in ``scaled``, largest first, ties by index:
    the order softmax keeps, without the backend's rounding of near-equal probabilities (one
    ulp apart on a flat row, they sorted differently on the numba kernel and the reference,
    and the same generator drew other tokens)."""
    indices, by_index = indices.sort(dim=-1)
    order = scaled.gather(-1, indices).argsort(dim=-1, descending=True, stable=True)
    return probs.gather(-1, by_index).gather(-1, order), indices.gather(-1, order)


def _check_sampling_args(temperature, top_k, top_p, min_p, generator) -> None:
    check_positive(temperature, "temperature", allow_tensor=False, finite=True)
    if top_k is not None:
        check_int_in_range(top_k, "top_k", 1)
    if top_p is not None:   # (any real number type, as temperature: a NumPy float32 was refused)
        if isinstance(top_p, bool) or not isinstance(top_p, Real):
            raise TypeError(f"top_p must be a number in (0, 1] or None, got {type(top_p).__name__}")
        if not 0 < cast(float, top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if min_p is not None:
        if isinstance(min_p, bool) or not isinstance(min_p, Real):
            raise TypeError(f"min_p must be a number in [0, 1] or None, got {type(min_p).__name__}")
        if not 0 <= cast(float, min_p) <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    _check_generator(generator)


def _check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def _gap_over_temperature(z: torch.Tensor, top: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(z - top) / T``, the exponent of each weight relative to the largest: the difference first
    for ``T < 1`` (``z / T`` overflows), the quotients first for ``T > 1`` (``z - top`` overflows
    between finfo.max and finfo.min, and index 1 of ``[max, min]`` at ``T = 1e38`` was never drawn)."""
    if temperature == 1:
        return z - top
    if temperature < 1:
        return (z - top) / temperature
    return z / temperature - top / temperature


def _check_candidates(top: torch.Tensor) -> None:
    """``top``: the largest logit of each row. Every row needs a finite one."""
    if bool(torch.isnan(top).any()):
        raise ValueError("logits must not contain NaN")
    if bool((top == float("inf")).any()):
        raise ValueError("logits must not contain +inf (the distribution is undefined)")
    if bool((top == float("-inf")).any()):
        raise ValueError("logits: every row needs at least one finite entry to sample from")


def _draw(weights: torch.Tensor, generator) -> torch.Tensor:
    """Index drawn from each row of non-negative ``weights`` (2-d) with probability ∝ weight.

    Inverse CDF in float64: the first index whose cumulative weight exceeds ``u * total``,
    and never past the last positive weight (the first index reaching the total).
    """
    cumulative = weights.to(torch.float64).cumsum(-1)
    total = cumulative[:, -1:].contiguous()
    u = torch.rand(total.shape, dtype=torch.float64, device=weights.device, generator=generator)
    drawn = torch.searchsorted(cumulative, u * total, right=True)
    last_positive = torch.searchsorted(cumulative, total, right=False)
    return torch.minimum(drawn, last_positive).squeeze(-1)


#: Candidate counts tried for a nucleus before sorting the whole row.
_NUCLEUS_CANDIDATES = (256, 4096)

#: A candidate whose mass before it lies this close to ``top_p`` has its side decided again by
#: :func:`_nucleus_keep` from probabilities every backend computes alike (the backends' differ by
#: ulps, a few times 6e-8 relative: their sums by far less than this).
_NUCLEUS_TOLERANCE = 1e-5


def _nucleus_candidates(scaled: torch.Tensor, top_p: float):
    """Candidates holding the top-``p`` nucleus of ``softmax(scaled)`` (2-d), sorted descending:
    ``(probs, indices)``, probabilities over the whole row.

    The top 256, then 4096, entries (fused kernel, :func:`_top_probs`) when, in every row, the
    candidates more probable than the last one hold ``top_p`` and :data:`_NUCLEUS_TOLERANCE` more;
    otherwise (a flat distribution) the whole row, sorted by score. (The kernel picks candidates by
    probability, equal ones by index: a candidate as probable as the last may rank below a token
    left out, of a higher score that rounds to the same probability. Those more probable than the
    last are the row's top by score on every backend; the whole mass counted, a flat row of 5000
    logits kept the lowest indices on one backend, other tokens on another.)
    """
    length = scaled.shape[-1]
    for k in _NUCLEUS_CANDIDATES:
        if k >= length:
            break
        probs, indices = _top_probs(scaled, k)
        settled = torch.where(probs > probs[:, -1:], probs, torch.zeros_like(probs)).sum(-1)
        if bool((settled >= top_p * (1 + 1e-6) + _NUCLEUS_TOLERANCE).all()):
            return probs, indices
    order = scaled.argsort(dim=-1, descending=True, stable=True)
    return F.softmax(scaled, dim=-1).gather(-1, order), order


def _nucleus_keep(probs: torch.Tensor, top_p: float, full_row) -> torch.Tensor:
    """Which sorted candidates the nucleus keeps: those with less than ``top_p`` of the mass before them.

    ``full_row`` = ``(scaled, indices)`` when ``probs`` are full-row probabilities from a backend
    (kernel or reference, differing in the last bits): then a row with a candidate near the boundary
    (within :data:`_NUCLEUS_TOLERANCE`) is decided again on ``exp(scaled - logsumexp(scaled))`` in
    torch (aten), the same on every backend, so that one generator draws the same token on each (a flat row
    of 300 logits at top_p = 0.3 kept one more token on the numba kernel than on the reference).
    """
    mass_before = probs.cumsum(-1) - probs
    keep = mass_before < top_p
    if full_row is None:
        return keep
    scaled, indices = full_row
    rows = ((mass_before - top_p).abs() <= _NUCLEUS_TOLERANCE).any(-1).nonzero().squeeze(-1)
    if len(rows):
        row_scores = scaled[rows]
        fixed = torch.exp(row_scores.gather(-1, indices[rows]) - torch.logsumexp(row_scores, -1, keepdim=True))
        keep[rows] = (fixed.cumsum(-1) - fixed) < top_p
    return keep


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, min_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Draw one token per row of ``logits`` (last axis = vocabulary) for decoding.

    The distribution is ``softmax(logits / temperature)`` truncated, in this order, to

    * ``top_k``: the ``k`` most likely tokens (all of them when ``k`` >= the vocabulary);
    * ``top_p``: the smallest most-likely-first prefix whose mass reaches ``p`` (nucleus
      sampling, Holtzman et al. 2019, arXiv 1904.09751), measured on the distribution
      left by ``top_k``; the most likely token is always kept, ``p = 1`` keeps everything;
    * ``min_p``: tokens with probability at least ``min_p`` times the largest
      (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling", arXiv 2407.01082);

    then renormalised, and drawn by inverse CDF (in float64) from one uniform per row.

    The full softmax over the vocabulary is never written. ``top_k`` selects the ``k``
    largest logits exactly by block maxima (:func:`_blocked_topk`: one read of the row,
    no exponentials; the temperature does not change which tokens they are). ``top_p``
    without ``top_k`` needs probabilities over the whole row: it takes them, for a
    growing number of candidates, from the fused kernel
    :func:`softmaxkit.softmax_topk` where it exists (see :func:`_top_probs`).

    Args:
        logits: ``(..., V)`` scores; ``-inf`` entries are never drawn.
        temperature: finite and ``> 0``.
        top_k: ``>= 1`` or None.
        top_p: in ``(0, 1]`` or None.
        min_p: in ``[0, 1]`` or None.
        generator: the source of randomness; a seeded generator makes this deterministic.

    Returns:
        int64 token indices of shape ``logits.shape[:-1]``.

    Raises:
        ValueError: a row has nothing to draw (all ``-inf``: unlike :func:`gumbel_softmax`,
            which returns zeros there, a token index cannot be "none"), or holds NaN or ``+inf``.
    """
    check_floating(logits, "logits")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (vocabulary) axis, got shape {tuple(logits.shape)}")
    _check_sampling_args(temperature, top_k, top_p, min_p, generator)
    top_p, min_p = (None if v is None else float(v) for v in (top_p, min_p))
    batch_shape, length = logits.shape[:-1], logits.shape[-1]
    z = logits.reshape(-1, length).to(compute_dtype(logits.dtype))
    temperature = float(temperature)
    if temperature < torch.finfo(z.dtype).tiny:
        # T itself would round to 0 (or a denormal) in z's dtype: (z - max) / T gave 0 / 0 = NaN
        # at the maxima and drew index V, past the vocabulary. float64 holds every positive T.
        z = z.double()
    nucleus = top_p is not None and top_p < 1
    if top_k is not None and top_k < length:
        values, indices = _blocked_topk(z, top_k)
        _check_candidates(values[:, 0])
        weights = torch.exp(_gap_over_temperature(values, values[:, :1], temperature))
        probs = weights / weights.sum(-1, keepdim=True)
    elif nucleus:
        assert top_p is not None  # nucleus implies it
        top = z.amax(-1, keepdim=True)
        _check_candidates(top.squeeze(-1))
        # shifted first (softmax is shift invariant): a row of finfo.min over T < 1 overflowed
        # to all -inf, whose probabilities 0 / 0 drew an index past the vocabulary
        scaled = _gap_over_temperature(z, top, temperature)
        probs, indices = _nucleus_candidates(scaled, top_p)
        # weights from the scores (their largest is 0), as top_k's: not the backend's probabilities
        weights = torch.exp(scaled.gather(-1, indices))
    else:
        top = z.amax(-1, keepdim=True)
        _check_candidates(top.squeeze(-1))
        weights, indices = torch.exp(_gap_over_temperature(z, top, temperature)), None
    if nucleus:
        assert top_p is not None  # nucleus implies it
        keep = _nucleus_keep(probs, top_p, None if top_k is not None and top_k < length else (scaled, indices))
        weights = torch.where(keep, weights, torch.zeros_like(weights))
    if min_p is not None and min_p > 0:
        weights = torch.where(weights >= min_p, weights, torch.zeros_like(weights))
    drawn = _draw(weights, generator)
    if indices is not None:
        drawn = indices.gather(-1, drawn.unsqueeze(-1)).squeeze(-1)
    return drawn.reshape(batch_shape)
