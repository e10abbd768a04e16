"""Soft-NMS against ensemble-boxes' loop, a textbook loop on adversarial scenes, plain NMS, per-class batching."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softmaxkit.ops import batched_soft_nms, soft_nms

ensemble_nms = pytest.importorskip("ensemble_boxes.ensemble_boxes_nms")

ENSEMBLE_METHOD = {"linear": 1, "gaussian": 2, "hard": 3}


def random_scene(n, seed, crowded=False):
    """Boxes inside [0, 1]^2 with positive area, scores in (0.002, 1)."""
    g = np.random.default_rng(seed)
    if crowded:  # a few objects, many jittered detections of each
        centres = g.uniform(0.2, 0.8, (max(1, n // 15), 2))[g.integers(0, max(1, n // 15), n)]
        centres = centres + g.normal(0, 0.02, (n, 2))
    else:
        centres = g.uniform(0.05, 0.95, (n, 2))
    half = g.uniform(0.01, 0.1, (n, 2))
    boxes = np.concatenate([np.clip(centres - half, 0, 1), np.clip(centres + half, 0, 1)], axis=1)
    return boxes, g.uniform(0.002, 1.0, n)


def ensemble_soft_nms(boxes, scores, method, iou_threshold, sigma, score_threshold):
    """ensemble-boxes' Soft-NMS loop with the decayed scores it computes.

    ``ensemble_boxes.soft_nms`` returns the *original* scores of the kept boxes and first
    clips boxes to [0, 1] and drops zero-area ones; its inner ``cpu_soft_nms_float``
    decays the score array it is given in place, in its own (swapped) order, and returns
    the kept indices in selection order. So the decayed scores of the kept boxes are the
    entries of that array above the threshold, in the same order.
    """
    decayed = scores.copy()
    keep = ensemble_nms.cpu_soft_nms_float(boxes.copy(), decayed, Nt=iou_threshold, sigma=sigma,
                                           thresh=score_threshold, method=ENSEMBLE_METHOD[method])
    return np.asarray(keep, dtype=np.int64), decayed[decayed > score_threshold]


def plain_nms(boxes, scores, iou_threshold):
    """Textbook NMS: keep the best box, discard every box with IoU > threshold, repeat."""
    order = list(np.argsort(-scores, kind="stable"))
    keep = []
    while order:
        best = order.pop(0)
        keep.append(best)
        rest = []
        for j in order:
            w = min(boxes[best, 2], boxes[j, 2]) - max(boxes[best, 0], boxes[j, 0])
            h = min(boxes[best, 3], boxes[j, 3]) - max(boxes[best, 1], boxes[j, 1])
            inter = max(w, 0.0) * max(h, 0.0)
            area = lambda b: (b[2] - b[0]) * (b[3] - b[1])
            union = area(boxes[best]) + area(boxes[j]) - inter
            if not inter / union > iou_threshold:
                rest.append(j)
        order = rest
    return np.array(keep, dtype=np.int64)


@pytest.mark.parametrize("method", ["gaussian", "linear", "hard"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_ensemble_boxes(method, seed):
    boxes, scores = random_scene(150 + 40 * seed, seed, crowded=seed % 2 == 1)
    iou_threshold, sigma = (0.3, 0.5) if seed < 3 else (0.55, 0.2)
    keep, kept = soft_nms(torch.tensor(boxes), torch.tensor(scores), method=method,
                          iou_threshold=iou_threshold, sigma=sigma, score_threshold=0.001)
    ref_keep, ref_kept = ensemble_soft_nms(boxes, scores, method, iou_threshold, sigma, 0.001)
    assert keep.dtype == torch.int64
    np.testing.assert_array_equal(keep.numpy(), ref_keep)
    np.testing.assert_allclose(kept.numpy(), ref_kept, rtol=0, atol=1e-6)
    if method != "hard":
        assert (kept.numpy() < scores[keep.numpy()]).any()  # some scores were decayed


@pytest.mark.parametrize("method", ["gaussian", "linear", "hard"])
def test_matches_ensemble_boxes_on_a_large_scene(method):
    """1200 boxes: the kernel compacts its arrays once half the boxes are gone."""
    boxes, scores = random_scene(1200, 42, crowded=True)
    keep, kept = soft_nms(torch.tensor(boxes), torch.tensor(scores), method=method)
    ref_keep, ref_kept = ensemble_soft_nms(boxes, scores, method, 0.3, 0.5, 0.001)
    np.testing.assert_array_equal(keep.numpy(), ref_keep)
    np.testing.assert_allclose(kept.numpy(), ref_kept, rtol=0, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_hard_is_plain_nms(seed):
    boxes, scores = random_scene(120, 100 + seed, crowded=True)
    boxes = boxes * 640.0  # any scale, not only [0, 1]
    for threshold in (0.3, 0.5, 0.7):
        keep, kept = soft_nms(torch.tensor(boxes), torch.tensor(scores), method="hard",
                              iou_threshold=threshold, score_threshold=0.0)
        expected = plain_nms(boxes, scores, threshold)
        np.testing.assert_array_equal(keep.numpy(), expected)
        np.testing.assert_array_equal(kept.numpy(), scores[expected])


def test_float32_and_output_dtype():
    boxes, scores = random_scene(200, 7)
    keep64, kept64 = soft_nms(torch.tensor(boxes), torch.tensor(scores))
    keep32, kept32 = soft_nms(torch.tensor(boxes, dtype=torch.float32), torch.tensor(scores, dtype=torch.float32))
    assert kept32.dtype == torch.float32 and kept64.dtype == torch.float64
    assert torch.all(kept64[1:] <= kept64[:-1])
    assert (keep32 == keep64).float().mean() > 0.95


@pytest.mark.parametrize("method", ["gaussian", "linear", "hard"])
def test_batched_equals_per_class(method):
    boxes, scores = random_scene(300, 11, crowded=True)
    labels = np.random.default_rng(3).integers(0, 4, len(scores))
    keep, kept = batched_soft_nms(torch.tensor(boxes), torch.tensor(scores), torch.tensor(labels), method=method)
    kept_by_class = {}
    for c in range(4):
        idx = np.flatnonzero(labels == c)
        k, s = soft_nms(torch.tensor(boxes[idx]), torch.tensor(scores[idx]), method=method)
        kept_by_class.update(zip(idx[k.numpy()].tolist(), s.tolist()))
    assert sorted(keep.tolist()) == sorted(kept_by_class)
    np.testing.assert_allclose(kept.numpy(), [kept_by_class[i] for i in keep.tolist()], rtol=0, atol=1e-12)
    assert torch.all(kept[1:] <= kept[:-1])
    # classes do not interact: the same boxes in one class give a different answer
    assert len(keep) != len(soft_nms(torch.tensor(boxes), torch.tensor(scores), method=method)[0])


def test_decay_rules_by_hand():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 5.0], [20.0, 20.0, 30.0, 30.0]])
    scores = torch.tensor([0.9, 0.8, 0.7], dtype=torch.float64)
    iou = 0.5
    keep, kept = soft_nms(boxes, scores, method="linear", iou_threshold=0.3)
    assert keep.tolist() == [0, 2, 1]
    assert kept.tolist() == pytest.approx([0.9, 0.7, 0.8 * (1 - iou)])
    keep, kept = soft_nms(boxes, scores, method="linear", iou_threshold=0.5)  # rule is IoU > N_t
    assert kept.tolist() == pytest.approx([0.9, 0.8, 0.7])
    keep, kept = soft_nms(boxes, scores, method="gaussian", sigma=0.5)
    assert kept.tolist() == pytest.approx([0.9, 0.7, 0.8 * np.exp(-iou**2 / 0.5)])
    keep, kept = soft_nms(boxes, scores, method="hard", iou_threshold=0.4)
    assert keep.tolist() == [0, 2]


def test_ties_and_score_threshold():
    boxes = torch.tensor([[0.0, 0, 1, 1], [5, 5, 6, 6], [10, 10, 11, 11]])
    keep, _ = soft_nms(boxes, torch.tensor([0.5, 0.5, 0.5]))
    assert keep.tolist() == [0, 1, 2]
    keep, kept = soft_nms(boxes, torch.tensor([0.5, 0.001, 0.2], dtype=torch.float64), score_threshold=0.001)
    assert keep.tolist() == [0, 2]
    zero_area = torch.tensor([[1.0, 1, 1, 3], [1.0, 1, 1, 3]])  # zero-area boxes have IoU 0
    assert soft_nms(zero_area, torch.tensor([0.9, 0.8]))[1].tolist() == pytest.approx([0.9, 0.8])


def test_empty_inputs():
    keep, kept = soft_nms(torch.zeros(0, 4), torch.zeros(0))
    assert keep.shape == (0,) and keep.dtype == torch.int64 and kept.shape == (0,)
    keep, kept = batched_soft_nms(torch.zeros(0, 4), torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64))
    assert keep.shape == (0,) and kept.dtype == torch.float64


@pytest.mark.parametrize("kwargs, match", [
    (dict(boxes=torch.tensor([[2.0, 0, 1, 1]])), "boxes"),
    (dict(boxes=torch.tensor([[0.0, 2, 1, 1]])), "boxes"),
    (dict(boxes=torch.tensor([[0.0, 0, float("nan"), 1]])), "boxes"),
    (dict(boxes=torch.zeros(1, 5)), "boxes"),
    (dict(scores=torch.tensor([float("nan")])), "scores"),
    (dict(scores=torch.tensor([0.5, 0.5])), "scores"),
    (dict(scores=torch.tensor([-0.5])), "scores"),
    (dict(method="soft"), "method"),
    (dict(iou_threshold=1.5), "iou_threshold"),
    (dict(sigma=0.0), "sigma"),
    (dict(score_threshold=float("nan")), "score_threshold"),
])
def test_bad_input(kwargs, match):
    args = dict(boxes=torch.tensor([[0.0, 0, 1, 1]]), scores=torch.tensor([0.5]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        soft_nms(**args)


def test_bad_types_and_idxs():
    boxes, scores = torch.tensor([[0.0, 0, 1, 1]]), torch.tensor([0.5])
    with pytest.raises(TypeError, match="boxes"):
        soft_nms(boxes.numpy(), scores)
    with pytest.raises(TypeError, match="scores"):
        soft_nms(boxes, torch.tensor([1]))
    with pytest.raises(ValueError, match="idxs"):
        batched_soft_nms(boxes, scores, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="idxs"):
        batched_soft_nms(boxes, scores, torch.tensor([0.0]))
    # signed scores are fine for hard NMS
    assert soft_nms(boxes, torch.tensor([-0.5]), method="hard", score_threshold=-1.0)[0].tolist() == [0]


def test_tensors_without_values_are_refused_by_name():
    """Which boxes survive depends on the values: a meta or fake tensor gets a ValueError
    naming it (it was a RuntimeError from ``Tensor.item()``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    boxes, scores = torch.tensor([[0.0, 0, 1, 1]]), torch.tensor([0.5])
    with pytest.raises(ValueError, match="boxes must hold values"):
        soft_nms(boxes.to("meta"), scores.to("meta"))
    with pytest.raises(ValueError, match="scores must hold values"):
        soft_nms(boxes, scores.to("meta"))
    with pytest.raises(ValueError, match="idxs must hold values"):
        batched_soft_nms(boxes, scores, torch.zeros(1, dtype=torch.int64, device="meta"))
    with FakeTensorMode() as mode:
        fake_boxes = mode.from_tensor(boxes)
    with pytest.raises(ValueError, match="boxes must hold values .*fake"):
        soft_nms(fake_boxes, scores)


def textbook_soft_nms(boxes, scores, labels, method, iou_threshold, sigma, score_threshold):
    """The O(N^2) loop, one box at a time, ties to the lower index: the kernel's definition."""
    s = scores.astype(np.float64).copy()
    alive = s > score_threshold
    keep, kept = [], []
    while alive.any():
        candidates = np.flatnonzero(alive)
        b = candidates[np.argmax(s[candidates])]  # argmax: first of the tied maxima
        keep.append(b)
        kept.append(s[b])
        alive[b] = False
        for j in np.flatnonzero(alive):
            if labels[j] != labels[b]:
                continue
            w = min(boxes[b, 2], boxes[j, 2]) - max(boxes[b, 0], boxes[j, 0])
            h = min(boxes[b, 3], boxes[j, 3]) - max(boxes[b, 1], boxes[j, 1])
            if w <= 0 or h <= 0:
                continue
            inter = w * h
            area_b = (boxes[b, 2] - boxes[b, 0]) * (boxes[b, 3] - boxes[b, 1])
            area_j = (boxes[j, 2] - boxes[j, 0]) * (boxes[j, 3] - boxes[j, 1])
            iou = inter / (area_b + area_j - inter)
            if method == "hard":
                alive[j] = not iou > iou_threshold
                continue
            if method == "linear" and iou > iou_threshold:
                s[j] = (1.0 - iou) * s[j]
            elif method == "gaussian":
                s[j] = np.exp(-(iou * iou) / sigma) * s[j]
            alive[j] = s[j] > score_threshold
    return np.array(keep, dtype=np.int64), np.array(kept)


@st.composite
def adversarial_scenes(draw):
    """Small integer grids: identical boxes, zero-area boxes, touching edges and tied scores."""
    n = draw(st.integers(0, 30))
    corners = np.array(draw(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=n, max_size=n)),
                       dtype=np.float64).reshape(n, 2)
    sizes = np.array(draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=n, max_size=n)),
                     dtype=np.float64).reshape(n, 2)
    scores = np.array(draw(st.lists(st.sampled_from([0.0005, 0.2, 0.5, 0.5, 0.9, 1.0]), min_size=n, max_size=n)))
    labels = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), dtype=np.int64)
    return np.concatenate([corners, corners + sizes], axis=1), scores, labels


