"""Arena b: max-retrieval (Veličković et al. 2024). Train on at most 16 items, test on up to 4096.

Each item has a priority ``p ~ U(0, 1)`` and a class ``c`` in ``0 .. classes-1``; the
target is the class of the item with the largest priority. The model is one attention
layer with a single learned query: keys come from the priority (a small MLP), values from
the class (an embedding), the weights from the normalizer under test
(:class:`softmaxkit.nn.Normalizer`, learnable parameters trained with the rest), and an
MLP reads the class out of the attended value. It is trained on sets of 2 ... 16 items
and tested on sets of 16 ... 4096 items; we report the accuracy per size per normalizer.

``adaptive_softmax`` is the softmax-trained model with the adaptive temperature applied
at inference only, as in the paper. Veličković, Perivolaropoulos, Barbero & Pascanu
(2024), "softmax is not enough (for sharp out-of-distribution)", arXiv 2410.01104.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import nn as sknn
from .. import registry
from .._table import Table, verdict_of
from ..linear import draw_projection, linear_attention
from ..linear import get as get_linear
from ..linear import methods as linear_methods
from ._plot import line_style
from ._runtime import cell_for, generator, map_jobs, skipped_note, why_skipped

CLAIM = ("A softmax attention head trained to retrieve the maximum of at most 16 items loses accuracy as "
         "the number of items grows, because its weights disperse; adaptive temperature at inference "
         "recovers part of it (Velickovic et al. 2024, arXiv 2410.01104); scale-aware (SSMax) and sparse "
         "normalizers are expected to generalise better to more items.")

# (label, normalizer used in training, normalizer used at test); None = the same.
#: adaptive temperature is the claim's inference-time fix: trained as softmax, tested adaptive.
VARIANTS: tuple[tuple[str, str, str | None], ...] = (
    ("adaptive_softmax (at inference)", "softmax", "adaptive_softmax"),
)
#: Quick mode: the normalizers the claim is about, and the usual drop-in alternatives (time budget).
QUICK_NAMES = ("softmax", "ssmax", "sparsemax", "entmax15", "softpick", "sigmoid", "stablemax", "multimax")
#: Full mode: every registered normalizer (a user's too), trained and tested as itself, plus the variants.
NORMALIZERS: tuple[tuple[str, str, str | None], ...] = (
    tuple((spec.name, spec.name, None) for spec in registry.normalizers()) + VARIANTS)

#: Rows for softmax-free / linear attention (softmaxkit.linear_attention, one learned query over the items):
#: training name ``"linear:<method>"``. SOFT is left out: with one query its rank is at most Lq = 1.
LINEAR_TAG = "linear:"
NORMALIZERS += tuple((f"linear attn: {spec.name}", LINEAR_TAG + spec.name, None)
                     for spec in linear_methods() if spec.kernelised)
#: quick mode keeps one linear row (MALA) so that make demo stays within its time budget.
QUICK_LINEAR = ("mala",)


@dataclass(frozen=True)
class Config:
    """Sizes of one run."""

    train_sizes: tuple[int, int] = (2, 16)
    test_sizes: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    classes: int = 10
    width: int = 32
    steps: int = 1500
    batch: int = 256
    lr: float = 3e-3
    test_sets: int = 1024
    chunk_items: int = 2 ** 19     # items per evaluation chunk (bounds memory)


FULL = Config()
QUICK = Config(test_sizes=(16, 128, 1024, 4096), steps=250, batch=128, lr=5e-3, test_sets=384)


class MaxRetriever(nn.Module):
    """One attention layer with a learned query over a set of items; returns class logits."""

    def __init__(self, normalizer: str, classes: int, width: int):
        super().__init__()
        self.key = nn.Sequential(nn.Linear(1, width), nn.GELU(), nn.Linear(width, width))
        self.value = nn.Embedding(classes, width)
        self.query = nn.Parameter(torch.randn(width) / math.sqrt(width))
        self.readout = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, classes))
        self.linear = normalizer[len(LINEAR_TAG):] if normalizer.startswith(LINEAR_TAG) else None
        # last: the other weights start equal for every normalizer (a linear method keeps an unused softmax)
        self.normalizer = sknn.Normalizer("softmax" if self.linear else normalizer)
        self.linear_params: dict[str, Any] = {}
        if self.linear and "projection" in get_linear(self.linear).params:   # performer: fixed features
            self.linear_params["projection"] = draw_projection(64, width, generator=generator(0))

    def weights(self, priority: torch.Tensor, mask: torch.Tensor | None, normalizer: str | None = None):
        """Attention weights over the items, shape ``(sets, items)``."""
        keys = self.key(priority.unsqueeze(-1))
        scores = keys @ self.query / math.sqrt(keys.shape[-1])
        if normalizer is None or normalizer == self.normalizer.name:
            return self.normalizer(scores, mask=mask)
        return sknn.Normalizer(normalizer).to(scores.dtype)(scores, mask=mask)

    def forward(self, priority, classes, mask=None, normalizer: str | None = None):
        if self.linear:
            keys = self.key(priority.unsqueeze(-1)).unsqueeze(1)                  # (sets, 1, items, width)
            q = self.query.expand(keys.shape[0], 1, 1, keys.shape[-1])
            visible = None if mask is None else mask[:, None, None, :]
            attended = linear_attention(q, keys, self.value(classes).unsqueeze(1), self.linear, attn_mask=visible,
                                        **self.linear_params)[:, 0, 0]
            return self.readout(attended)
        w = self.weights(priority, mask, normalizer)
        attended = (w.unsqueeze(-1) * self.value(classes)).sum(-2)
        return self.readout(attended)


def sample(sets: int, items: int, classes: int, gen: torch.Generator, min_items: int | None = None):
    """``sets`` random sets padded to ``items``: priorities, classes, visibility mask, targets.

    With ``min_items`` each set has a random size in ``[min_items, items]``; otherwise all
    ``items`` are visible.
    """
    priority = torch.rand(sets, items, generator=gen)
    labels = torch.randint(classes, (sets, items), generator=gen)
    if min_items is None:
        mask = None
        visible_priority = priority
    else:
        sizes = torch.randint(min_items, items + 1, (sets, 1), generator=gen)
        mask = torch.arange(items) < sizes
        visible_priority = priority.masked_fill(~mask, -1.0)
    target = labels.gather(1, visible_priority.argmax(1, keepdim=True)).squeeze(1)
    return priority, labels, mask, target


def train(normalizer: str, cfg: Config, seed: int) -> MaxRetriever:
    """Train a :class:`MaxRetriever` on sets of ``cfg.train_sizes`` items (same data for every normalizer)."""
    torch.manual_seed(seed)
    model = MaxRetriever(normalizer, cfg.classes, cfg.width)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps)
    gen = generator(seed + 1)
    low, high = cfg.train_sizes
    for _ in range(cfg.steps):
        priority, labels, mask, target = sample(cfg.batch, high, cfg.classes, gen, min_items=low)
        loss = nn.functional.cross_entropy(model(priority, labels, mask), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
    return model


@torch.no_grad()
def accuracy(model: MaxRetriever, items: int, cfg: Config, seed: int, normalizer: str | None = None) -> float:
    """Accuracy on ``cfg.test_sets`` fresh sets of exactly ``items`` items (same sets for every model)."""
    gen = generator(seed + 2 + items)
    per_chunk = max(1, min(cfg.test_sets, cfg.chunk_items // items))
    correct, done = 0, 0
    while done < cfg.test_sets:
        sets = min(per_chunk, cfg.test_sets - done)
        priority, labels, _, target = sample(sets, items, cfg.classes, gen)
        correct += (model(priority, labels, None, normalizer).argmax(-1) == target).sum().item()
        done += sets
    return correct / cfg.test_sets


def train_and_test(train_name: str, tests: tuple[tuple[str, str | None], ...], cfg: Config, seed: int):
    """Train one model with ``train_name`` and test it once per ``(label, test normalizer)``.

    Returns ``{label: accuracies per size, or the reason it was skipped}`` and the learned
    normalizer parameters as text.
    """
    try:
        model = train(train_name, cfg, seed)
    except Exception as err:  # one broken normalizer must not take the others' rows down
        return {label: why_skipped(err) for label, _ in tests}, ""
    out: dict[str, list[float] | str] = {}
    for label, test_name in tests:
        try:
            out[label] = [accuracy(model, n, cfg, seed, test_name) for n in cfg.test_sizes]
        except Exception as err:
            out[label] = why_skipped(err)
    values = model.normalizer.learned_values()
    return out, ", ".join(f"{k}={_short(v)}" for k, v in values.items())


def measure(cfg: Config, seed: int = 0, normalizers=NORMALIZERS, workers: int | None = None,
            show_progress: bool = False):
    """Accuracy per label per test size, the labels skipped with the reason, and the learned parameters.

    One model per training normalizer, trained on its own worker process (see ``_runtime``).
    """
    by_training: dict[str, list[tuple[str, str | None]]] = {}
    for label, train_name, test_name in normalizers:
        by_training.setdefault(train_name, []).append((label, test_name))
    jobs = [(name, tuple(tests), cfg, seed) for name, tests in by_training.items()]
    outputs = map_jobs(train_and_test, jobs, desc="max_retrieval", workers=workers, show_progress=show_progress)
    results: dict[str, list[float]] = {}
    skipped: dict[str, str] = {}
    learned: dict[str, str] = {}
    for (_name, tests, _, _), (out, params) in zip(jobs, outputs):
        for label, test_name in tests:
            if isinstance(out[label], str):
                skipped[label] = out[label]
                continue
            results[label] = out[label]
            if params and test_name is None:
                learned[label] = params
    order = [label for label, _, _ in normalizers]
    results = {k: results[k] for k in order if k in results}
    return results, skipped, learned


def _short(value: torch.Tensor) -> str:
    flat = value.detach().flatten().tolist()
    return f"{flat[0]:.3g}" if len(flat) == 1 else "[" + ", ".join(f"{v:.2g}" for v in flat) + "]"


def _figure(cfg: Config, results: dict[str, list[float]]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, (label, values) in enumerate(results.items()):
        ax.plot(cfg.test_sizes, values, label=label, **line_style(i))
    ax.axhline(1 / cfg.classes, color="grey", linestyle=":", label="chance")
    ax.axvline(cfg.train_sizes[1], color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("items at test (trained on <= 16)")
    ax.set_ylabel("accuracy")
    ax.set_title("max-retrieval: out-of-distribution number of items")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig


def _verdict(cfg: Config, results: dict[str, list[float]]) -> str:
    if not results:
        return "nothing measured: every normalizer was skipped."
    sizes = cfg.test_sizes
    parts = []
    if "softmax" in results:
        s = results["softmax"]
        parts.append(f"softmax: {s[0]:.3f} at {sizes[0]} items, {s[-1]:.3f} at {sizes[-1]} "
                     + ("(accuracy falls with more items, as claimed)" if s[-1] < s[0] - 0.05 else
                        "(no clear drop)"))
        adaptive = results.get("adaptive_softmax (at inference)")
        if adaptive:
            gains = [a - b for a, b in zip(adaptive, s)]
            i = max(range(len(gains)), key=gains.__getitem__)
            parts.append(f"adaptive temperature at inference: {gains[i]:+.3f} vs softmax at best "
                         f"({sizes[i]} items), {gains[-1]:+.3f} at {sizes[-1]}"
                         + (" (helps at moderate sizes only)" if gains[i] > 0.01 >= gains[-1] else ""))
    linear = {k: v for k, v in results.items() if k.startswith("linear attn")}
    if linear and "softmax" in results:
        top = max(linear, key=lambda k: linear[k][0])
        parts.append(f"linear attention (claimed close to softmax in quality): best {top} "
                     f"{linear[top][0]:.3f} vs softmax {results['softmax'][0]:.3f} at {sizes[0]} items, "
                     f"{linear[top][-1]:.3f} vs {results['softmax'][-1]:.3f} at {sizes[-1]}")
    best = max(results, key=lambda k: results[k][-1])
    parts.append(f"best at {sizes[-1]} items: {best} ({results[best][-1]:.3f})")
    return "; ".join(parts) + "."


def _status(results: dict[str, list[float]]) -> str:
    """Parts of the claim, each checked at the largest test size: softmax's accuracy falls (by > 0.05
    from the smallest size), adaptive temperature gains > 0.01 at some size, SSMax beats softmax, and
    the better of sparsemax / entmax15 beats softmax."""
    if "softmax" not in results:
        return "not testable"
    s = results["softmax"]
    checks = [s[-1] < s[0] - 0.05]
    adaptive = results.get("adaptive_softmax (at inference)")
    if adaptive:
        checks.append(max(a - b for a, b in zip(adaptive, s)) > 0.01)
    if "ssmax" in results:
        checks.append(results["ssmax"][-1] > s[-1])
    sparse = [results[n][-1] for n in ("sparsemax", "entmax15") if n in results]
    if sparse:
        checks.append(max(sparse) > s[-1])
    return verdict_of(checks)


def _rows() -> tuple[tuple[str, str, str | None], ...]:
    """Every row, read from the registry when the task runs (so a normalizer registered later is in)."""
    rows = tuple((spec.name, spec.name, None) for spec in registry.normalizers()) + VARIANTS
    return rows + tuple(r for r in NORMALIZERS if r[1].startswith(LINEAR_TAG))


def run(quick: bool = False, seed: int = 0, config: Config | None = None, workers: int | None = None,
        show_progress: bool = True) -> list[Table]:
    """The max-retrieval accuracy table and plot (``config`` overrides the quick/full sizes)."""
    cfg = config or (QUICK if quick else FULL)
    rows = tuple(r for r in _rows()
                 if not quick or r in VARIANTS or r[1] in QUICK_NAMES
                 or (r[1].startswith(LINEAR_TAG) and r[1][len(LINEAR_TAG):] in QUICK_LINEAR))
    results, skipped, learned = measure(cfg, seed, normalizers=rows, workers=workers, show_progress=show_progress)
    table = Table(title="max-retrieval: accuracy vs number of items (trained on 2-16)",
                  columns=["normalizer"] + [f"{n} items" for n in cfg.test_sizes] + ["learned parameters"],
                  claim=CLAIM)
    for label, values in results.items():
        table.add(label, *values, learned.get(label, "-"))
    for label, reason in skipped.items():
        table.add(label, *([cell_for(reason)] * len(cfg.test_sizes)), "-")
    table.verdict = _verdict(cfg, results)
    table.status = _status(results)
    notes = (f"{cfg.classes} classes (chance {1 / cfg.classes:.2f}); width {cfg.width}; {cfg.steps} Adam steps "
             f"(lr {cfg.lr}, cosine) of {cfg.batch} sets with {cfg.train_sizes[0]}-{cfg.train_sizes[1]} items; "
             f"{cfg.test_sets} test sets per size; seed {seed}. Every model sees the same data and the same "
             f"initial weights; learnable normalizer parameters are trained with softmaxkit.nn.Normalizer. "
             f"'linear attn: <method>' rows replace the normalised scores by softmaxkit.linear_attention with the "
             f"same learned query, keys and values (performer: 64 fixed random features; SOFT left out: rank <= "
             f"1 query)" + (f"; quick mode runs only {', '.join(QUICK_LINEAR)} of them." if quick else "."))
    notes += skipped_note(skipped)
    table.notes = notes
    table.add_figure("accuracy vs items", lambda: _figure(cfg, results))
    return [table]
