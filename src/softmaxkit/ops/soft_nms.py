"""Soft-NMS: decay the scores of overlapping boxes instead of discarding them.

Bodla, Singh, Chellappa & Davis (2017), "Soft-NMS -- Improving Object Detection With
One Line of Code", arXiv 1704.04503.
"""

from __future__ import annotations

import numpy as np
import torch

from .._checks import FLOATING_DTYPES, check_number, has_no_data
from ._soft_nms_kernel import GAUSSIAN, HARD, LINEAR, soft_nms_kernel

METHODS = {"gaussian": GAUSSIAN, "linear": LINEAR, "hard": HARD}


def soft_nms(boxes: torch.Tensor, scores: torch.Tensor, method: str = "gaussian",
             iou_threshold: float = 0.3, sigma: float = 0.5,
             score_threshold: float = 0.001) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Soft non-maximum suppression.

    Greedy: take the box ``b`` with the highest current score, keep it, and decay the
    score of every remaining box ``i`` by its overlap with ``b``:

    .. math::
        s_i \leftarrow \begin{cases}
          s_i\,(1 - \mathrm{IoU}(b, i)) & \text{linear, if } \mathrm{IoU}(b, i) > N_t \\
          s_i\,\exp(-\mathrm{IoU}(b, i)^2 / \sigma) & \text{gaussian (every box)} \\
          0 & \text{hard (plain NMS), if } \mathrm{IoU}(b, i) > N_t
        \end{cases}

    Repeat until no box has a score above ``score_threshold``. Bodla et al. (2017),
    arXiv 1704.04503. The conventions are those of the authors' code and of
    ``ensemble_boxes``: IoU is ``area(b ∩ i) / area(b ∪ i)`` on continuous coordinates
    (no "+1"), the linear rule applies for IoU strictly above ``N_t``, gaussian decay
    applies to every box, and a box is kept if its score at selection is
    ``> score_threshold``. Ties in score go to the lower index: among boxes whose current
    (decayed) scores are exactly equal, the one first in ``boxes`` is selected. With
    distinct scores the selection equals ``ensemble_boxes``' loop; with ties it may not,
    since that loop swaps boxes into place and can then take a higher index first (e.g.
    scores ``(0.5, 0.5, 0.9)`` on disjoint boxes: ``[2, 0, 1]`` here, ``[2, 1, 0]`` there).

    Runs a numba kernel on the CPU in float64 (inputs on another device are copied to the
    CPU and the result copied back). Not differentiable: the outputs are detached.

    Args:
        boxes: (N, 4) ``x1, y1, x2, y2`` with ``x2 >= x1`` and ``y2 >= y1``, any scale.
        scores: (N,) finite; non-negative for ``"linear"`` and ``"gaussian"`` (the decay
            is multiplicative).
        method: ``"gaussian"``, ``"linear"`` or ``"hard"``.
        iou_threshold: ``N_t`` in [0, 1], used by ``"linear"`` and ``"hard"``.
        sigma: ``σ > 0`` of the gaussian decay.
        score_threshold: boxes whose score falls to this value or below are dropped.

    Returns:
        ``(keep, kept_scores)``: int64 indices into ``boxes`` in selection order (so in
        non-increasing order of ``kept_scores``), and their decayed scores in the dtype
        of ``scores``.
    """
    return _run(boxes, scores, None, method, iou_threshold, sigma, score_threshold)


def batched_soft_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                     method: str = "gaussian", iou_threshold: float = 0.3, sigma: float = 0.5,
                     score_threshold: float = 0.001) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`soft_nms` run independently per category, like torchvision's ``batched_nms``.

    Boxes with different ``idxs`` (an (N,) integer tensor, e.g. class labels) never
    decay each other. The result is the same as running :func:`soft_nms` on each category
    and merging the kept boxes in non-increasing order of their decayed scores (ties to
    the lower index). Bodla et al. (2017), arXiv 1704.04503.
    """
    return _run(boxes, scores, idxs, method, iou_threshold, sigma, score_threshold)


