"""Arena c: a tiny byte-level language model per normalizer, on the standard library's source.

Data: the ``.py`` files in the directory of the installed ``os`` module (the Python
standard library), in sorted file-name order, concatenated as bytes up to a size limit;
the first 90% is the training split, the last 10% the validation split. Nothing is
downloaded.

Model: a 2-layer pre-LayerNorm decoder (rotary position embeddings, so that it can be run
past its training context), byte vocabulary of 256. Every run has the same initial
weights, the same batches and the same token budget; only the attention normalizer
(:class:`softmaxkit.nn.Normalizer`, one learnable parameter set per head) changes.

Measured on the validation split, per normalizer:

* **val loss**: mean next-byte cross-entropy (nats) over windows of the training context L.
* **loss at 2L / 4L**: the same over windows of length 2L and 4L (length extrapolation).
* **sink rate**: the share of attention heads (all layers) whose mean weight on the first
  token, averaged over validation windows and over the queries in the second half of the
  window (positions L/2 ... L-1, which see at least L/2 keys), exceeds 0.3. Gu et al.
  (2024, arXiv 2410.10781) use the same 0.3 threshold; softpick (Zuhri et al. 2025,
  arXiv 2504.20966) reports 0% for softpick.
* **zero weights**: the share of attention weights that are exactly 0 among the causally
  visible (query, key) pairs.
* **kurtosis**: Pearson kurtosis E[(h - mean)^4] / var^2 (3 for a Gaussian) of all
  entries of the residual stream after the last block, over the validation windows.
* **int8 / int4 loss**: val loss after fake-quantising the weights of every linear layer
  to 8 and 4 bits (symmetric, per output channel, round to nearest).

The attention goes through :func:`attend`: ``softmaxkit.attention(q, k, v, normalizer=...,
is_causal=True, **per-head parameters)`` for training and losses, except for the
threshold-search normalizers (sparsemax, entmax), which use the dense path ``scores ->
Normalizer(mask=causal) -> @ v`` because it is faster at this length
(``USE_SOFTMAXKIT_ATTENTION = False`` makes every normalizer dense). The two paths agree to
float tolerance (tested). The attention statistics need the weights themselves and always
use the dense path.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import nn as sknn
from .. import registry
from .._table import Table, verdict_of
from ..linear import attention_weights, draw_projection, linear_attention
from ..linear import get as get_linear
from ..linear import methods as linear_methods
from ._runtime import cell_for, generator, map_jobs, skipped_note, why_skipped

CLAIM = ("Softpick attention has a 0% attention-sink rate, far lower hidden-state kurtosis (340 vs 33,510) and "
         "46.97% sparse attention maps, and quantises better than softmax (Zuhri et al. 2025, arXiv 2504.20966); "
         "SSMax generalises better to longer contexts (Nakanishi 2025, arXiv 2501.19399); MultiMax, SA-Softmax, "
         "sparse and sigmoid attention are drop-in alternatives (see the table).")

# False: the dense path (scores -> Normalizer(mask=causal) -> @ v) everywhere. Normalizers found by a
# threshold search (sparsemax, entmax) stay dense: through softmaxkit.attention a training step at
# L = 64 measured 4-5x slower than dense (sparsemax 372 vs 88 ms, entmax15 460 vs 93 ms, one thread).
USE_SOFTMAXKIT_ATTENTION = True

#: Quick mode: the normalizers the claim names and the usual drop-in alternatives (time budget); full mode
#: trains one model per registered normalizer (:func:`normalizer_names`), a user's included.
NORMALIZERS = ("softmax", "ssmax", "sa_softmax", "multimax", "stablemax", "softpick", "sigmoid",
               "clipped_softmax", "sparsemax", "entmax15")


def normalizer_names(quick: bool) -> tuple[str, ...]:
    """The rows of a run: :data:`NORMALIZERS` in quick mode, every registered normalizer otherwise."""
    return NORMALIZERS if quick else tuple(spec.name for spec in registry.normalizers())

SINK_THRESHOLD = 0.3

#: Rows for the causal softmax-free / linear attention methods (softmaxkit.linear_attention, chunked causal
#: path): normalizer name ``"linear:<method>"``; quick mode runs QUICK_LINEAR only, to keep its run time.
LINEAR_TAG = "linear:"
LINEAR = tuple(LINEAR_TAG + spec.name for spec in linear_methods() if spec.causal)
QUICK_LINEAR = (LINEAR_TAG + "mala",)


@dataclass(frozen=True)
class Config:
    """Sizes of one run; the token budget is ``steps * batch * context``."""

    context: int = 128
    width: int = 128
    heads: int = 4
    layers: int = 2
    steps: int = 1500
    batch: int = 32
    lr: float = 3e-3
    corpus_bytes: int = 4_000_000
    eval_windows: int = 64
    val_fraction: float = 0.1

    @property
    def tokens(self) -> int:
        return self.steps * self.batch * self.context


FULL = Config()
QUICK = Config(context=64, width=64, heads=4, steps=300, batch=16, corpus_bytes=1_000_000, eval_windows=24)


# data ---------------------------------------------------------------------------------

def corpus_files() -> list[Path]:
    """The standard library's top-level ``.py`` files, sorted by name."""
    return sorted(Path(os.__file__).parent.glob("*.py"))


