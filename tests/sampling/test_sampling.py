"""Samplers: exactness, determinism given a generator, and chi-square tests of the draws."""

import math

import pytest
import torch
from scipy.stats import chisquare

import softmaxkit as sk
from softmaxkit import sampling
from softmaxkit import topk as _topk_module
from softmaxkit.sampling import gumbel_softmax, sample, soften, straight_through

DRAWS = 20_000


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _counts(indices, length):
    return torch.bincount(indices.reshape(-1), minlength=length).double()


def _chi2_pvalue(counts, probs):
    """p-value of the draws against ``probs``; classes with probability 0 must never appear."""
    probs = probs.double()
    assert counts[probs == 0].sum() == 0, "a token outside the support was drawn"
    keep = probs > 0
    if int(keep.sum()) == 1:
        return 1.0
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return chisquare(counts[keep].numpy(), expected.numpy()).pvalue


def _draws(logits, draws=DRAWS, **kwargs):
    return sample(logits.expand(draws, -1), generator=_gen(kwargs.pop("seed", 0)), **kwargs)


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, float("-inf"), 0.25])


# ----------------------------------------------------------------------------------------
# soften, gumbel-softmax, straight-through
# ----------------------------------------------------------------------------------------

def test_soften_is_softmax_at_temperature():
    z = torch.randn(4, 9, generator=_gen(), dtype=torch.float64)
    for T in (0.3, 1.0, 2.5):
        torch.testing.assert_close(soften(torch.softmax(z, -1), T), torch.softmax(z / T, -1))
    p = torch.tensor([0.5, 0.0, 0.5, 0.0])
    assert bool((soften(p, 0.7)[[1, 3]] == 0).all())
    assert bool((soften(torch.zeros(3), 2.0) == 0).all())
    assert sk.soften is soften


def test_soften_gradcheck_and_bad_input():
    p = torch.rand(3, 5, generator=_gen(), dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda p: soften(p, 0.6, dim=0), (p,))
    with pytest.raises(ValueError, match="T"):
        soften(p, 0.0)
    with pytest.raises(ValueError, match="p must be non-negative"):
        soften(-p, 1.0)


def test_gumbel_softmax_is_deterministic_and_normalised():
    logits = torch.randn(5, 8, generator=_gen())
    a = gumbel_softmax(logits, tau=0.5, generator=_gen(3))
    b = gumbel_softmax(logits, tau=0.5, generator=_gen(3))
    assert torch.equal(a, b)
    torch.testing.assert_close(a.sum(-1), torch.ones(5))
    assert not torch.equal(a, gumbel_softmax(logits, tau=0.5, generator=_gen(4)))


def test_gumbel_max_draws_follow_softmax():
    # argmax of the relaxed sample is an exact categorical draw (the Gumbel-max trick)
    y = gumbel_softmax(LOGITS.expand(DRAWS, -1), tau=0.7, generator=_gen())
    counts = _counts(y.argmax(-1), 10)
    assert _chi2_pvalue(counts, torch.softmax(LOGITS, -1)) > 1e-3
    assert _chi2_pvalue(counts, torch.softmax(LOGITS / 0.7, -1)) < 1e-6  # the test has power


def test_gumbel_softmax_hard_is_one_hot_with_soft_gradient():
    logits = torch.randn(4, 6, generator=_gen(), requires_grad=True)
    hard = gumbel_softmax(logits, tau=0.8, hard=True, dim=-1, generator=_gen(1))
    soft = gumbel_softmax(logits, tau=0.8, hard=False, generator=_gen(1))
    assert bool(((hard == 0) | (hard == 1)).all()) and torch.equal(hard.sum(-1), torch.ones(4))
    assert torch.equal(hard.argmax(-1), soft.argmax(-1))
    w = torch.randn(4, 6, generator=_gen(2))
    g_hard, = torch.autograd.grad((hard * w).sum(), logits)
    g_soft, = torch.autograd.grad((soft * w).sum(), logits)
    torch.testing.assert_close(g_hard, g_soft)


def test_straight_through():
    logits = torch.randn(3, 7, generator=_gen(), dtype=torch.float64, requires_grad=True)
    y = straight_through(logits, tau=0.5)
    assert torch.equal(y.detach(), torch.nn.functional.one_hot(logits.argmax(-1), 7).double())
    w = torch.randn(3, 7, generator=_gen(1), dtype=torch.float64)
    g, = torch.autograd.grad((y * w).sum(), logits)
    expected, = torch.autograd.grad((torch.softmax(logits / 0.5, -1) * w).sum(), logits)
    torch.testing.assert_close(g, expected)


