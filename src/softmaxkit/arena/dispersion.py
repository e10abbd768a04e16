"""Arena a: dispersion. How much weight does a normalizer give a planted maximum as n grows?

Setup (analytic, no training): a row of ``n`` logits, ``n - 1`` of them drawn uniformly
from ``[-1, 1]`` and one planted at ``1 + gap`` (the maximum, by ``gap`` above every
other logit's bound). For each normalizer we compute the weight on the planted entry,
averaged over ``trials`` rows, for n = 16 ... 65536.

Veličković et al. (2024, arXiv 2410.01104, Theorem 2) prove that with bounded logits
softmax's largest weight tends to 0 as n grows ("dispersion"), and propose an
entropy-driven adaptive temperature to sharpen it at inference. Nakanishi (2025,
arXiv 2501.19399) multiplies the logits by ``s log n`` (SSMax): then the planted entry's
weight is ``n^(s x*)`` against ``(n - 1) E[n^(s x_i)] ~ n^(1 + s) / (2 s log n)``: it tends
to 1 when ``s * gap > 1`` and otherwise decays like ``n^(s gap - 1) log n``, which at
s = 0.43, gap = 2 first rises and only turns down around n ~ 1000, slowly. Both SSMax's
paper value s = 0.43 and s = 1 are shown.
"""

from __future__ import annotations

import math

import torch

from .. import registry
from .._table import Table, verdict_of
from ._plot import line_style
from ._runtime import cell_for, skipped_note, why_skipped

CLAIM = ("With bounded logits, softmax's weight on the maximum disperses towards 0 as the number of items n "
         "grows (Velickovic et al. 2024, arXiv 2410.01104); adaptive temperature slows this at inference; "
         "SSMax, softmax(s log(n) x), keeps attention focused on the maximum as n grows "
         "(Nakanishi 2025, arXiv 2501.19399).")

SIZES = (16, 64, 256, 1024, 4096, 16384, 65536)
QUICK_SIZES = (16, 64, 256, 1024, 4096, 16384, 65536)

#: (label, registered name, parameters) beyond each normalizer at its defaults: SSMax at s = 1,
#: where the paper's theory puts the transition (s * gap > 1).
VARIANTS: tuple[tuple[str, str, dict], ...] = (("ssmax (s=1)", "ssmax", {"s": 1.0}),)


def normalizer_rows() -> tuple[tuple[str, str, dict], ...]:
    """Every registered normalizer (a user's too) at its defaults, labelled by its name, then the
    variants. Defaults: multimax's all-zero r, t make it softmax (its learned form is in
    max_retrieval and tiny_lm); sparse_softmax keeps its attention default of 8 entries."""
    return tuple((spec.name, spec.name, {}) for spec in registry.normalizers()) + VARIANTS


def planted_rows(n: int, trials: int, gap: float, generator: torch.Generator) -> torch.Tensor:
    """``trials`` rows of ``n`` float64 logits: U(-1, 1) everywhere, ``1 + gap`` at index 0."""
    x = torch.rand(trials, n, generator=generator, dtype=torch.float64) * 2 - 1
    x[:, 0] = 1.0 + gap
    return x


def planted_weight(name: str, x: torch.Tensor, **params) -> torch.Tensor:
    """Weight each row of ``x`` gives its entry 0, through the registry."""
    params = registry.get(name).params_for_length(params, x.shape[-1])
    return registry.normalize(x, name, dim=-1, **params)[:, 0]


