"""Arena e: Soft-NMS against NMS, AP at IoU 0.5 on synthetic crowded scenes.

Bodla et al. (2017, arXiv 1704.04503) report that replacing NMS by Soft-NMS in standard
detectors raises mAP by 1.1 to 1.7 points on PASCAL VOC 2007 / MS-COCO, with no retraining
and the same complexity, and that the gain comes from overlapping objects: NMS deletes the
best detection of an object that overlaps a higher-scored neighbour by more than N_t.

We cannot run a detector on COCO here, so the scenes and the detector are simulated, with
every choice fixed in advance and applied identically to each method:

* a scene is a 640 x 480 image with 4 to 12 objects of 40 to 160 pixels. With probability
  ``crowding`` an object is placed next to an earlier one, shifted by 25 to 70% of its
  size in x and/or y (IoU with its neighbour roughly 0.2 to 0.6, as in crowds of people or
  parked cars); otherwise anywhere. Three crowding levels: 0, 0.4 and 0.8;
* the simulated detector fires 1 + Poisson(4) boxes per object: the object's box with
  its centre moved by N(0, j * size) and its width and height scaled by exp(N(0, j)),
  for a localisation noise j of 0.08 (a tight detector) or 0.16 (a loose one), scored
  ``sigmoid(logit(c) + 6 (IoU_with_object - 0.75) + N(0, 0.5))``
  with ``c ~ U(0.5, 0.95)`` the object's visibility, so tighter boxes score higher on
  average; 10% of objects are hard (c ~ U(0.05, 0.4)). Plus Poisson(3) background false
  positives per image of random size and place, scored U(0, 0.5);
* AP@0.5 is the PASCAL VOC all-point AP: detections of all images sorted by score, each
  matched to the ground-truth box of highest IoU in its image, a true positive if that IoU
  is >= 0.5 and the box is not yet matched, a false positive otherwise; AP is the area
  under the precision envelope.

The methods: NMS at N_t = 0.3 (the baseline in the paper's tables) and N_t = 0.5,
Soft-NMS linear (N_t = 0.3) and gaussian (sigma = 0.5), all through
:func:`softmaxkit.ops.soft_nms` with score threshold 0.001. The simulation decides the
absolute numbers; what the task shows is how the NMS - Soft-NMS gap moves with crowding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._table import Table
from ..ops import soft_nms

CLAIM = ("Soft-NMS improves mAP over NMS by +1.1 to +1.7 points (PASCAL VOC / MS-COCO, standard detectors) "
         "at the same complexity, by decaying rather than deleting overlapping detections "
         "(Bodla et al. 2017, arXiv 1704.04503).")

WIDTH, HEIGHT = 640.0, 480.0
CROWDING = (0.0, 0.4, 0.8)
JITTER = (0.08, 0.16)
METHODS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("NMS (N_t=0.3)", {"method": "hard", "iou_threshold": 0.3}),
    ("NMS (N_t=0.5)", {"method": "hard", "iou_threshold": 0.5}),
    ("Soft-NMS linear (N_t=0.3)", {"method": "linear", "iou_threshold": 0.3}),
    ("Soft-NMS gaussian (sigma=0.5)", {"method": "gaussian", "sigma": 0.5}),
)
BASELINE = "NMS (N_t=0.3)"


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` (n, 4) with every box in ``b`` (m, 4), x1 y1 x2 y2."""
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(w, 0, None) * np.clip(h, 0, None)

    def area(x: np.ndarray) -> np.ndarray:
        return (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def make_scene(g: np.random.Generator, crowding: float) -> np.ndarray:
    """Ground-truth boxes (n, 4) of one image."""
    boxes: list[np.ndarray] = []
    for _ in range(int(g.integers(4, 13))):
        w, h = g.uniform(40, 160, 2)
        if boxes and g.random() < crowding:
            nx1, ny1, nx2, ny2 = boxes[int(g.integers(len(boxes)))]
            cx, cy = (nx1 + nx2) / 2, (ny1 + ny2) / 2
            shift = g.uniform(0.25, 0.7, 2) * np.array([nx2 - nx1, ny2 - ny1]) * g.choice([-1, 1], 2)
            shift *= [1, 0] if g.random() < 0.4 else ([0, 1] if g.random() < 0.5 else [1, 1])
            cx, cy = cx + shift[0], cy + shift[1]
        else:
            cx, cy = g.uniform(w / 2, WIDTH - w / 2), g.uniform(h / 2, HEIGHT - h / 2)
        box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
        box = np.clip(box, 0, [WIDTH, HEIGHT, WIDTH, HEIGHT])
        if box[2] - box[0] > 10 and box[3] - box[1] > 10:
            boxes.append(box)
    return np.array(boxes)


def detect(g: np.random.Generator, truth: np.ndarray, jitter: float) -> tuple[np.ndarray, np.ndarray]:
    """The simulated detector's raw boxes and scores for one image (see the module docstring)."""
    boxes, scores = [], []
    for box in truth:
        size = box[2:] - box[:2]
        centre = (box[:2] + box[2:]) / 2
        visibility = g.uniform(0.05, 0.4) if g.random() < 0.1 else g.uniform(0.5, 0.95)
        k = 1 + int(g.poisson(4))
        centres = centre + g.normal(0, jitter, (k, 2)) * size
        sizes = size * np.exp(g.normal(0, jitter, (k, 2)))
        dets = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1)
        dets = np.clip(dets, 0, [WIDTH, HEIGHT, WIDTH, HEIGHT])
        quality = pairwise_iou(dets, box[None])[:, 0]
        logit = np.log(visibility / (1 - visibility)) + 6 * (quality - 0.75) + g.normal(0, 0.5, k)
        boxes.append(dets)
        scores.append(1 / (1 + np.exp(-logit)))
    n_fp = int(g.poisson(3))
    if n_fp:
        sizes = g.uniform(30, 160, (n_fp, 2))
        corners = g.uniform(0, 1, (n_fp, 2)) * (np.array([WIDTH, HEIGHT]) - sizes)
        boxes.append(np.concatenate([corners, corners + sizes], axis=1))
        scores.append(g.uniform(0, 0.5, n_fp))
    boxes_all = np.concatenate(boxes)
    keep = (boxes_all[:, 2] > boxes_all[:, 0]) & (boxes_all[:, 3] > boxes_all[:, 1])
    return boxes_all[keep], np.concatenate(scores)[keep]