@settings(max_examples=40, deadline=None, derandomize=True)
@given(scene=adversarial_scenes(), method=st.sampled_from(["gaussian", "linear", "hard"]),
       iou_threshold=st.sampled_from([0.0, 0.3, 0.5]))
def test_matches_textbook_loop_on_adversarial_scenes(scene, method, iou_threshold):
    boxes, scores, labels = scene
    keep, kept = batched_soft_nms(torch.tensor(boxes), torch.tensor(scores), torch.tensor(labels), method=method,
                                  iou_threshold=iou_threshold, sigma=0.5, score_threshold=0.001)
    ref_keep, ref_kept = textbook_soft_nms(boxes, scores, labels, method, iou_threshold, 0.5, 0.001)
    np.testing.assert_array_equal(keep.numpy(), ref_keep)
    np.testing.assert_allclose(kept.numpy(), ref_kept, rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["gaussian", "linear", "hard"])
def test_ties_follow_the_documented_rule_not_ensemble_boxes_swaps(method):
    """With distinct scores the order equals ensemble-boxes'; with ties softmaxkit takes the
    lower index (the documented rule, README and docstring) where ensemble-boxes' swap loop
    takes a higher one."""
    boxes = np.array([[0.0, 0, 0.1, 0.1], [0.3, 0.3, 0.4, 0.4], [0.6, 0.6, 0.7, 0.7]])
    tied = np.array([0.5, 0.5, 0.9])
    keep, _ = soft_nms(torch.tensor(boxes), torch.tensor(tied), method=method)
    assert keep.tolist() == [2, 0, 1]
    assert ensemble_soft_nms(boxes, tied, method, 0.3, 0.5, 0.001)[0].tolist() == [2, 1, 0]
    distinct = np.array([0.5, 0.4, 0.9])
    keep, _ = soft_nms(torch.tensor(boxes), torch.tensor(distinct), method=method)
    assert keep.tolist() == ensemble_soft_nms(boxes, distinct, method, 0.3, 0.5, 0.001)[0].tolist() == [2, 0, 1]


