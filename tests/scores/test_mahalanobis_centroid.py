"""Mahalanobis and softmax-centroid scores on cases whose answer is known by hand."""

import math

import pytest
import torch

from softmaxkit.scores import CentroidDistance, Mahalanobis, centroid_distance, fit_centroids

# class 0 at (+-1, 0), (0, +-1) around (0, 0); class 1 the same around (10, 0).
# Pooled MLE covariance: scatter diag(2, 2) per class, 8 samples -> 0.5 I.
OFFSETS = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
FEATURES = torch.cat([OFFSETS, OFFSETS + torch.tensor([10.0, 0.0], dtype=torch.float64)])
LABELS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_mahalanobis_by_hand():
    m = Mahalanobis().fit(FEATURES, LABELS)
    torch.testing.assert_close(m.means_, torch.tensor([[0.0, 0.0], [10.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(m.covariance_, 0.5 * torch.eye(2, dtype=torch.float64))
    q = torch.tensor([[1.0, 1.0], [9.0, 0.0]], dtype=torch.float64)
    # (1,1): 2 / 0.5 = 4 to class 0 ; (9,0): 1 / 0.5 = 2 to class 1
    torch.testing.assert_close(m.score(q), torch.tensor([-4.0, -2.0], dtype=torch.float64))
    assert m.predict(q).tolist() == [0, 1]
    torch.testing.assert_close(m.distances(q)[0, 1], torch.tensor(82 / 0.5, dtype=torch.float64))


def test_mahalanobis_shrinkage_and_singular_covariance():
    # shrinkage 1: covariance tr/d * I = 0.5 I, as before
    m = Mahalanobis(shrinkage=1.0).fit(FEATURES, LABELS)
    torch.testing.assert_close(m.covariance_, 0.5 * torch.eye(2, dtype=torch.float64))
    # a third feature that never varies: the pseudo-inverse ignores it...
    flat = torch.cat([FEATURES, torch.zeros(8, 1, dtype=torch.float64)], 1)
    q = torch.tensor([[1.0, 1.0, 5.0]], dtype=torch.float64)
    assert Mahalanobis().fit(flat, LABELS).score(q).item() == pytest.approx(-4.0)
    # ...shrinkage counts it: cov = 0.9 diag(.5,.5,0) + 0.1 (1/3) I
    lam = 0.1
    diag = [0.9 * 0.5 + lam / 3, 0.9 * 0.5 + lam / 3, lam / 3]
    want = -(1 / diag[0] + 1 / diag[1] + 25 / diag[2])
    assert Mahalanobis(shrinkage=lam).fit(flat, LABELS).score(q).item() == pytest.approx(want)


def test_mahalanobis_bad_input():
    with pytest.raises(ValueError, match="shrinkage"):
        Mahalanobis(shrinkage=1.5)
    with pytest.raises(ValueError, match="labels"):
        Mahalanobis().fit(FEATURES, LABELS[:3])
    with pytest.raises(ValueError, match="class"):
        Mahalanobis().fit(FEATURES, LABELS, num_classes=3)
    with pytest.raises(RuntimeError, match="fit"):
        Mahalanobis().score(FEATURES)
    with pytest.raises(ValueError, match="columns"):
        Mahalanobis().fit(FEATURES, LABELS).score(torch.zeros(1, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="labels"):
        Mahalanobis().fit(FEATURES, LABELS.float())


def test_centroids_by_hand():
    # softmax([log 3, 0]) = [.75, .25]; softmax([0, log 3]) = [.25, .75]; softmax([log 4, 0]) = [.8, .2]
    l3, l4 = math.log(3.0), math.log(4.0)
    logits = torch.tensor([[l3, 0.0], [l4, 0.0], [0.0, l3], [l3, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1])   # the last row is a wrong prediction: excluded
    centroids = fit_centroids(logits, labels)
    torch.testing.assert_close(centroids, torch.tensor([[0.775, 0.225], [0.25, 0.75]], dtype=torch.float64))
    d = centroid_distance(logits[:1], centroids)
    assert d.item() == pytest.approx(math.sqrt(2) * 0.025)

    det = CentroidDistance().fit(logits, labels)
    # held-out rows predicted 0 at distances 0.025*sqrt2, 0.025*sqrt2, and predicted 1 at 0
    thresholds = det.fit_thresholds(logits, accept=0.5)
    assert thresholds.tolist() == pytest.approx([0.025 * math.sqrt(2), 0.0])
    far = torch.tensor([[0.0, 0.0]], dtype=torch.float64)   # softmax (.5, .5), predicted 0
    assert det.accept(torch.cat([logits[:1], far])).tolist() == [True, False]


def test_centroid_bad_input():
    logits = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="class"):
        fit_centroids(logits, torch.tensor([0, 1]))   # class 1 never predicted correctly
    with pytest.raises(ValueError, match="labels"):
        fit_centroids(logits, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="centroids"):
        centroid_distance(logits, torch.zeros(3, 3))
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    det = CentroidDistance().fit(two, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="accept"):
        det.fit_thresholds(two, accept=1.5)
    with pytest.raises(RuntimeError, match="fit_thresholds"):
        det.accept(two)
    with pytest.warns(RuntimeWarning, match="never predicted"):
        det.fit_thresholds(logits)   # class 1 never predicted: pooled threshold


@pytest.mark.parametrize("scale", [1e200, 1e-200, 2.0**-1000])
def test_mahalanobis_is_scale_invariant_at_extreme_magnitudes(scale):
    """Hostile sweep: at features of 1e200 the covariance overflowed (eigh raised a LinAlgError),
    at 1e-200 it underflowed to 0 and every direction was ignored (every score 0)."""
    q = torch.tensor([[1.0, 1.0], [9.0, 0.0]], dtype=torch.float64)
    m = Mahalanobis().fit(FEATURES * scale, LABELS)
    torch.testing.assert_close(m.score(q * scale), torch.tensor([-4.0, -2.0], dtype=torch.float64))
    assert m.predict(q * scale).tolist() == [0, 1]
    torch.testing.assert_close(m.means_, torch.tensor([[0.0, 0.0], [10.0, 0.0]], dtype=torch.float64) * scale)
    shrunk = Mahalanobis(shrinkage=0.5).fit(FEATURES * scale, LABELS)
    torch.testing.assert_close(shrunk.score(q * scale), Mahalanobis(shrinkage=0.5).fit(FEATURES, LABELS).score(q))


def test_centroid_threshold_counts_like_fpr_at_tpr():
    """Hostile sweep: ceil(accept * n - 1e-12) kept one row too many where accept * n rounds above
    an integer by more than 1e-12 (0.56 * 34150 = 19124.000000000004 -> 19125 rows); and a NumPy
    float32 accept was refused."""
    import numpy as np

    train = torch.tensor([[2.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    det = CentroidDistance().fit(train, torch.tensor([0, 1]))
    n = 34150
    heldout = torch.stack([torch.linspace(0.5, 8.0, n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)], 1)
    distances = np.sort(det.distance(heldout).numpy())
    assert len(np.unique(distances)) == n
    with pytest.warns(RuntimeWarning, match="never predicted"):
        thresholds = det.fit_thresholds(heldout, accept=0.56)
    assert thresholds[0].item() == distances[19124 - 1]
    with pytest.warns(RuntimeWarning, match="never predicted"):
        assert det.fit_thresholds(heldout, accept=np.float32(0.5))[0].item() == distances[n // 2 - 1]


def test_mahalanobis_score_is_differentiable_in_the_features():
    """Hostile sweep: score() detached its input, so the input pre-processing the docstring leaves to
    the caller (Lee et al. step along the gradient of the score) raised "does not require grad"."""
    m = Mahalanobis(shrinkage=0.1).fit(FEATURES, LABELS)
    q = torch.tensor([[1.0, 1.0], [9.0, 0.5]], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(m.score, (q,))
    # by hand: d/dq of -(q - mu)^T S^-1 (q - mu) = -2 S^-1 (q - mu), nearest mean
    (grad,) = torch.autograd.grad(m.score(q).sum(), q)
    inverse = torch.linalg.inv(m.covariance_)
    want = -2 * (q.detach() - m.means_[[0, 1]]) @ inverse
    torch.testing.assert_close(grad, want)
    assert m.score(q.float()).dtype == torch.float64 and m.score(q.detach()).grad_fn is None