def average_precision(detections: list[tuple[np.ndarray, np.ndarray]], truths: list[np.ndarray],
                      iou_threshold: float = 0.5) -> float:
    """PASCAL VOC all-point AP over all images (see the module docstring)."""
    records: list[tuple] = []  # (score, image, best IoU, best ground truth)
    for image, ((boxes, scores), truth) in enumerate(zip(detections, truths)):
        if len(boxes) == 0:
            continue
        iou = pairwise_iou(boxes, truth)
        best = iou.argmax(1)
        records += zip(scores.tolist(), [image] * len(boxes), iou[np.arange(len(boxes)), best].tolist(), best.tolist())
    n_truth = sum(len(t) for t in truths)
    records.sort(key=lambda r: -r[0])
    matched = [np.zeros(len(t), bool) for t in truths]
    tp = np.zeros(len(records))
    for i, (_, image, iou, j) in enumerate(records):
        if iou >= iou_threshold and not matched[image][j]:
            matched[image][j] = True
            tp[i] = 1
    cum_tp = np.cumsum(tp)
    recall = cum_tp / n_truth
    precision = cum_tp / np.arange(1, len(records) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    return float(np.sum(np.diff(np.concatenate([[0.0], recall])) * envelope))


def evaluate(crowding: float, jitter: float, n_images: int, seed: int) -> dict[str, float]:
    """AP@0.5 (in points, 0-100) per method on ``n_images`` scenes at one crowding and noise level."""
    g = np.random.default_rng([seed, int(crowding * 100), int(jitter * 100)])
    truths, raw = [], []
    for _ in range(n_images):
        truth = make_scene(g, crowding)
        truths.append(truth)
        raw.append(detect(g, truth, jitter))
    aps = {}
    for label, params in METHODS:
        detections = []
        for boxes, scores in raw:
            keep, kept = soft_nms(torch.from_numpy(boxes), torch.from_numpy(scores), score_threshold=0.001, **params)
            detections.append((boxes[keep.numpy()], kept.numpy()))
        aps[label] = 100 * average_precision(detections, truths)
    return aps


def run(quick: bool = False, seed: int = 0) -> list[Table]:
    n_images = 150 if quick else 600
    table = Table(
        title=f"Soft-NMS vs NMS: AP@0.5 (points) on synthetic scenes, {n_images} images per row",
        columns=["box noise", "crowding", *[label for label, _ in METHODS],
                 "best Soft-NMS - NMS(0.3)", "best Soft-NMS - best NMS"],
        claim=CLAIM,
    )
    results, vs_baseline, vs_best = {}, {}, {}
    for jitter in JITTER:
        for crowding in CROWDING:
            aps = evaluate(crowding, jitter, n_images, seed)
            results[(jitter, crowding)] = aps
            best_soft = max(aps[label] for label, p in METHODS if p["method"] != "hard")
            best_nms = max(aps[label] for label, p in METHODS if p["method"] == "hard")
            vs_baseline[(jitter, crowding)] = best_soft - aps[BASELINE]
            vs_best[(jitter, crowding)] = best_soft - best_nms
            table.add(jitter, crowding, *[aps[label] for label, _ in METHODS], best_soft - aps[BASELINE],
                      best_soft - best_nms)

    def fmt(d: dict) -> str:
        return ", ".join(f"{v:+.2f}" for v in d.values())
    in_range = sum(1.1 <= v <= 1.7 for v in vs_baseline.values())
    table.verdict = (
        f"Best Soft-NMS minus NMS at N_t = 0.3 (the paper's baseline), rows in order: {fmt(vs_baseline)} AP points "
        f"({in_range} of {len(vs_baseline)} rows inside the claimed +1.1 to +1.7; "
        f"{sum(v > 0 for v in vs_baseline.values())} rows positive). Against the best NMS threshold tried "
        f"(N_t = 0.3 or 0.5, chosen on the test data itself): {fmt(vs_best)}. "
        + ("Soft-NMS's advantage over tuned NMS grows with crowding here."
           if all(vs_best[(j, CROWDING[-1])] > vs_best[(j, CROWDING[0])] for j in JITTER)
           else "Soft-NMS's advantage over tuned NMS does not grow with crowding in every noise setting here.")
    )
    # held: every row inside the claimed +1.1 to +1.7 AP; partly: Soft-NMS ahead of NMS(0.3) in some rows
    # (inside the range or not); did not hold: never ahead
    ahead = [v > 0 for v in vs_baseline.values()]
    table.status = "held" if in_range == len(vs_baseline) else "partly" if any(ahead) else "did not hold"
    table.notes = (f"Simulated detector and scenes (module docstring of softmaxkit.arena.soft_nms); seed {seed}; "
                   "score threshold 0.001; no cap on detections per image. Absolute APs depend on the simulation; "
                   "the differences between methods on the same detections are the measurement.")
    table.add_figure("soft_nms_ap", lambda: _figure(results))
    return [table]


def _figure(results: dict[tuple[float, float], dict[str, float]]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(JITTER), figsize=(10, 4), sharey=True)
    from ._plot import line_style

    for ax, jitter in zip(axes, JITTER):
        for i, (label, _) in enumerate(METHODS):
            ax.plot(CROWDING, [results[(jitter, c)][label] for c in CROWDING], label=label, **line_style(i))
        ax.set_xlabel("crowding (probability an object\nis placed against another)")
        ax.set_ylabel("AP@0.5 (points)")
        ax.set_title(f"box noise {jitter}")
    axes[0].legend(fontsize=8)
    fig.suptitle("Soft-NMS vs NMS on synthetic scenes")
    fig.tight_layout()
    return fig
