"""Temperature scaling, ECE, classwise ECE and reliability diagrams."""

import contextlib
import math
import signal

import numpy as np
import pytest
import torch

from softmaxkit.scores import classwise_ece, ece, fit_temperature, nll, reliability_diagram

# top-label confidences .85, .85, .65, .65; the last prediction is wrong
PROBS = torch.tensor([[0.85, 0.15], [0.15, 0.85], [0.65, 0.35], [0.35, 0.65]], dtype=torch.float64)
LABELS = torch.tensor([0, 1, 0, 0])


def test_fit_temperature_by_hand():
    # logits (1, 0), label 0 with frequency q: NLL(beta) minimised at sigmoid(beta) = q,
    # so q = 3/4 gives beta = log 3 and T = 1 / log 3
    logits = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1])
    assert fit_temperature(logits, labels) == pytest.approx(1 / math.log(3.0), rel=1e-8)


def test_fit_temperature_minimises_nll():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(200, 6, generator=gen, dtype=torch.float64)
    labels = torch.where(torch.rand(200, generator=gen) < 0.6, logits.argmax(1), torch.randint(0, 6, (200,), generator=gen))
    t = fit_temperature(logits, labels)
    best = nll(logits, labels, t)
    for other in (t * 0.999, t * 1.001, 1.0, t * 2):
        assert best <= nll(logits, labels, other) + 1e-12
    # float32 logits give the same temperature
    assert fit_temperature(logits.float(), labels) == pytest.approx(t, rel=1e-5)


def test_fit_temperature_separable_warns_and_returns_bound():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    with pytest.warns(RuntimeWarning, match="lower bound"):
        assert fit_temperature(logits, torch.tensor([0, 1])) == 1e-3


@contextlib.contextmanager
def _deadline(seconds):
    """Fail (instead of hanging) if the block runs longer than ``seconds``."""
    def expire(signum, frame):
        raise TimeoutError(f"did not return within {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("tol", [0.0, -1e-3, math.nan, math.inf, -math.inf])
def test_fit_temperature_rejects_a_bad_tol(tol):
    logits = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)
    with _deadline(20), pytest.raises(ValueError, match=r"\btol\b"):
        fit_temperature(logits, torch.tensor([0, 0, 0, 1]), tol=tol)
    with pytest.raises(TypeError, match=r"\btol\b"):
        fit_temperature(logits, torch.tensor([0, 0, 0, 1]), tol="1e-6")


def test_fit_temperature_stops_at_the_float_resolution():
    """A tol finer than float64 can resolve returns (the best bracket) instead of looping;
    so do huge and bad bounds."""
    logits = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1])
    with _deadline(20):
        assert fit_temperature(logits, labels, tol=1e-300) == pytest.approx(1 / math.log(3.0), rel=1e-12)
        assert fit_temperature(logits, labels, bounds=(1e-300, 1e300), tol=1e-300) == \
            pytest.approx(1 / math.log(3.0), rel=1e-12)
        for bounds in ((1e-3, math.inf), (math.nan, 1.0), (2.0, 1.0)):
            with pytest.raises(ValueError, match="bounds"):
                fit_temperature(logits, labels, bounds=bounds)


def test_ece_by_hand():
    # bins (.8, .9]: conf .85, acc 1 ; (.6, .7]: conf .65, acc .5 -> ECE = .5 * .15 + .5 * .15
    assert ece(PROBS, LABELS, n_bins=10) == pytest.approx(0.15)
    assert ece(PROBS, LABELS, n_bins=2, strategy="quantile") == pytest.approx(0.15)
    assert ece(PROBS, LABELS, n_bins=1) == pytest.approx(0.0)   # mean conf .75 = accuracy .75
    d = reliability_diagram(PROBS, LABELS, n_bins=10)
    assert d.count.tolist() == [0, 0, 0, 0, 0, 0, 2, 0, 2, 0]
    assert d.accuracy[6].item() == 0.5 and d.accuracy[8].item() == 1.0
    assert math.isnan(d.confidence[0].item())
    torch.testing.assert_close(d.edges, torch.linspace(0, 1, 11, dtype=torch.float64))


def test_classwise_ece_by_hand():
    # class 0: p = .85 .15 .65 .35 vs label==0: 1 0 1 1 -> gaps .15 .15 .35 .65 in separate bins
    # class 1 mirrors it; mean = (.15 + .15 + .35 + .65) / 4
    assert classwise_ece(PROBS, LABELS, n_bins=10) == pytest.approx(1.3 / 4)


def test_ece_matches_a_direct_loop():
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(2 * torch.randn(500, 4, generator=gen, dtype=torch.float64), 1)
    labels = torch.randint(0, 4, (500,), generator=gen)
    conf, pred = probs.max(1)
    hits = (pred == labels).double()
    total = 0.0
    for b in range(15):
        lo, hi = b / 15, (b + 1) / 15
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            total += sel.double().mean().item() * abs(hits[sel].mean().item() - conf[sel].mean().item())
    assert ece(probs, labels) == pytest.approx(total, abs=1e-12)
    q = reliability_diagram(probs, labels, n_bins=10, strategy="quantile")
    assert q.count.tolist() == [50] * 10