@pytest.mark.parametrize("scale", [1e200, 1e-200, 1e-300, 2.0**1021])
@pytest.mark.parametrize("method", ["gaussian", "linear", "hard"])
def test_iou_at_extreme_scales(scale, method):
    """Hostile sweep: float64 boxes of extent 1e200 have areas of inf, 1e-200 of 0, and the
    union inf - inf = NaN or 0 made every IoU 0: nothing was suppressed or decayed."""
    boxes, scores = random_scene(40, seed=3, crowded=True)
    want_keep, want_kept = soft_nms(torch.tensor(boxes), torch.tensor(scores), method=method)
    keep, kept = soft_nms(torch.tensor(boxes) * scale, torch.tensor(scores), method=method)
    assert keep.tolist() == want_keep.tolist()
    torch.testing.assert_close(kept, want_kept, rtol=1e-12, atol=0)


def test_iou_of_boxes_spanning_the_float_range_and_tensor_arguments():
    # IoU([-1e308, 1e308]^2, [0, 1e308]^2) = 1/4: x2 - x1 overflowed to inf
    boxes = torch.tensor([[-1e308, -1e308, 1e308, 1e308], [0.0, 0.0, 1e308, 1e308]], dtype=torch.float64)
    scores = torch.tensor([0.9, 0.8], dtype=torch.float64)
    _, kept = soft_nms(boxes, scores, method="gaussian", sigma=0.5)
    torch.testing.assert_close(kept, torch.tensor([0.9, 0.8 * np.exp(-0.0625 / 0.5)], dtype=torch.float64))
    assert soft_nms(boxes, scores, method="hard", iou_threshold=0.2)[0].tolist() == [0]
    # a tensor holding one number is a number; one holding several raised "Boolean value of Tensor..."
    assert soft_nms(boxes, scores, method="hard", iou_threshold=torch.tensor(0.2))[0].tolist() == [0]
    for name in ("iou_threshold", "sigma", "score_threshold"):
        with pytest.raises(TypeError, match=name):
            soft_nms(boxes, scores, **{name: torch.tensor([0.3, 0.4])})