def measure(sizes=SIZES, trials: int = 8, gap: float = 2.0, seed: int = 0,
            normalizers=None) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Mean planted weight per normalizer label per size; and the labels skipped, with the reason."""
    weights: dict[str, list[float]] = {}
    skipped: dict[str, str] = {}
    rows = {}
    for n in sizes:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + n)
        rows[n] = planted_rows(n, trials, gap, generator)
    for label, name, params in normalizers or normalizer_rows():
        try:
            weights[label] = [planted_weight(name, rows[n], **params).mean().item() for n in sizes]
        except Exception as err:  # one broken normalizer must not take the others' rows down
            skipped[label] = why_skipped(err)
    return weights, skipped


def _figure(sizes, weights: dict[str, list[float]], gap: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, (label, values) in enumerate(weights.items()):
        ax.plot(sizes, values, label=label, **line_style(i))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (number of logits)")
    ax.set_ylabel("weight on the planted maximum")
    ax.set_title(f"dispersion: n-1 logits U(-1,1), planted maximum at {1 + gap:g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig


def _verdict(sizes, weights: dict[str, list[float]]) -> str:
    def at(label: str, i: int) -> float:
        return weights[label][i]

    first, last = sizes[0], sizes[-1]
    parts = []
    if "softmax" in weights:
        parts.append(f"softmax's weight on the maximum falls from {at('softmax', 0):.3g} at n={first} "
                     f"to {at('softmax', -1):.3g} at n={last} (dispersion reproduced)"
                     if at("softmax", -1) < 0.1 * at("softmax", 0) else
                     f"softmax's weight goes from {at('softmax', 0):.3g} to {at('softmax', -1):.3g}: "
                     "no clear dispersion")
    if "adaptive_softmax" in weights and "softmax" in weights:
        ratios = [a / max(b, 1e-300) for a, b in zip(weights["adaptive_softmax"], weights["softmax"])]
        helped = [n for n, r in zip(sizes, ratios) if r > 1.05]
        if helped:
            parts.append(f"adaptive temperature sharpens up to n={max(helped)} "
                         f"({max(ratios):.3g}x softmax at best) but gives {ratios[-1]:.3g}x softmax at n={last}: "
                         f"its temperature polynomial stops sharpening once the entropy is large")
        else:
            parts.append("adaptive temperature does not raise the weight at any n")
    for label in ("ssmax", "ssmax (s=1)"):
        if label in weights:
            w = weights[label]
            trend = "stays focused" if w[-1] >= 0.5 * max(w) else "still disperses"
            parts.append(f"{label}: {w[0]:.3g} at n={first}, {w[-1]:.3g} at n={last} ({trend})")
    return "; ".join(parts) + "."


def _status(weights: dict[str, list[float]]) -> str:
    """Held if softmax disperses (weight at the largest n < 1/10 of the smallest's), adaptive temperature
    raises the weight at some n (by > 5%) and SSMax at the paper's s keeps at least half its peak weight."""
    if "softmax" not in weights:
        return "not testable"
    soft = weights["softmax"]
    checks = [soft[-1] < 0.1 * soft[0]]
    if "adaptive_softmax" in weights:
        checks.append(any(a > 1.05 * max(b, 1e-300) for a, b in zip(weights["adaptive_softmax"], soft)))
    ssmax = weights.get("ssmax") or weights.get("ssmax (s=1)")
    if ssmax:
        checks.append(ssmax[-1] >= 0.5 * max(ssmax))
    return verdict_of(checks)


def run(quick: bool = False, seed: int = 0, sizes=None, trials: int | None = None,
        gap: float = 2.0) -> list[Table]:
    """The dispersion table and plot. ``quick`` uses fewer random rows (the sizes are the same)."""
    sizes = tuple(sizes or (QUICK_SIZES if quick else SIZES))
    trials = trials or (4 if quick else 32)
    weights, skipped = measure(sizes, trials, gap, seed)
    table = Table(title="dispersion: mean weight on the planted maximum vs n",
                  columns=["normalizer"] + [f"n={n}" for n in sizes], claim=CLAIM)
    for label, values in weights.items():
        table.add(label, *values)
    for label, reason in skipped.items():
        table.add(label, *([cell_for(reason)] * len(sizes)))
    table.verdict = _verdict(sizes, weights)
    table.status = _status(weights)
    notes = (f"n-1 logits i.i.d. U(-1, 1), one planted at {1 + gap:g} (a gap of {gap:g} above the bound); "
             f"mean over {trials} rows per n, float64, seed {seed}. sigmoid uses its default bias -log n; "
             f"ssmax uses n = row length. Theory for SSMax: the planted weight tends to 1 when s*gap > 1 "
             f"and otherwise eventually decays like n^(s*gap - 1) log n, slowly (here s=1: s*gap = {gap:g}; "
             f"s=0.43: s*gap = {0.43 * gap:.2f}).")
    notes += skipped_note(skipped)
    table.notes = notes
    table.add_figure("planted weight vs n", lambda: _figure(sizes, weights, gap))
    return [table]


def expected_softmax_weight(n: int, gap: float) -> float:
    """E[softmax weight on the planted entry] to first order: e^(1+gap) / (e^(1+gap) + (n-1) sinh(1))."""
    return math.exp(1 + gap) / (math.exp(1 + gap) + (n - 1) * math.sinh(1.0))