def _run(boxes, scores, idxs, method, iou_threshold, sigma, score_threshold):
    code = _check_method(method)
    _check_boxes(boxes)
    _check_scores(scores, boxes, code)
    labels = _check_idxs(idxs, boxes)
    iou_threshold = _scalar(iou_threshold, "iou_threshold")
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    sigma = _scalar(sigma, "sigma")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    score_threshold = _scalar(score_threshold, "score_threshold")

    device = scores.device
    if boxes.shape[0] == 0:
        return (torch.empty(0, dtype=torch.int64, device=device),
                torch.empty(0, dtype=scores.dtype, device=device))
    boxes_np = boxes.detach().cpu().to(torch.float64).numpy()
    if np.abs(boxes_np).max() >= 2.0 ** 1022:   # x2 - x1 would overflow: a quarter, exactly (IoU is scale free)
        boxes_np = boxes_np * 0.25
    order = np.argsort(boxes_np[:, 0], kind="stable")
    keep, kept = soft_nms_kernel(
        np.ascontiguousarray(boxes_np[order]),
        np.ascontiguousarray(scores.detach().cpu().to(torch.float64).numpy()[order]),
        np.ascontiguousarray(labels[order]), order.astype(np.int64), code,
        float(iou_threshold), float(sigma), float(score_threshold))
    return (torch.from_numpy(keep).to(device),
            torch.from_numpy(kept).to(device=device, dtype=scores.dtype))


def _scalar(value, name: str) -> float:
    """A number, or a tensor holding one (a tensor of several raised "Boolean value of Tensor with
    more than one value is ambiguous"); NaN refused."""
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(value.shape)}")
    check_number(value, name)
    return float(value)


def _check_method(method) -> int:
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in METHODS)}, got {method!r}")
    return METHODS[method]


def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    _check_has_data(x, name)
    if x.dtype not in FLOATING_DTYPES:   # (float8: NotImplementedError from a comparison)
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def _check_has_data(x, name: str) -> None:
    if has_no_data(x):
        raise ValueError(f"{name} must hold values (got a {'meta' if x.is_meta else 'fake'} tensor): "
                         "which boxes Soft-NMS keeps, and so the size of its output, depends on them")


def _check_boxes(boxes) -> None:
    _check_tensor(boxes, "boxes")
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must have shape (N, 4) as x1, y1, x2, y2, got {tuple(boxes.shape)}")
    if not bool(torch.isfinite(boxes).all()):
        raise ValueError("boxes must be finite (no NaN or inf coordinates)")
    if bool((boxes[:, 2] < boxes[:, 0]).any()) or bool((boxes[:, 3] < boxes[:, 1]).any()):
        bad = torch.nonzero((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1]))[0].item()
        raise ValueError(f"boxes must be x1, y1, x2, y2 with x2 >= x1 and y2 >= y1; box {bad} is "
                         f"{boxes[bad].tolist()}")


def _check_scores(scores, boxes, code: int) -> None:
    _check_tensor(scores, "scores")
    if scores.dim() != 1 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(f"scores must have shape (N,) with N = {boxes.shape[0]} boxes, "
                         f"got {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores must be finite (no NaN or inf)")
    if code != HARD and bool((scores < 0).any()):
        raise ValueError("scores must be >= 0 for method 'linear' or 'gaussian' (the decay is "
                         "multiplicative); use method='hard' for signed scores")


def _check_idxs(idxs, boxes) -> np.ndarray:
    n = boxes.shape[0]
    if idxs is None:
        return np.zeros(n, np.int64)
    if not isinstance(idxs, torch.Tensor):
        raise TypeError(f"idxs must be a torch.Tensor, got {type(idxs).__name__}")
    _check_has_data(idxs, "idxs")
    if idxs.is_floating_point() or idxs.is_complex() or idxs.dtype == torch.bool:
        raise TypeError(f"idxs must be an integer tensor (category of each box), got dtype {idxs.dtype}")
    if idxs.dim() != 1 or idxs.shape[0] != n:
        raise ValueError(f"idxs must have shape (N,) with N = {n} boxes, got {tuple(idxs.shape)}")
    return np.ascontiguousarray(idxs.detach().cpu().to(torch.int64).numpy())

