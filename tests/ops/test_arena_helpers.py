"""The measuring code of the ops arena tasks (AP@0.5, nDCG@10, the negation set) on hand cases."""

import math

import numpy as np
import pytest
import torch

from softmaxkit.arena import negation
from softmaxkit.arena import soft_nms as soft_nms_task


def test_average_precision_by_hand():
    truth = [np.array([[0.0, 0, 10, 10], [20, 20, 30, 30]])]
    perfect = [(truth[0].copy(), np.array([0.9, 0.8]))]
    assert soft_nms_task.average_precision(perfect, truth) == pytest.approx(1.0)
    # a duplicate of the first object ranked between the two hits: precision 1, 1/2, 2/3
    dets = [(np.array([[0.0, 0, 10, 10], [0.5, 0, 10, 10], [20, 20, 30, 30]]), np.array([0.9, 0.85, 0.8]))]
    assert soft_nms_task.average_precision(dets, truth) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    # a box with IoU < 0.5 is a false positive; a missed object caps recall
    miss = [(np.array([[0.0, 0, 4, 10]]), np.array([0.9]))]
    assert soft_nms_task.average_precision(miss, truth) == 0.0


def test_pairwise_iou_and_scene_generation():
    a = np.array([[0.0, 0, 10, 10]])
    b = np.array([[0.0, 0, 10, 5], [10, 10, 20, 20]])
    np.testing.assert_allclose(soft_nms_task.pairwise_iou(a, b), [[0.5, 0.0]])
    g = np.random.default_rng(0)
    truth = soft_nms_task.make_scene(g, crowding=0.8)
    boxes, scores = soft_nms_task.detect(g, truth, jitter=0.08)
    assert len(truth) >= 1 and len(boxes) >= len(truth)
    assert np.all(boxes[:, 2] > boxes[:, 0]) and np.all((scores >= 0) & (scores <= 1))


def test_ndcg_by_hand():
    relevant = torch.tensor([[True, False, True] + [False] * 9])
    perfect = torch.tensor([[3.0, 1, 2] + [0.0] * 9])
    assert negation.ndcg_at_10(perfect, relevant).item() == pytest.approx(1.0)
    swapped = torch.tensor([[2.0, 3, 1] + [0.0] * 9])  # ranks: doc 1, doc 0, doc 2
    expected = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert negation.ndcg_at_10(swapped, relevant).item() == pytest.approx(expected)


def test_negation_set_has_the_promised_structure():
    g = torch.Generator().manual_seed(0)
    queries, docs = negation.build_set(3, g)
    contents = [set(d) for d in docs]
    for a, b, c in queries:
        relevant = [s for s in contents if a in s and b in s and c not in s]
        twins = [s for s in contents if a in s and b in s and c in s]
        assert len(relevant) >= negation.PAIRS and len(twins) >= negation.PAIRS
        assert sum((r | {c}) in twins for r in relevant) >= negation.PAIRS  # each pair: a doc and its twin + C
