"""Neighbouring ops built on a soft maximum: Soft-NMS, MaxSim / Signed MaxSim, SoftPool."""

from .maxsim import maxsim, signed_maxsim
from .soft_nms import batched_soft_nms, soft_nms
from .soft_pool import soft_pool2d

__all__ = ["soft_nms", "batched_soft_nms", "maxsim", "signed_maxsim", "soft_pool2d"]
