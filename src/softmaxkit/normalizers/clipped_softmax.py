r"""Clipped softmax: ``clip((zeta - gamma) softmax(x) + gamma, 0, 1)``, so a head can do nothing.

Bondarenko, Nagel & Blankevoort (2023), "Quantizable Transformers: Removing Outliers by
Helping Attention Heads Do Nothing", arXiv 2306.12929.
"""

from __future__ import annotations

import torch

from .._checks import check_finite
from .._rows import prepare_rows
from ..forms import StreamRule, keep_visible, shifted_exp
from ..registry import Example, builtin
from ._generic import finish
from .softmax import softmax_rows


def stretch_and_clip(p: torch.Tensor, gamma: float, zeta: float) -> torch.Tensor:
    """``clip((zeta - gamma) p + gamma, 0, 1)``."""
    return ((zeta - gamma) * p + gamma).clamp(0.0, 1.0)


def clipped_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                    gamma: float = -0.03, zeta: float = 1.0) -> torch.Tensor:
    r"""Clipped softmax (Bondarenko, Nagel & Blankevoort 2023).

    .. math:: \mathrm{clip}\big((\zeta - \gamma)\,\mathrm{softmax}(x) + \gamma,\ 0,\ 1\big)

    With ``gamma < 0`` small weights become exact zeros (the head can "do nothing"
    without pushing scores to extremes); with ``zeta > 1`` weights can reach exactly 1.
    ``gamma = 0, zeta = 1`` is softmax. Masked entries are 0 whatever ``gamma`` is.
    Bondarenko, Nagel & Blankevoort (2023), "Quantizable Transformers: Removing Outliers by
    Helping Attention Heads Do Nothing", arXiv 2306.12929. Not one of the four forms (the
    clip acts on the normalised weights): it streams in two passes through its own rule.

    Args:
        gamma: lower stretch, ``gamma < zeta`` (the paper uses small negative values).
        zeta: upper stretch, ``zeta >= 1`` in the paper.
    """
    check_finite(gamma, "gamma", allow_tensor=False)
    check_finite(zeta, "zeta", allow_tensor=False)
    if not zeta > gamma:
        raise ValueError(f"zeta must be > gamma, got zeta={zeta}, gamma={gamma}")
    rows = prepare_rows(x, dim, mask)
    p = softmax_rows(torch.where(rows.visible, rows.x, rows.safe_x), rows.visible)
    return finish(rows, stretch_and_clip(p, gamma, zeta))


class ClippedSoftmaxRule(StreamRule):
    """Pass 0: ``d = sum e^{x-c}``; pass 1: ``sum clip((zeta-gamma) e^{x-c}/d + gamma, 0, 1) v``."""

    passes = 2
    shifted = (True, False)
    value_terms = (frozenset(), frozenset({"num"}))

    def terms(self, p, z, visible, st):
        e = shifted_exp(z, visible, st["c0"])
        if p == 0:
            return {"d": e}
        params = st["params"]
        prob = e / torch.where(st["d"] > 0, st["d"], torch.ones_like(st["d"]))
        return {"num": keep_visible(stretch_and_clip(prob, params["gamma"], params["zeta"]), visible)}

    def stats(self, p, sums, st):
        return {"d": sums["d"]}

    def output(self, sums, st):
        return sums["num"]


SPEC = builtin(
    clipped_softmax, form=None, formula="clip((zeta - gamma) softmax(x) + gamma, 0, 1)",
    reference="Bondarenko, Nagel & Blankevoort 2023, arXiv 2306.12929",
    sums_to_one=False, can_be_sparse=True, shift_invariant=True,
    stream=lambda params: ClippedSoftmaxRule(), stream_passes=2,
    examples=(
        Example(x=(0.0, 1.0986122886681098), expected=(0.25, 0.75), params={"gamma": 0.0, "zeta": 1.0},
                note="gamma = 0, zeta = 1: softmax"),
        Example(x=(0.0, 1.0986122886681098), expected=(0.0, 1.0), params={"gamma": -0.5, "zeta": 1.5},
                note="2 p - 0.5 clipped to [0, 1]"),
    ),
)
