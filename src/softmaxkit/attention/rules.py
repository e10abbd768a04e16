"""The streaming rule of a normalizer, read from its spec.

Rules are not written here: a normalizer's form implies its rule
(:func:`softmaxkit.forms.rule_from_form`), and the few normalizers that are not one of the
four forms define their own next to their formula (``softmaxkit/normalizers/<name>.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import registry
from ..forms import StreamRule

__all__ = ["StreamRule", "rule_for"]


def rule_for(name: str, params: Mapping[str, Any]) -> StreamRule | None:
    """The streaming rule of normalizer ``name`` with ``params``, or ``None``: dense only.

    ``None`` for a normalizer without a streaming form (``sparse_softmax``: its top-k needs
    whole rows) and for parameters its form cannot stream (a tensor alpha in the threshold
    family, or alpha outside ``(1, 2]``).
    """
    return registry.get(name).stream_rule(params)
