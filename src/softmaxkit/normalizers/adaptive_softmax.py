r"""Adaptive-temperature softmax (Veličković et al. 2024): sharpen rows whose softmax is too flat.

Veličković, Perivolaropoulos, Barbero & Pascanu (2024), "softmax is not enough (for sharp
out-of-distribution)", arXiv 2410.01104.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._checks import check_bool
from .._rows import prepare_rows
from ..forms import SoftmaxOf, StreamRule, safe_div, shifted_exp
from ..registry import Example, builtin
from ._generic import finish
from .softmax import log_softmax_rows, softmax_rows

#: Adaptive-temperature polynomial in the entropy, highest degree first (Velickovic et al. 2024).
POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)
#: Rows whose softmax entropy is at most this keep beta = 1.
ENTROPY_THRESHOLD = 0.5


def _polyval(coefficients: Sequence[float], t: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(t)
    for c in coefficients:
        out = out * t + c
    return out


def inverse_temperature(entropy: torch.Tensor, detach_beta: bool = False) -> torch.Tensor:
    r"""``beta = max(poly(H), 1)`` where ``H > 0.5``, else 1."""
    beta = torch.where(entropy > ENTROPY_THRESHOLD, _polyval(POLY, entropy).clamp_min(1.0), torch.ones_like(entropy))
    return beta.detach() if detach_beta else beta


def sharpened(x: torch.Tensor, beta: Any) -> torch.Tensor:
    """``g(x) = beta x``, ``beta`` the row's inverse temperature (a statistic of the first pass)."""
    return x * beta


def d_sharpened(x: torch.Tensor, beta: Any) -> torch.Tensor:
    return torch.ones_like(x) * beta


def adaptive_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None,
                     detach_beta: bool = False) -> torch.Tensor:
    r"""Adaptive-temperature softmax (Veličković et al. 2024).

    .. math::
        p = \mathrm{softmax}(x),\; H = -\sum_i p_i \log p_i,\;
        \beta = \begin{cases}\max(\mathrm{poly}(H), 1) & H > 0.5\\ 1 & \text{otherwise}\end{cases},\;
        \text{return } \mathrm{softmax}(\beta x)

    with ``poly`` the degree-4 fit ``[-0.037, 0.481, -2.3, 4.917, -1.791]`` (highest degree
    first). Sharpens rows whose softmax is too dispersed; equals softmax when ``H <= 0.5``.
    The entropy is computed exactly (no ``+1e-9`` inside the log).

    Veličković, Perivolaropoulos, Barbero & Pascanu (2024), "softmax is not enough (for
    sharp out-of-distribution)", arXiv 2410.01104.

    Args:
        detach_beta: treat β as a constant in the backward pass (the gradient then is
            that of ``softmax(β x)`` at fixed β). By default the gradient flows through β.
    """
    check_bool(detach_beta, "detach_beta")
    rows = prepare_rows(x, dim, mask)
    z = torch.where(rows.visible, rows.x, rows.safe_x)
    logp = log_softmax_rows(z, rows.visible)
    p = torch.exp(logp)
    # entries with p = 0 (e.g. finfo.min among ordinary scores, log p about -3e38) add 0 to the
    # entropy and must add 0 to its gradient: log p * dL/dH would overflow, and times p = 0 be NaN
    safe_logp = torch.where(rows.visible & torch.isfinite(logp) & (p > 0), logp, torch.zeros_like(logp))
    entropy = -(p * safe_logp).sum(-1, keepdim=True)
    beta = inverse_temperature(entropy, detach_beta)
    # softmax(beta x) is shift invariant: sharpen x minus its finite row maximum (detached),
    # so that beta * finfo.min does not overflow a whole row to -inf (an empty row)
    top = rows.masked_max().detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    scaled = torch.where(rows.visible & ~torch.isinf(z), sharpened(z - top, beta), z)
    return finish(rows, softmax_rows(scaled, rows.visible))


class AdaptiveSoftmaxRule(StreamRule):
    """Pass 0: ``d = sum e^{x-c}`` and ``E = sum (x - c) e^{x-c}``, taken relative to the running
    shift ``c`` (carried from shift to shift by :meth:`rescaled`), so the entropy
    ``H = log d - E/d`` adds no huge terms (``c + log d - sum x e / d`` cancelled ``finfo.min``
    against itself on a row of fills: NaN gradients); pass 1: ``softmax(beta x)`` with ``beta``
    from :func:`inverse_temperature`."""

    passes = 2
    shifted = (True, True)
    value_terms = (frozenset(), frozenset({"num"}))

    def z(self, p, x, st):
        # pass 1 relative to pass 0's maximum (softmax is shift invariant), as the reference:
        # beta * a finfo.min fill would overflow a whole row to -inf
        return x if p == 0 else sharpened(x - st["m0"].detach(), st["beta"])

    def terms(self, p, z, visible, st):
        e = shifted_exp(z, visible, st[f"c{p}"])
        if p == 1:
            return {"num": e, "den": e}
        # x - c only where e > 0: elsewhere it may be -inf, and 0 * inf is NaN
        return {"d": e, "E": torch.where(e > 0, z - st["c0"], torch.zeros_like(z)) * e}

    def rescaled(self, sums, alpha, c_old, c_new):
        if "E" in sums:  # sum (x - c_new) e = sum (x - c_old) e + (c_old - c_new) sum e, times alpha
            sums = {**sums, "E": sums["E"] + (c_old - c_new) * sums["d"]}
        return super().rescaled(sums, alpha, c_old, c_new)

    def stats(self, p, sums, st):
        d = sums["d"]
        entropy = torch.where(d > 0, torch.log(torch.where(d > 0, d, torch.ones_like(d))) - safe_div(sums["E"], d),
                              torch.zeros_like(d))
        return {"beta": inverse_temperature(entropy, bool(st["params"].get("detach_beta", False)))}

    def output(self, sums, st):
        return safe_div(sums["num"], sums["den"])


SPEC = builtin(
    adaptive_softmax, form=SoftmaxOf(g=sharpened, dg=d_sharpened, passes=2),
    formula="softmax(beta x), beta = max(poly(H(softmax x)), 1) if H > 0.5 else 1",
    reference="Velickovic et al. 2024, arXiv 2410.01104",
    sums_to_one=True, can_be_sparse=False, shift_invariant=True,
    stream=lambda params: AdaptiveSoftmaxRule(), stream_passes=2,
    examples=(
        Example(x=(0.0, 1.0986122886681098), expected=(0.25, 0.75), note="entropy 0.56 > 0.5 but poly < 1: softmax"),
        Example(x=(5.0, 0.0), expected=(0.9933071490757153, 0.0066928509242848554), note="low entropy: softmax"),
    ),
)