def test_bad_input():
    with pytest.raises(ValueError, match="n_bins"):
        ece(PROBS, LABELS, n_bins=0)
    with pytest.raises(ValueError, match="strategy"):
        ece(PROBS, LABELS, strategy="equal")
    with pytest.raises(ValueError, match="sum to one"):
        ece(PROBS * 2, LABELS)
    with pytest.raises(ValueError, match="non-negative"):
        classwise_ece(PROBS - 0.5, LABELS)
    with pytest.raises(ValueError, match="labels"):
        ece(PROBS, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="labels"):
        reliability_diagram(PROBS, LABELS[:3])
    with pytest.raises(TypeError, match="labels"):
        fit_temperature(PROBS, np.array([0, 1, 0, 0]))
    with pytest.raises(ValueError, match="logits"):
        fit_temperature(torch.zeros(4), LABELS)
    with pytest.raises(ValueError, match="bounds"):
        fit_temperature(PROBS, LABELS, bounds=(2.0, 1.0))


def test_fit_temperature_recovers_the_temperature_labels_were_drawn_at():
    gen = torch.Generator().manual_seed(5)
    logits = 2 * torch.randn(2000, 5, generator=gen, dtype=torch.float64)
    for true_t in (0.5, 2.0):
        labels = torch.multinomial(torch.softmax(logits / true_t, 1), 1, generator=gen).squeeze(1)
        assert fit_temperature(logits, labels) == pytest.approx(true_t, rel=0.15)


@pytest.mark.parametrize(("bounds", "error"), [(None, TypeError), ((1.0,), TypeError), (("a", "b"), TypeError),
                                               ((1.0, math.inf), ValueError), ((2.0, 1.0), ValueError),
                                               (torch.tensor(0.5), TypeError)])
def test_fit_temperature_names_bad_bounds(bounds, error):
    """Hostile audit, 2026-12-02: None or a 1-tuple failed in tuple unpacking, strings in ``<``.
    Hostile sweep: a 0-d tensor raised "len() of a 0-d tensor"."""
    logits = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match="bounds"):
        fit_temperature(logits, torch.arange(10) % 3, bounds=bounds)



def test_quantile_bins_do_not_use_torch_quantile(monkeypatch):
    """Hostile sweep: strategy="quantile" took its edges from torch.quantile, which raises "quantile()
    input tensor is too large" past 2^24 values (a token-level calibration set; here torch's refusal
    is simulated for any size: a real one costs 1.3 GB)."""
    def refuse(*args, **kwargs):
        raise RuntimeError("quantile() input tensor is too large")

    monkeypatch.setattr(torch, "quantile", refuse)
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]], dtype=torch.float64).repeat(1000, 1)
    labels = torch.tensor([0, 1, 1]).repeat(1000)
    # one confidence per bin: gaps 0.6 (0.6, wrong), 0.3 (0.7, right), 0.1 (0.9, right)
    assert ece(probs, labels, n_bins=3, strategy="quantile") == pytest.approx((0.6 + 0.3 + 0.1) / 3)
    assert classwise_ece(probs, labels, n_bins=3, strategy="quantile") >= 0


def test_quantile_edges_equal_torch_quantile_at_any_size():
    from softmaxkit.scores.calibration import _quantiles

    g = torch.Generator().manual_seed(0)
    q = torch.linspace(0.0, 1.0, 16, dtype=torch.float64)
    for n in (1, 2, 7, 1000):
        values = torch.rand(n, generator=g, dtype=torch.float64)
        values[: n // 3] = 0.5   # ties
        assert torch.equal(_quantiles(values, q), torch.quantile(values, q))
    n = 2**24 + 1
    torch.testing.assert_close(_quantiles(torch.arange(n, dtype=torch.float64), q), q * (n - 1))


def test_fit_temperature_takes_minus_inf_as_a_masked_class():
    """``-inf`` logits are masked classes, as ``nll`` and softmax take them: the fitted
    temperature is that of the visible classes (it raised 'logits must be finite'; found by a
    hostile sweep, 2026-12-04). A label on a masked class, or a ``+inf`` logit, is refused."""
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 6, (400,), generator=g)
    logits = torch.randn(400, 6, generator=g, dtype=torch.float64) * 2
    logits[torch.arange(400), labels] += 1.5
    masked = torch.cat([logits, torch.full((400, 2), -math.inf, dtype=torch.float64)], 1)
    assert fit_temperature(masked, labels) == pytest.approx(fit_temperature(logits, labels), rel=1e-9)
    assert nll(masked, labels) == pytest.approx(nll(logits, labels), rel=1e-12)
    bad = masked.clone()
    bad[0, labels[0]] = -math.inf
    with pytest.raises(ValueError, match="masked class"):
        fit_temperature(bad, labels)
    bad = masked.clone()
    bad[0, 7] = math.inf
    with pytest.raises(ValueError, match="logits"):
        fit_temperature(bad, labels)