def load_corpus(max_bytes: int) -> torch.Tensor:
    """Bytes of :func:`corpus_files` concatenated in order, at most ``max_bytes``, as int64 tokens."""
    chunks, size = [], 0
    for path in corpus_files():
        data = path.read_bytes()
        chunks.append(data[: max_bytes - size])
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    if size == 0:
        raise RuntimeError(f"no .py files found next to {os.__file__}")
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()


def split(tokens: torch.Tensor, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """First ``1 - val_fraction`` for training, the rest for validation."""
    cut = int(len(tokens) * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]


def random_windows(tokens: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``length + 1`` tokens (inputs and next-byte targets)."""
    starts = torch.randint(len(tokens) - length - 1, (batch,), generator=gen)
    return torch.stack([tokens[s: s + length + 1] for s in starts.tolist()])


def fixed_windows(tokens: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """Up to ``count`` evenly spaced windows of ``length + 1`` tokens (the same for every model)."""
    last = len(tokens) - length - 1
    if last < 0:
        raise ValueError(f"validation split ({len(tokens)} bytes) is shorter than a window of {length + 1}")
    starts = torch.linspace(0, last, count).long().unique()
    return torch.stack([tokens[s: s + length + 1] for s in starts.tolist()])


# model --------------------------------------------------------------------------------

def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864) of ``(..., length, head_dim)``."""
    length, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = torch.arange(length, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half: 2 * half]
    return torch.cat([a * cos - b * sin, a * sin + b * cos, x[..., 2 * half:]], dim=-1)


def attend(q, k, v, normalizer: sknn.Normalizer, keep_weights: bool = False, linear: str | None = None,
           linear_params: dict | None = None):
    """Causal attention ``(batch, heads, length, head_dim)``; returns the output and the weights (or None).

    ``linear``: a causal method of :func:`softmaxkit.linear_attention` used instead of the normalizer."""
    if linear is not None:
        if keep_weights:
            weights = attention_weights(q, k, linear, is_causal=True, **(linear_params or {}))
            return weights @ v, weights
        return linear_attention(q, k, v, linear, is_causal=True, **(linear_params or {})), None
    if USE_SOFTMAXKIT_ATTENTION and not keep_weights and normalizer.spec.passes is not None:
        import softmaxkit

        params = {**normalizer.fixed, **normalizer.learned_values()}
        return softmaxkit.attention(q, k, v, normalizer=normalizer.name, is_causal=True, **params), None
    length = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    weights = normalizer(scores, mask=causal)
    return weights @ v, (weights if keep_weights else None)


class Block(nn.Module):
    def __init__(self, normalizer: str, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.normalizer = sknn.Normalizer(normalizer, param_shape=(heads, 1, 1))
        self.linear: str | None = None          # a linear-attention method instead of the normalizer
        self.linear_params: dict[str, Any] = {}

    def forward(self, x, keep_weights: bool = False):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        linear = self.linear
        if linear is None:
            out, weights = attend(rotary(q), rotary(k), v, self.normalizer, keep_weights)
        else:
            out, weights = attend(rotary(q), rotary(k), v, self.normalizer, keep_weights, linear, self.linear_params)
        x = x + self.proj(out.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln2(x)), weights


class TinyLM(nn.Module):
    """Byte-level decoder: embedding, ``layers`` blocks, final LayerNorm, untied output layer."""

    def __init__(self, normalizer: str, cfg: Config):
        super().__init__()
        self.embed = nn.Embedding(256, cfg.width)
        self.blocks = nn.ModuleList(Block(normalizer, cfg.width, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, 256, bias=False)

    def forward(self, tokens, keep_weights: bool = False):
        """Logits, the residual stream after the last block, and each layer's weights (if kept)."""
        x = self.embed(tokens)
        kept = []
        for block in self.blocks:
            x, weights = block(x, keep_weights)
            kept.append(weights)
        return self.head(self.ln(x)), x, kept


def build(normalizer: str, cfg: Config, seed: int) -> TinyLM:
    """A fresh model; all weights except the normalizer's parameters equal across normalizers."""
    torch.manual_seed(seed)
    model = TinyLM("softmax", cfg)
    linear = normalizer[len(LINEAR_TAG):] if normalizer.startswith(LINEAR_TAG) else None
    for i, block in enumerate(model.blocks):
        assert isinstance(block, Block)
        block.normalizer = sknn.Normalizer("softmax" if linear else normalizer, param_shape=(cfg.heads, 1, 1))
        if linear:
            block.linear = linear
            block.linear_params = {}
            if "projection" in get_linear(linear).params:   # performer: fixed random features per layer
                block.linear_params["projection"] = draw_projection(
                    get_linear(linear).params["nb_features"], cfg.width // cfg.heads, generator=generator(seed + i))
    return model


# training and evaluation ------------------------------------------------------------------

def train(model: TinyLM, train_tokens: torch.Tensor, cfg: Config, seed: int, evaluate=None,
          curve: list | None = None) -> list[float]:
    """AdamW with warm-up and cosine decay for ``cfg.steps`` steps; returns the training losses.

    With ``evaluate`` (a function of no argument returning the validation loss) and a list
    ``curve``, appends ``(step, evaluate())`` to ``curve`` ten times over the run."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warmup = max(cfg.steps // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s / cfg.steps, 1.0)))))
    gen = generator(seed + 1)
    losses = []
    model.train()
    for _ in range(cfg.steps):
        window = random_windows(train_tokens, cfg.batch, cfg.context, gen)
        logits, _, _ = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        step = len(losses)
        if evaluate is not None and curve is not None and (step % max(cfg.steps // 10, 1) == 0 or step == cfg.steps):
            curve.append((step, evaluate()))
            model.train()
    return losses


@torch.no_grad()
def loss_on(model: TinyLM, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-byte cross-entropy over every position of ``windows``."""
    model.eval()
    total, count = 0.0, 0
    for chunk in windows.split(batch):
        logits, _, _ = model(chunk[:, :-1])
        total += nn.functional.cross_entropy(logits.reshape(-1, 256), chunk[:, 1:].reshape(-1),
                                             reduction="sum").item()
        count += chunk[:, 1:].numel()
    return total / count


@torch.no_grad()
def attention_stats(model: TinyLM, windows: torch.Tensor, batch: int = 8) -> dict[str, float]:
    """Sink rate, share of exact-zero weights and hidden-state kurtosis (see the module docstring)."""
    model.eval()
    length = windows.shape[1] - 1
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    first_token, zeros, pairs = None, 0, 0
    hidden = []
    for chunk in windows.split(batch):
        _, h, kept = model(chunk[:, :-1], keep_weights=True)
        per_head = torch.stack([w[:, :, length // 2:, 0].mean(dim=(0, 2)) for w in kept])  # (layers, heads)
        first_token = per_head * len(chunk) if first_token is None else first_token + per_head * len(chunk)
        for w in kept:
            zeros += (w[..., visible] == 0).sum().item()
            pairs += w[..., visible].numel()
        hidden.append(h.double().flatten())
    h = torch.cat(hidden)
    centred = h - h.mean()
    kurtosis = (centred.pow(4).mean() / centred.pow(2).mean().pow(2)).item()
    assert isinstance(first_token, torch.Tensor)  # at least one chunk of windows
    mean_first = first_token / len(windows)
    return {"sink rate": (mean_first > SINK_THRESHOLD).double().mean().item(),
            "zero weights": zeros / pairs, "kurtosis": kurtosis}


def fake_quantise(model: TinyLM, bits: int) -> TinyLM:
    """A copy whose linear-layer weights are rounded to ``bits``-bit symmetric per-output-channel grids."""
    out = copy.deepcopy(model)
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for module in out.modules():
            if isinstance(module, nn.Linear):
                w = module.weight
                scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
                w.copy_((w / scale).round().clamp(-levels, levels) * scale)
    return out


def run_one(normalizer: str, cfg: Config, seed: int) -> dict[str, Any] | str:
    """Train and evaluate one model; the metrics, or the reason it was skipped."""
    train_tokens, val_tokens = split(load_corpus(cfg.corpus_bytes), cfg.val_fraction)
    model = build(normalizer, cfg, seed)
    val = fixed_windows(val_tokens, cfg.eval_windows, cfg.context)
    curve: list = []
    try:
        losses = train(model, train_tokens, cfg, seed, evaluate=lambda: loss_on(model, val), curve=curve)
    except Exception as err:  # one broken normalizer must not take the others' rows down
        return why_skipped(err)
    result: dict[str, Any] = {"train loss": sum(losses[-20:]) / len(losses[-20:]), "val loss": loss_on(model, val),
                              "curve": curve}
    for factor in (2, 4):
        windows = fixed_windows(val_tokens, max(cfg.eval_windows // factor, 4), factor * cfg.context)
        result[f"loss at {factor}x context"] = loss_on(model, windows)
    result.update(attention_stats(model, val))
    for bits in (8, 4):
        result[f"int{bits} val loss"] = loss_on(fake_quantise(model, bits), val)
    params = {k: v.detach().flatten() for b in model.blocks if isinstance(b, Block)
              for k, v in b.normalizer.learned_values().items()}
    result["learned"] = ", ".join(f"{k}~{v.mean().item():.3g}" for k, v in params.items()) or "-"
    return result


METRICS = ("val loss", "loss at 2x context", "loss at 4x context", "sink rate", "zero weights", "kurtosis",
           "int8 val loss", "int4 val loss")


def _figure(results: dict[str, dict]):
    from matplotlib.figure import Figure

    names = list(results)
    fig = Figure(figsize=(10, 3.6))
    panels = (("validation loss (nats/byte) at L, 2L, 4L", ("val loss", "loss at 2x context", "loss at 4x context")),
              ("loss after weight quantisation", ("val loss", "int8 val loss", "int4 val loss")),
              ("hidden-state kurtosis", ("kurtosis",)))
    for i, (title, keys) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        width = 0.8 / len(keys)
        for j, key in enumerate(keys):
            ax.bar([x + j * width for x in range(len(names))], [results[n][key] for n in names], width, label=key)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("normalizer", fontsize=8)
        ax.set_ylabel("kurtosis (Pearson; 3 = Gaussian)" if keys == ("kurtosis",) else "loss (nats/byte)",
                      fontsize=8)
        values = [results[n][k] for n in names for k in keys]
        if key == "kurtosis" and max(values) > 20 * max(min(values), 1e-12):
            ax.set_yscale("log")
        if len(keys) > 1:
            ax.set_ylim(bottom=max(0.0, min(values) - 0.3))
            ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _curve_figure(results: dict[str, dict]):
    """Validation loss against training steps, one line per normalizer."""
    from matplotlib.figure import Figure

    from ._plot import line_style

    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, (name, r) in enumerate(results.items()):
        if r.get("curve"):
            steps, values = zip(*r["curve"])
            ax.plot(steps, values, label=name, **line_style(i))
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title("tiny-LM: validation loss during training")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def _status(results: dict[str, dict]) -> str:
    """Parts of the claim measured against softmax: softpick's sink rate is 0, its kurtosis lower,
    its share of zero weights higher, its int4 loss increase smaller; ssmax's loss grows less from L
    to 4L. Only the parts whose normalizers ran are judged."""
    if "softmax" not in results:
        return "not testable"
    base = results["softmax"]
    checks = []
    if "softpick" in results:
        sp = results["softpick"]
        checks += [sp["sink rate"] == 0, sp["kurtosis"] < base["kurtosis"], sp["zero weights"] > base["zero weights"],
                   sp["int4 val loss"] - sp["val loss"] < base["int4 val loss"] - base["val loss"]]
    if "ssmax" in results:
        ss = results["ssmax"]
        checks.append(ss["loss at 4x context"] - ss["val loss"] < base["loss at 4x context"] - base["val loss"])
    return verdict_of(checks)


def _verdict(results: dict[str, dict]) -> str:
    if "softmax" not in results:
        return "softmax did not run: no baseline to compare with."
    base = results["softmax"]
    parts = []
    if "softpick" in results:
        sp = results["softpick"]
        parts.append(f"softpick vs softmax: sink rate {sp['sink rate']:.0%} vs {base['sink rate']:.0%}, "
                     f"kurtosis {sp['kurtosis']:.3g} vs {base['kurtosis']:.3g}, zero weights "
                     f"{sp['zero weights']:.1%} vs {base['zero weights']:.1%}, int4 loss increase "
                     f"{sp['int4 val loss'] - sp['val loss']:+.3f} vs {base['int4 val loss'] - base['val loss']:+.3f}, "
                     f"val loss {sp['val loss']:.3f} vs {base['val loss']:.3f}")
    if "ssmax" in results:
        ss = results["ssmax"]
        parts.append(f"loss growth from L to 4L: ssmax {ss['loss at 4x context'] - ss['val loss']:+.3f}, "
                     f"softmax {base['loss at 4x context'] - base['val loss']:+.3f}")
    linear = {n: r for n, r in results.items() if n.startswith(LINEAR_TAG)}
    if linear:
        top = min(linear, key=lambda n: linear[n]["val loss"])
        parts.append(f"linear attention at the same token budget (claimed close to softmax in quality): best "
                     f"{top} val loss {linear[top]['val loss']:.3f} vs softmax {base['val loss']:.3f} "
                     f"({linear[top]['val loss'] - base['val loss']:+.3f})")
    best = min(results, key=lambda n: results[n]["val loss"])
    parts.append(f"lowest val loss: {best} ({results[best]['val loss']:.3f})")
    return "; ".join(parts) + ". At this scale (a few hundred steps, 2 layers) these are indications, not replications."


def run(quick: bool = False, seed: int = 0, config: Config | None = None, normalizers=None,
        workers: int | None = None, show_progress: bool = True) -> list[Table]:
    """One tiny LM per normalizer; the metrics table and a plot (``config`` overrides quick/full).

    ``normalizers`` defaults to :data:`NORMALIZERS` and the linear-attention rows (:data:`LINEAR`,
    :data:`QUICK_LINEAR` in quick mode)."""
    cfg = config or (QUICK if quick else FULL)
    if normalizers is None:
        normalizers = normalizer_names(quick) + (QUICK_LINEAR if quick else LINEAR)
    outputs = map_jobs(run_one, [(name, cfg, seed) for name in normalizers], desc="tiny_lm",
                       workers=workers, show_progress=show_progress)
    results = {n: r for n, r in zip(normalizers, outputs) if isinstance(r, dict)}
    skipped = {n: r for n, r in zip(normalizers, outputs) if isinstance(r, str)}
    table = Table(title="tiny-LM: one 2-layer byte-level decoder per normalizer",
                  columns=["normalizer", *METRICS, "learned (mean)"], claim=CLAIM)
    for name, r in results.items():
        table.add(name, *(r[m] for m in METRICS), r["learned"])
    for name, reason in skipped.items():
        table.add(name, *([cell_for(reason)] * len(METRICS)), "-")
    table.verdict = _verdict(results)
    table.status = _status(results)
    corpus = load_corpus(cfg.corpus_bytes)
    notes = (f"{len(corpus):,} bytes of the standard library's .py files ({Path(os.__file__).parent}), "
             f"{1 - cfg.val_fraction:.0%} train / {cfg.val_fraction:.0%} validation; L = {cfg.context}, width "
             f"{cfg.width}, {cfg.heads} heads, {cfg.layers} layers, rotary positions; {cfg.steps} AdamW steps of "
             f"{cfg.batch} windows = {cfg.tokens:,} training tokens; seed {seed}. Sink rate: share of heads whose "
             f"mean weight on the first token (queries L/2..L-1) exceeds {SINK_THRESHOLD}. Kurtosis: Pearson, 3 "
             f"for a Gaussian. int8/int4: symmetric per-channel round-to-nearest of all linear weights. "
             f"'linear:<method>' rows: softmaxkit.linear_attention (chunked causal) instead of normalised scores, "
             f"same weights and batches; their sink rate and zero weights come from the exact weights "
             f"(softmaxkit.linear.attention_weights; InLine's and MALA's may be negative).")
    notes += skipped_note(skipped)
    table.notes = notes
    if results:
        table.add_figure("tiny-LM validation loss vs steps", lambda: _curve_figure(results))
        table.add_figure("tiny-LM metrics", lambda: _figure(results))
    return [table]