@pytest.mark.parametrize("fn", [lambda x, t: gumbel_softmax(x, tau=t), lambda x, t: straight_through(x, tau=t)])
def test_tau_must_be_positive(fn):
    for tau in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="tau"):
            fn(torch.randn(2, 3), tau)


# ----------------------------------------------------------------------------------------
# sample
# ----------------------------------------------------------------------------------------

def _intended(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The truncated distribution, computed plainly over the sorted vocabulary."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = p.argsort(descending=True, stable=True)
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k is not None:
        keep[order[top_k:]] = False
    q = torch.where(keep, p, torch.zeros_like(p))
    q = q / q.sum()
    if top_p is not None:
        sorted_q = q[order]
        before = sorted_q.cumsum(0) - sorted_q
        keep[order[before >= top_p]] = False
        q = torch.where(keep, q, torch.zeros_like(q))
    if min_p is not None:
        keep &= q >= min_p * q.max()
        q = torch.where(keep, q, torch.zeros_like(q))
    return q / q.sum()


@pytest.mark.parametrize("kwargs", [
    {},
    {"temperature": 0.6},
    {"temperature": 1.7, "top_k": 4},
    {"top_p": 0.8},
    {"top_k": 6, "top_p": 0.7},
    {"min_p": 0.2},
    {"temperature": 1.3, "top_k": 7, "top_p": 0.9, "min_p": 0.1},
])
def test_draws_follow_the_intended_distribution(kwargs):
    counts = _counts(_draws(LOGITS, **kwargs), 10)
    assert _chi2_pvalue(counts, _intended(LOGITS, **kwargs)) > 1e-3
    assert _chi2_pvalue(counts, torch.softmax(LOGITS.double() * 1.25, -1)) < 1e-6  # the test has power


def test_top_p_edge_cases():
    full = _counts(_draws(LOGITS, top_p=1.0), 10)
    assert _chi2_pvalue(full, torch.softmax(LOGITS, -1)) > 1e-3
    tiny = _draws(LOGITS, top_p=1e-12)
    assert bool((tiny == 0).all())
    flat = sample(torch.zeros(1000, 5), top_p=1e-12, generator=_gen())
    assert flat.unique().numel() == 1


def test_min_p_never_draws_below_the_threshold():
    drawn = _draws(LOGITS, min_p=0.3)
    probs = torch.softmax(LOGITS, -1)
    assert bool((probs[drawn] >= 0.3 * probs.max()).all())
    assert bool((_draws(LOGITS, min_p=1.0) == 0).all())


def test_deterministic_given_a_generator():
    logits = torch.randn(16, 3000, generator=_gen())
    for kwargs in ({}, {"top_k": 5}, {"top_p": 0.5}, {"min_p": 0.1, "temperature": 2.0}):
        a = sample(logits, generator=_gen(7), **kwargs)
        assert torch.equal(a, sample(logits, generator=_gen(7), **kwargs))
    assert not torch.equal(sample(logits, generator=_gen(7)), sample(logits, generator=_gen(8)))


@pytest.mark.parametrize("length,k", [(5000, 7), (4096, 1), (1000, 3), (200, 50), (777, 5)])
def test_blocked_topk_is_exact(length, k):
    z = torch.randn(9, length, generator=_gen())
    values, indices = sampling._blocked_topk(z, k)
    expected = torch.topk(z, k)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
    z[:, -1] = 100.0  # the ragged tail holds the maximum
    assert bool((sampling._blocked_topk(z, k)[1][:, 0] == length - 1).all())


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("length,k", [(20000, 5), (200, 7), (5000, 64)])
def test_blocked_topk_keeps_the_lowest_indices_of_ties(backend, length, k):
    """Equal values by increasing index, at the cut too, on the kernel and on the torch search
    (torch.topk leaves ties unspecified): the same seeded draw on every backend."""
    z = torch.zeros(3, length)
    z[1, ::3] = 1.0                  # ties above the cut and across it
    z[2, 5] = 2.0                    # one clear maximum, then ties at the cut
    with sk.use_backend(backend):
        values, indices = sampling._blocked_topk(z, k)
    expected = torch.sort(z, dim=-1, descending=True, stable=True)
    assert torch.equal(values, expected.values[:, :k])
    assert torch.equal(indices, expected.indices[:, :k])
    draws = {}
    for b in ("auto", "reference"):
        with sk.use_backend(b):
            draws[b] = sample(z, top_k=k, generator=_gen(3))
    assert torch.equal(draws["auto"], draws["reference"])


def test_a_row_whose_sum_overflows_keeps_the_top_k_kernel():
    """A finite row of alternating finfo.max / finfo.min sums to NaN (inf - inf): it is not a
    NaN row, and it must not send the other rows of its batch to another tie order."""
    big = torch.finfo(torch.float32).max
    z = torch.zeros(2, 20000)
    z[1, ::2], z[1, 1::2] = big, -big
    alone = sample(z[:1], top_k=5, generator=_gen(3))
    together = sample(z, top_k=5, generator=_gen(3))
    assert int(together[0]) == int(alone[0]) and 0 <= int(alone[0]) < 5
    assert int(together[1]) % 2 == 0 and int(together[1]) < 10


def _force_fallback(monkeypatch):
    def unavailable(x, k, dim=-1):
        raise NotImplementedError("forced fallback")
    monkeypatch.setattr(_topk_module, "softmax_topk", unavailable)


def _fused_available():
    try:
        _topk_module.softmax_topk(torch.randn(2, 10), 3)
    except NotImplementedError:
        return False
    return True


def _large_vocabulary_logits():
    # 1000 entries = 15 blocks of 64 + a ragged tail: the block pre-selection is used for k = 6
    g = _gen(5)
    logits = torch.randn(1000, generator=g) * 0.5
    logits[torch.randperm(1000, generator=g)[:6]] += torch.tensor([3.0, 2.8, 2.5, 2.2, 2.0, 1.5])
    logits[-1] += 2.6
    return logits


def test_large_vocabulary_top_k():
    logits = _large_vocabulary_logits()
    counts = _counts(_draws(logits, draws=6000, top_k=6, temperature=0.9), 1000)
    assert _chi2_pvalue(counts, _intended(logits, temperature=0.9, top_k=6)) > 1e-3


@pytest.mark.parametrize("path", ["fallback", "fused"])
def test_nucleus_with_and_without_the_fused_kernel(path, monkeypatch):
    if path == "fallback":
        _force_fallback(monkeypatch)
    elif not _fused_available():
        pytest.skip("the fused softmax_topk kernel is not implemented yet")
    logits = _large_vocabulary_logits()
    nucleus = _counts(_draws(logits, draws=6000, top_p=0.6, temperature=1.2, seed=1), 1000)
    assert _chi2_pvalue(nucleus, _intended(logits, temperature=1.2, top_p=0.6)) > 1e-3


@pytest.mark.parametrize("top_p", [0.6, 0.9, 0.999])  # nucleus within 256, within 4096, whole row
def test_candidate_paths_draw_the_same_tokens(top_p, monkeypatch):
    logits = torch.randn(8, 20_000, generator=_gen()) * 3
    fused = sample(logits, top_p=top_p, min_p=1e-4, generator=_gen(1))
    _force_fallback(monkeypatch)
    assert torch.equal(fused, sample(logits, top_p=top_p, min_p=1e-4, generator=_gen(1)))
    monkeypatch.setattr(sampling, "_NUCLEUS_CANDIDATES", ())
    assert torch.equal(fused, sample(logits, top_p=top_p, min_p=1e-4, generator=_gen(1)))


def test_shapes_dtypes_and_masked_entries():
    logits = torch.randn(2, 3, 11, generator=_gen()).to(torch.bfloat16)
    logits[..., :5] = float("-inf")
    out = sample(logits, top_k=3, generator=_gen())
    assert out.shape == (2, 3) and out.dtype == torch.int64 and bool((out >= 5).all())
    assert bool((sample(logits, generator=_gen()) >= 5).all())


@pytest.mark.parametrize("kwargs,name", [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": math.inf}, "temperature"),   # (x - max) / inf: NaN at -inf logits, an index past V
    ({"temperature": math.nan}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_p": 1.1}, "min_p"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sample(torch.randn(2, 5), **kwargs)


def test_rows_without_a_finite_entry_or_with_nan():
    with pytest.raises(ValueError, match="logits"):
        sample(torch.full((2, 5), float("-inf")))
    bad = torch.randn(2, 5)
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        sample(bad)
    with pytest.raises(ValueError, match="NaN"):
        sample(bad, top_k=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_all_minus_inf_rows_give_zeros_with_zero_gradient(dtype):
    """gumbel_softmax (soft and hard) and straight_through follow the all-masked-row rule:
    zeros, not a one-hot at index 0; the other rows are unchanged."""
    logits = torch.randn(3, 5, generator=_gen(), dtype=dtype)
    logits[1] = float("-inf")
    logits[2, :3] = float("-inf")
    logits.requires_grad_()
    w = torch.randn(3, 5, generator=_gen(3), dtype=dtype)
    outs = [gumbel_softmax(logits, hard=hard, generator=_gen(1)) for hard in (False, True)]
    outs.append(straight_through(logits, tau=0.7))
    outs.append(gumbel_softmax(logits.detach().t(), hard=True, dim=0, generator=_gen(1)).t())
    for y in outs:
        assert y.dtype == dtype
        assert (y[1] == 0).all()
        torch.testing.assert_close(y[[0, 2]].sum(-1).float(), torch.ones(2))
        assert (y[2, :3] == 0).all()
        if y.requires_grad:
            g, = torch.autograd.grad((y * w).sum(), logits)
            assert (g[1] == 0).all() and torch.isfinite(g).all()
    for hard in outs[1:3]:
        assert bool(((hard == 0) | (hard == 1)).all())


@pytest.mark.parametrize("kwargs", [{}, {"top_k": 2}, {"top_p": 0.9}, {"min_p": 0.1}, {"top_k": 3, "top_p": 0.5}])
def test_sample_refuses_a_row_with_nothing_to_draw(kwargs):
    logits = torch.randn(3, 300, generator=_gen())
    logits[1] = float("-inf")
    with pytest.raises(ValueError, match="every row needs at least one finite entry"):
        sample(logits, generator=_gen(1), **kwargs)


@pytest.mark.parametrize("scale, kwargs", [(1e-3, {"top_p": 0.9}), (1e-3, {"top_p": 0.999}),
                                           (1.0, {"top_p": 0.95, "temperature": 100.0}),
                                           (1e-3, {"top_p": 0.9, "top_k": 3000}), (2.0, {"top_p": 0.9})])
def test_the_same_generator_draws_the_same_tokens_on_every_backend(scale, kwargs):
    """Nearly flat logits: the kernel's and the reference's probabilities differ by an ulp, and
    candidates sorted by probability came out in another order (55 of 160 draws differed at
    top_p = 0.9, hostile sweep of 2026-12-04); they are sorted by score now."""
    logits = torch.randn(8, 50000, generator=torch.Generator().manual_seed(0)) * scale
    draws = {}
    for backend in ("reference", "numba", "auto"):
        g = torch.Generator().manual_seed(1234)
        with sk.use_backend(backend):
            draws[backend] = torch.stack([sk.sampling.sample(logits, generator=g, **kwargs) for _ in range(5)])
    assert torch.equal(draws["numba"], draws["reference"]) and torch.equal(draws["auto"], draws["reference"])


def test_numpy_numbers_and_a_bad_generator():
    """Hostile sweep: top_p / min_p of NumPy float32 were refused (temperature and a NumPy float64
    were taken), and generator=0 raised torch's "rand() received an invalid combination of arguments"."""
    import numpy as np

    z = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for kwargs in ({"top_p": 0.5}, {"min_p": 0.25}, {"top_p": 0.75, "min_p": 0.125, "temperature": 0.5}):
        want = sample(z, generator=torch.Generator().manual_seed(1), **kwargs)
        as_numpy = {k: np.float32(v) for k, v in kwargs.items()}
        assert torch.equal(sample(z, generator=torch.Generator().manual_seed(1), **as_numpy), want)
    for fn in (lambda g: sample(z, generator=g), lambda g: gumbel_softmax(z, generator=g)):
        with pytest.raises(TypeError, match="generator must be a torch.Generator"):
            fn(0)


@pytest.mark.parametrize("vocab, kwargs", [
    (7, {"top_p": 0.9, "min_p": 1.0, "temperature": 3.0}),    # whole-row path (F.softmax by backend)
    (300, {"top_p": 0.3}), (300, {"top_p": 0.3, "temperature": 3.0}),
    (5000, {"top_p": 1e-9, "temperature": 3.0}), (5000, {"top_p": 0.5, "min_p": 0.5})])
def test_nearly_flat_rows_draw_the_same_tokens_on_every_backend(vocab, kwargs):
    """Hostile sweep: logits of scale 1e-7 (probabilities equal to float32 precision). The nucleus
    was cut on each backend's probabilities, which differ by ulps (one more token kept on the numba
    kernel at 300 x top_p 0.3), the fused kernel picked its candidates by probability with ties by
    index (other tokens than by score at 5000), and the draw's weights were those probabilities."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, vocab, generator=g) * 1e-7
    logits[0, ::3] = logits[0, 0]
    draws = {}
    for backend in ("reference", "numba", "auto"):
        with sk.use_backend(backend):
            draws[backend] = torch.stack([sample(logits, generator=_gen(seed), **kwargs) for seed in range(4)])
    assert torch.equal(draws["numba"], draws["reference"]) and torch.equal(draws["auto"], draws["reference"])
    # the nucleus is the top by score: at top_p 1e-9 the single most likely token
    if kwargs.get("top_p") == 1e-9:
        assert torch.equal(draws["reference"][0], logits.argmax(-1))
