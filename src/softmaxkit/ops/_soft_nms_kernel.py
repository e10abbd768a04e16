"""The numba kernel behind :func:`softmaxkit.ops.soft_nms` (float64, single thread).

Greedy Soft-NMS that visits only the boxes that can matter, instead of the textbook
loop's O(N^2) IoU evaluations:

* boxes come sorted by x1. A box j can overlap box b only if
  ``x1_b - max_width < x1_j < x2_b``, a range found by binary search, and only that range
  is visited, first with a cheap overlap test over the whole range. A pair that does not
  overlap has IoU 0 and decay weight exactly 1, so skipping it changes nothing. Once half
  the boxes are gone, the arrays are compacted to the live ones;
* the highest current score is found through per-block maxima (blocks of ``BLOCK``
  consecutive boxes). Scores only decrease, so a block's best box stays its best unless
  that very box decays or goes: only then is the block marked stale, and it is rescanned
  before the next selection. Ties go to the lower original index;
* a box whose score falls to ``score_threshold`` or below is dropped at once: scores only
  decrease, so it could never be kept, and it could only have decayed boxes that are
  already below the threshold themselves.

The IoU and the decay are written operation for operation as in the textbook loop, so the
scores agree with it to the last bits, except where the textbook union overflows or falls
below the smallest normal float (boxes of extent beyond 1e154 or below 1e-154, where the
textbook IoU is NaN or 0 / 0): there it is formed from ratios to one box's sides
(:func:`_iou_by_ratios`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

HARD, LINEAR, GAUSSIAN = 0, 1, 2
BLOCK = 64
#: The smallest normal float64: a union below it has lost digits (or is 0).
_TINY = 2.2250738585072014e-308


@njit(cache=True, nogil=True)
def _iou_by_ratios(w, h, wb, hb, wj, hj):
    """IoU of boxes ``b`` (sides ``wb, hb``) and ``j`` overlapping by ``w x h`` (all > 0), from the
    ratios to ``b``'s sides: ``r / (1 + a - r)`` with ``r = inter / area_b <= 1``, ``a = area_j /
    area_b``, neither of which overflows where the areas themselves do (or underflow)."""
    r = (w / wb) * (h / hb)
    a = (wj / wb) * (hj / hb)
    return r / (1.0 + a - r)


@njit(cache=True, nogil=True)
def _first_above(sorted_values, value, stop):
    """The first position ``p < stop`` with ``sorted_values[p] > value`` (``stop`` if none)."""
    lo, hi = 0, stop
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_values[mid] > value:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, nogil=True)
def soft_nms_kernel(boxes, scores, labels, rank, method, iou_threshold, sigma, score_threshold):
    """Soft-NMS over boxes sorted by x1.

    ``boxes`` (N, 4) float64 x1 y1 x2 y2 sorted by x1, ``scores`` (N,) float64 (used as work
    space), ``labels`` (N,) int64 (boxes with different labels never interact), ``rank``
    (N,) int64 the original index of each box (for ties and for the result). Returns (kept
    original indices in selection order, their scores at selection).
    """
    n = boxes.shape[0]
    x1 = boxes[:, 0].copy()
    y1 = boxes[:, 1].copy()
    x2 = boxes[:, 2].copy()
    y2 = boxes[:, 3].copy()
    score = scores
    area = (x2 - x1) * (y2 - y1)
    max_width = 0.0
    for s in range(n):
        max_width = max(max_width, x2[s] - x1[s])
    alive = score > score_threshold
    n_alive = 0
    for s in range(n):
        n_alive += alive[s]

    n_blocks = (n + BLOCK - 1) // BLOCK
    block_best = np.empty(n_blocks, np.int64)
    stale = np.ones(n_blocks, np.bool_)
    overlaps = np.empty(n, np.bool_)
    kept = np.empty(n, np.int64)
    kept_scores = np.empty(n, np.float64)
    n_kept = 0
    while True:
        if n > 4 * BLOCK and n_alive < n // 2:  # drop the dead boxes so that scans skip them
            x1, y1, x2, y2 = x1[alive], y1[alive], x2[alive], y2[alive]
            score, labels, rank, area = score[alive], labels[alive], rank[alive], area[alive]
            n = n_alive
            alive = np.ones(n, np.bool_)
            max_width = 0.0
            for s in range(n):
                max_width = max(max_width, x2[s] - x1[s])
            n_blocks = (n + BLOCK - 1) // BLOCK
            stale = np.ones(n_blocks, np.bool_)
        b = -1
        for k in range(n_blocks):
            if stale[k]:
                best = -1
                for s in range(k * BLOCK, min(k * BLOCK + BLOCK, n)):
                    if alive[s] and (best < 0 or score[s] > score[best]
                                     or (score[s] == score[best] and rank[s] < rank[best])):
                        best = s
                block_best[k] = best
                stale[k] = False
            s = block_best[k]
            if s >= 0 and (b < 0 or score[s] > score[b] or (score[s] == score[b] and rank[s] < rank[b])):
                b = s
        if b < 0:
            break
        alive[b] = False
        n_alive -= 1
        stale[b // BLOCK] = True
        kept[n_kept] = rank[b]
        kept_scores[n_kept] = score[b]
        n_kept += 1

        hi = _first_above(x1, x2[b], n)
        lo = _first_above(x1, x1[b] - max_width, hi)
        bx1, by1, bx2, by2, blabel = x1[b], y1[b], x2[b], y2[b], labels[b]
        for j in range(lo, hi):  # vectorisable: most boxes in the range do not overlap b
            overlaps[j - lo] = ((min(bx2, x2[j]) > max(bx1, x1[j])) & (min(by2, y2[j]) > max(by1, y1[j]))
                                & alive[j] & (labels[j] == blabel))
        for j in range(lo, hi):
            if not overlaps[j - lo]:
                continue
            w = min(bx2, x2[j]) - max(bx1, x1[j])
            h = min(by2, y2[j]) - max(by1, y1[j])
            inter = w * h
            union = area[b] + area[j] - inter
            if union >= _TINY and union < np.inf:
                iou = inter / union
            else:   # an area overflowed (inf - inf) or underflowed: both boxes have positive sides here
                iou = _iou_by_ratios(w, h, bx2 - bx1, by2 - by1, x2[j] - x1[j], y2[j] - y1[j])
            if method == HARD:
                if iou > iou_threshold:
                    alive[j] = False
                    n_alive -= 1
                    if block_best[j // BLOCK] == j:
                        stale[j // BLOCK] = True
                continue
            if method == LINEAR:
                if iou <= iou_threshold:
                    continue
                score[j] = (1.0 - iou) * score[j]
            else:
                score[j] = np.exp(-(iou * iou) / sigma) * score[j]
            if score[j] <= score_threshold:
                alive[j] = False
                n_alive -= 1
            if block_best[j // BLOCK] == j:
                stale[j // BLOCK] = True
    return kept[:n_kept], kept_scores[:n_kept]
