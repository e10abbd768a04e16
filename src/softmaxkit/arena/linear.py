"""Arena ``linear``: softmax-free and linear attention against exact attention, and the
claims of InLine and MALA measured on the same queries and keys.

Tables:

* **Performer vs softmax attention**: relative error ``|out - out_softmax| / |out_softmax|``
  of FAVOR+ (non-causal, ``D = 64``, ``q, k ~ N(0, I) / 2``) as the number of random
  features ``m`` grows, for several ``L``, averaged over independent draws. Claim
  (Choromanski et al. 2020, arXiv 2009.14794): the estimate is unbiased with variance
  falling as ``1/m``, so the error falls as ``m`` grows.
* **SOFT vs its exact Gaussian-kernel attention**: relative error of the Nystrom
  approximation against ``exp(-scale |q - k|^2 / 2) V`` computed densely, as the rank
  grows, on a smooth sequence (``q = k``, as SOFT shares the projection; neighbouring
  tokens alike, as neighbouring image patches are). Claim (Lu et al. 2021, arXiv
  2110.11945): a low-rank Nystrom approximation with Newton pseudo-inverse approximates
  the full kernel attention; the error falls with the rank.
* **Distance to softmax as the query is scaled** (MALA, Fan et al. 2025, arXiv
  2507.00698): total variation ``1/2 sum_j |a_ij - p_ij|`` between each method's weights
  and softmax's on the same ``q``, ``k``, and the largest weight, as ``q`` is scaled by
  ``c``. Claim: softmax sharpens as ``c`` grows, linear attention ignores the magnitude,
  MALA's weights sharpen with ``c`` and stay closer to softmax's.
* **Injectivity** (InLine, Han et al. 2024, arXiv 2412.06590): the largest change of
  the weights when ``q`` is replaced by ``c q`` (``c = 2, 4``). Claim: ratio-normalised
  linear attention with a homogeneous kernel (ReLU) gives ``q`` and ``c q`` identical
  weights; InLine does not.

Rows for the linear methods in the max-retrieval and tiny-LM tasks live in those tasks.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from .._table import Table
from ..linear import attention_weights, draw_projection, linear_attention
from ._runtime import generator

CLAIM = ("Performer's FAVOR+ estimates softmax attention with an error that falls as features are added "
         "(Choromanski et al. 2020); SOFT's Nystrom approximation of Gaussian-kernel attention improves with "
         "the rank (Lu et al. 2021); MALA's weights follow softmax's sharpening as the query grows (Fan et al. "
         "2025); InLine, unlike ratio-normalised linear attention, gives q and c q different weights (Han et al. "
         "2024).")

D = 64


def _softmax_out(q, k, v, scale):
    return torch.softmax(scale * q @ k.transpose(-2, -1), dim=-1) @ v


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def performer_error(lengths, features, draws, seed) -> Table:
    t = Table("Performer (FAVOR+) vs exact softmax attention: relative error of the output",
              ["L"] + [f"m = {m}" for m in features])
    gen = generator(seed)
    errors = {}
    for length in lengths:
        q = 0.5 * torch.randn(1, 4, length, D, generator=gen, dtype=torch.float64)
        k = 0.5 * torch.randn(1, 4, length, D, generator=gen, dtype=torch.float64)
        v = torch.randn(1, 4, length, D, generator=gen, dtype=torch.float64)
        exact = _softmax_out(q, k, v, 1 / math.sqrt(D))
        row = []
        for m in features:
            errs = [_rel(linear_attention(q, k, v, "performer", projection=draw_projection(
                m, D, generator=gen, dtype=torch.float64)), exact) for _ in range(draws)]
            row.append(sum(errs) / len(errs))
        errors[length] = row
        t.add(length, *row)
    falls = all(all(a > b for a, b in itertools.pairwise(r)) for r in errors.values())
    ratio = [r[0] / r[-1] for r in errors.values()]
    t.claim = "FAVOR+ is an unbiased estimate of the softmax kernel: the error falls as the feature count m grows"
    t.status = "held" if falls else ("partly" if any(x > 1 for x in ratio) else "did not hold")
    t.verdict = (f"error falls monotonically with m at every L: {'yes' if falls else 'no'}; from m = {features[0]} "
                 f"to m = {features[-1]} it shrinks {min(ratio):.1f}-{max(ratio):.1f}x (1/sqrt(m) would give "
                 f"{math.sqrt(features[-1] / features[0]):.1f}x).")
    t.notes = f"non-causal, H = 4, D = {D}, q, k ~ N(0, I)/2, scale 1/sqrt(D); mean over {draws} orthogonal draws."
    return t


def _smooth(length, seed):
    gen = generator(seed)
    t = torch.linspace(0, 1, length, dtype=torch.float64)[:, None]
    freqs = 1 + 3 * torch.rand(D, generator=gen, dtype=torch.float64)
    phase = 2 * math.pi * torch.rand(D, generator=gen, dtype=torch.float64)
    x = torch.sin(2 * math.pi * t * freqs + phase) + 0.05 * torch.randn(length, D, generator=gen,
                                                                          dtype=torch.float64)
    return x[None, None]


def soft_error(lengths, ranks, seed) -> Table:
    t = Table("SOFT (Nystrom, Newton pinv) vs exact Gaussian-kernel attention: relative error",
              ["L"] + [f"rank {r}" for r in ranks])
    errors = {}
    for length in lengths:
        x = _smooth(length, seed + length)
        v = torch.randn(1, 1, length, 16, generator=generator(seed), dtype=torch.float64)
        scale = 1 / math.sqrt(D)
        exact = torch.exp(-scale / 2 * torch.cdist(x, x) ** 2) @ v
        row = [_rel(linear_attention(x, x, v, "soft", rank=r, newton_iters=40), exact) if r <= length else None
               for r in ranks]
        errors[length] = [e for e in row if e is not None]
        t.add(length, *[("-" if e is None else e) for e in row])
    falls = all(all(a > b for a, b in itertools.pairwise(r)) for r in errors.values())
    t.claim = "SOFT's Nystrom approximation of Gaussian-kernel attention improves as the rank grows"
    t.status = "held" if falls else "partly" if any(r[-1] < r[0] for r in errors.values()) else "did not hold"
    t.verdict = (f"error falls with the rank at every L: {'yes' if falls else 'no'}; at the largest rank "
                 + ", ".join(f"L = {n}: {r[-1]:.3g}" for n, r in errors.items()) + ".")
    t.notes = (f"q = k = a smooth {D}-dimensional sequence (sines of random frequency plus 5% noise); exact: "
               "exp(-|q - k|^2 / (2 sqrt(D))) V computed densely; 40 Newton iterations; no normalisation.")
    return t


def _tv(a, p) -> torch.Tensor:
    return 0.5 * (a - p).abs().sum(-1)


def magnitude(scales, seed) -> tuple[Table, Table]:
    gen = generator(seed)
    q = torch.randn(1, 1, 64, D, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 256, D, generator=gen, dtype=torch.float64)
    scale = 1 / math.sqrt(D)
    proj = draw_projection(256, D, generator=gen, dtype=torch.float64)
    methods: dict[str, tuple[str | None, dict[str, Any]]] = {
               "linear (elu+1)": ("linear", {}), "performer": ("performer", {"projection": proj}),
               "cosformer": ("cosformer", {}), "inline": ("inline", {}),
               "inline (relu)": ("inline", {"kernel": "relu"}), "mala": ("mala", {})}
    tv = Table("total variation to softmax's weights, and the largest weight, as q is scaled by c",
               ["method"] + [f"TV c={c}" for c in scales] + [f"max w c={c}" for c in scales])
    soft_max = [float(torch.softmax(c * scale * q @ k.transpose(-2, -1), -1).amax(-1).mean()) for c in scales]
    tv.add("softmax", *([0.0] * len(scales)), *soft_max)
    measured = {}
    for label, (name, params) in methods.items():
        assert name is not None  # None only for the softmax row added below
        dists, peaks = [], []
        for c in scales:
            p = torch.softmax(c * scale * q @ k.transpose(-2, -1), -1)
            a = attention_weights(c * q, k, name, **params)
            dists.append(float(_tv(a, p).mean()))
            peaks.append(float(a.amax(-1).mean()))
        measured[label] = (dists, peaks)
        tv.add(label, *dists, *peaks)
    mala_d, mala_p = measured["mala"]
    lin_d, lin_p = measured["linear (elu+1)"]
    sharpens = all(a < b for a, b in itertools.pairwise(mala_p))
    closer = sum(m < lo for m, lo in zip(mala_d, lin_d))
    tv.claim = ("MALA's attention follows softmax's sharpening as the query's magnitude grows, where linear "
                "attention ignores the magnitude (Fan et al. 2025)")
    tv.status = ("held" if sharpens and closer == len(scales) else
                 "partly" if sharpens or closer else "did not hold")
    tv.verdict = (f"softmax's largest weight goes {soft_max[0]:.3f} -> {soft_max[-1]:.3f} from c = {scales[0]} to "
                  f"{scales[-1]}; MALA's {mala_p[0]:.3f} -> {mala_p[-1]:.3f} (sharpens monotonically: "
                  f"{'yes' if sharpens else 'no'}), linear's {lin_p[0]:.3f} -> {lin_p[-1]:.3f}; MALA is closer to "
                  f"softmax than linear attention (TV) at {closer} of {len(scales)} scales.")
    tv.notes = (f"64 queries, 256 keys, q, k ~ N(0, I), D = {D}, scale 1/sqrt(D), non-causal; TV = 1/2 sum |a - p| "
                "(MALA's and InLine's weights sum to one but may be negative); means over the queries.")

    inj = Table("injectivity: largest change of the weights when q becomes c q", ["method", "c = 2", "c = 4",
                                                                                  "identical weights"])
    changes: dict[str, list[float]] = {}
    for label, (name, params) in {**methods, "softmax": (None, {})}.items():
        row = []
        for c in (2.0, 4.0):
            if name is None:
                a0 = torch.softmax(scale * q @ k.transpose(-2, -1), -1)
                a1 = torch.softmax(c * scale * q @ k.transpose(-2, -1), -1)
            else:
                a0 = attention_weights(q, k, name, **params)
                a1 = attention_weights(c * q, k, name, **params)
            row.append(float((a1 - a0).abs().max()))
        changes[label] = row
        inj.add(label, *row, "yes" if max(row) < 1e-9 else "no")
    relu_same = max(changes["cosformer"]) < 1e-9
    inline_diff = min(changes["inline"]) > 1e-6 and min(changes["inline (relu)"]) > 1e-6
    inj.claim = ("ratio-normalised linear attention with a homogeneous (ReLU) kernel gives q and c q identical "
                 "weights (not injective); InLine's subtractive normalisation does not (Han et al. 2024)")
    inj.status = "held" if relu_same and inline_diff else "partly" if relu_same or inline_diff else "did not hold"
    inj.verdict = (f"cosformer (ReLU features, ratio): largest change {max(changes['cosformer']):.2g} "
                   f"({'identical' if relu_same else 'different'}); InLine: {min(changes['inline']):.3g} "
                   f"(identity kernel), {min(changes['inline (relu)']):.3g} (ReLU kernel). "
                   "elu + 1 is not homogeneous, so "
                   f"plain linear attention changes too ({max(changes['linear (elu+1)']):.3g}).")
    inj.notes = "Same queries and keys as the table above; weights from softmaxkit.linear.attention_weights."
    return tv, inj


def run(quick: bool = False, seed: int = 0) -> list[Table]:
    if quick:
        perf = performer_error([256], [16, 64, 256], draws=2, seed=seed)
        soft = soft_error([256], [4, 16, 64], seed=seed)
    else:
        perf = performer_error([256, 1024, 4096], [16, 64, 256, 1024], draws=4, seed=seed)
        soft = soft_error([256, 1024, 4096], [4, 16, 64, 256], seed=seed)
    tv, inj = magnitude([0.5, 1.0, 2.0, 4.0, 8.0], seed)
    return [perf, soft, tv, inj]
