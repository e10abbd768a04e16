"""Confidence, calibration and out-of-distribution scores computed from softmax outputs.

Convention: in-distribution is the positive class and a higher score means more
in-distribution (:func:`entropy` and the distances are the exceptions their names say:
lower = more in-distribution, negate them before the metrics).

* scores from logits: :func:`msp`, :func:`max_logit`, :func:`energy`, :func:`entropy`,
  :func:`label_non_uniformity`; through a model: :func:`odin`;
  fitted on features / logits: :class:`Mahalanobis`, :func:`centroid_distance`
  (:func:`fit_centroids`, :class:`CentroidDistance`).
* calibration: :func:`fit_temperature`, :func:`nll`, :func:`ece`, :func:`classwise_ece`,
  :func:`reliability_diagram`.
* metrics: :func:`auroc`, :func:`aupr`, :func:`fpr_at_tpr`, :func:`ood_metrics`.
* early exit: :class:`EarlyExitCascade`.
"""

from .calibration import (
    ReliabilityDiagram,
    classwise_ece,
    ece,
    fit_temperature,
    nll,
    reliability_diagram,
)
from .cascade import CascadeOutput, EarlyExitCascade
from .centroid import CentroidDistance, centroid_distance, fit_centroids
from .confidence import energy, entropy, label_non_uniformity, max_logit, msp
from .mahalanobis import Mahalanobis
from .metrics import aupr, auroc, fpr_at_tpr, ood_metrics
from .odin import odin

__all__ = [
    "msp", "max_logit", "energy", "entropy", "label_non_uniformity", "odin",
    "Mahalanobis", "centroid_distance", "fit_centroids", "CentroidDistance",
    "fit_temperature", "nll", "ece", "classwise_ece", "reliability_diagram", "ReliabilityDiagram",
    "auroc", "aupr", "fpr_at_tpr", "ood_metrics", "EarlyExitCascade", "CascadeOutput",
]
