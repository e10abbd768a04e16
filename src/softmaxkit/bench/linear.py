"""Bench ``linear``: softmax-free and linear attention against torch SDPA, as ratios in one run.

Problem (the issue's): one sequence, ``H = 4`` heads, ``D = 64``, float32, causal, lengths
``L`` = 1k ... 64k (quick: 128 and 256). For each causal method of
:func:`softmaxkit.linear_attention` (``linear``, ``performer`` with 256 features,
``cosformer``, ``inline``, ``mala``; chunked causal path, chunks of 64) and for SOFT
(non-causal, rank 64, against non-causal SDPA):

* the speed-up over ``torch.nn.functional.scaled_dot_product_attention`` of the forward
  pass and of forward + backward: the median over repeats of the paired ratio
  ``t_sdpa / t_method``, every repeat timing SDPA and each method one after the other
  (interleaved, so that load from other processes hits all of them alike);
* the extra peak resident memory of the forward pass (:func:`._measure.peak_memory_bytes`)
  and of forward + backward, in MiB and per token;
* the crossover: the smallest measured ``L`` from which each method stays faster than SDPA.

Cost on 2 threads: SDPA's causal forward at ``L = 65536`` is about 2 TFLOP (half a minute),
so forward + backward is timed up to ``L = 32768``, non-causal SOFT and SDPA's memory up to
``L = 16384``, with fewer repeats (and SDPA without warm-up) from ``L = 32768``.

Targets (issue 14, CPU, 2 threads): chunked ``linear`` faster than SDPA from ``L = 4096``
and at least 4x faster at ``L = 32768``; ``performer`` and ``cosformer`` cross over by
``L = 8192``; memory linear in ``L``. Verdicts are computed from the measurements below.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from .._table import Table
from ..linear import draw_projection, linear_attention
from ..linear import get as get_linear
from ._measure import machine_header, peak_memory_bytes

HEADS, HEAD_DIM = 4, 64
CAUSAL = ["linear", "performer", "cosformer", "inline", "mala"]
NB_FEATURES, SOFT_RANK, CHUNK = 256, 64, 64
SDPA = "sdpa"  # the baseline runner's name
FULL_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_LENGTHS = [128, 256]
MIB = 2 ** 20


def _params(name: str, length: int) -> dict:
    """The bench's setting of each parameter the method declares (a fixed Performer projection of
    NB_FEATURES features, cosFormer's horizon at L, SOFT's rank); ``"sdpa"`` takes none."""
    declared = {} if name == SDPA else get_linear(name).params
    settings = {
        "projection": lambda: draw_projection(NB_FEATURES, HEAD_DIM, generator=torch.Generator().manual_seed(0)),
        "max_len": lambda: length,
        "rank": lambda: SOFT_RANK,
    }
    return {key: make() for key, make in settings.items() if key in declared}


def _inputs(length: int, grad: bool):
    g = torch.Generator().manual_seed(length)
    return [torch.randn(1, HEADS, length, HEAD_DIM, generator=g).requires_grad_(grad) for _ in range(3)]


def _call(name, qkv, causal, params):
    q, k, v = qkv
    if name == SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return linear_attention(q, k, v, name, is_causal=causal, chunk_size=CHUNK, **params)


def _runner(name, length, causal, backward):
    qkv = _inputs(length, backward)
    params = _params(name, length)
    if not backward:
        def run():
            with torch.no_grad():
                return _call(name, qkv, causal, params)
    else:
        def run():
            out = _call(name, qkv, causal, params)
            return torch.autograd.grad(out.sum(), qkv)
    return run


def _interleaved(runners: dict, repeats: int, warm_sdpa: bool = True) -> dict:
    """Median time of each runner and median paired ratio ``t_sdpa / t`` (interleaved repeats)."""
    for name, run in runners.items():
        if warm_sdpa or name != "sdpa":
            run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    out = {}
    for name, ts in times.items():
        ratios = [s / t for s, t in zip(times["sdpa"], ts)]
        out[name] = (statistics.median(ts), statistics.median(ratios))
    return out


def _crossover(lengths, speedups) -> int | None:
    """Smallest measured L from which every larger measured L is faster than SDPA."""
    cross = None
    for length, s in zip(reversed(lengths), reversed(speedups)):
        if s is None or s <= 1.0:
            break
        cross = length
    return cross


def run(quick: bool = False) -> list[Table]:
    lengths = QUICK_LENGTHS if quick else FULL_LENGTHS
    repeats = 2 if quick else 5
    names = ["sdpa"] + CAUSAL
    fwd = Table("causal forward: speed-up over SDPA (t_sdpa / t, median of interleaved pairs)",
                ["L", "SDPA ms"] + CAUSAL)
    fwbw = Table("causal forward + backward: speed-up over SDPA", ["L", "SDPA ms"] + CAUSAL)
    soft_t = Table("non-causal: SOFT (rank 64) and linear against non-causal SDPA, speed-up",
                   ["L", "SDPA ms", "soft fwd", "linear fwd", "soft fwd+bwd", "linear fwd+bwd"])
    mem = Table("extra peak memory, forward (MiB) and forward + backward (KiB per token)",
                ["L", "SDPA fwd", "linear fwd", "performer fwd", "SDPA fwd+bwd /tok", "linear fwd+bwd /tok",
                 "performer fwd+bwd /tok"])
    speed: dict[str, dict[str, list[float | None]]] = {"fwd": {n: [] for n in CAUSAL}, "fwbw": {n: [] for n in CAUSAL}}
    mem_rows = []
    for length in lengths:
        long = length >= 32768
        reps = 2 if long else repeats
        f = _interleaved({n: _runner(n, length, True, False) for n in names}, reps, warm_sdpa=not long)
        fwd.add(length, 1e3 * f["sdpa"][0], *[f[n][1] for n in CAUSAL])
        for n in CAUSAL:
            speed["fwd"][n].append(f[n][1])
        if length <= 32768:
            b = _interleaved({n: _runner(n, length, True, True) for n in names}, 1 if long else max(2, reps - 2),
                             warm_sdpa=not long)
            fwbw.add(length, 1e3 * b["sdpa"][0], *[b[n][1] for n in CAUSAL])
            for n in CAUSAL:
                speed["fwbw"][n].append(b[n][1])
        else:
            for n in CAUSAL:
                speed["fwbw"][n].append(None)
        if length <= 16384:
            nc = _interleaved({n: _runner(n, length, False, False) for n in ("sdpa", "soft", "linear")}, reps)
            ncb = _interleaved({n: _runner(n, length, False, True) for n in ("sdpa", "soft", "linear")},
                               max(2, reps - 2))
            soft_t.add(length, 1e3 * nc["sdpa"][0], nc["soft"][1], nc["linear"][1], ncb["soft"][1],
                       ncb["linear"][1])
        measured = ("sdpa", "linear", "performer") if length <= 16384 else ("linear", "performer")
        m_f = {n: peak_memory_bytes(_runner(n, length, True, False)) for n in measured}
        m_b = {n: peak_memory_bytes(_runner(n, length, True, True)) for n in measured}
        mem.add(length, m_f["sdpa"] / MIB if "sdpa" in m_f else "not run", m_f["linear"] / MIB,
                m_f["performer"] / MIB,
                *[m_b[n] / 1024 / length if n in m_b else "not run" for n in ("sdpa", "linear", "performer")])
        mem_rows.append((length, m_b["linear"], m_b["performer"]))

    fwbw_lengths = [n for n in lengths if n <= 32768]
    for n in CAUSAL:
        speed["fwbw"][n] = speed["fwbw"][n][:len(fwbw_lengths)]
    cross = Table("crossover: smallest measured L from which the method stays faster than SDPA (causal)",
                  ["method", "forward", "forward + backward", "fwd speed-up at largest L"])
    for n in CAUSAL:
        cross.add(n, _crossover(lengths, speed["fwd"][n]) or "none measured",
                  _crossover(fwbw_lengths, speed["fwbw"][n]) or "none measured", speed["fwd"][n][-1])

    _verdicts(lengths, speed, fwd, cross, mem, mem_rows, quick)
    header = machine_header()
    note = (f"machine: {header['cpu']}, {header['threads']} threads, torch {header['torch']}. Every figure is a "
            "median of paired ratios from interleaved repeats in one process; other processes on the machine "
            "load all runners alike but add noise. Rerun: `softmaxkit bench linear`.")
    for t in (fwd, fwbw, soft_t, mem, cross):
        t.notes = note if t.notes is None else t.notes + " " + note
    return [fwd, fwbw, cross, soft_t, mem]


def _at(lengths, values, length):
    return values[lengths.index(length)] if length in lengths else None


def _verdicts(lengths, speed, fwd, cross, mem, mem_rows, quick) -> None:
    if quick or 32768 not in lengths:
        for t in (fwd, cross):
            t.claim = ("chunked linear attention faster than SDPA from L = 4096 and >= 4x at L = 32768; "
                       "performer and cosformer cross over by L = 8192 (CPU, 2 threads, H = 4, D = 64, causal)")
            t.status = "not testable"
            t.verdict = f"quick mode measures only L = {lengths}; run `softmaxkit bench linear` for the targets."
    else:
        lin = speed["fwd"]["linear"]
        from_4k = all(s > 1.0 for length, s in zip(lengths, lin) if length >= 4096)
        at_32k = _at(lengths, lin, 32768)
        fwd.claim = "chunked causal linear attention (elu + 1) faster than SDPA from L = 4096, >= 4x at L = 32768"
        held = [from_4k, at_32k >= 4.0]
        fwd.status = "held" if all(held) else "partly" if any(held) else "did not hold"
        speedups = ", ".join(f"{s:.2f}x at {n}" for n, s in zip(lengths, lin))
        fwd.verdict = (f"linear forward speed-up over SDPA: {speedups}"
                       f"; faster from 4096 on: {'yes' if from_4k else 'no'}; at 32768: {at_32k:.2f}x.")
        cross.claim = "performer (256 features) and cosformer cross over SDPA by L = 8192 (forward, causal)"
        ok = {}
        for n in ("performer", "cosformer"):
            c = _crossover(lengths, speed["fwd"][n])
            ok[n] = c is not None and c <= 8192
        cross.status = "held" if all(ok.values()) else "partly" if any(ok.values()) else "did not hold"
        cross.verdict = "; ".join(f"{n}: crossover {_crossover(lengths, speed['fwd'][n]) or 'not reached'}"
                                  for n in ok) + "."
    # memory: fwd+bwd bytes per token roughly constant once the fixed overhead is amortised
    per_tok = [m / length for length, m, _ in mem_rows if m > 0]
    mem.claim = "memory linear in L (chunked causal path: no L x L tensor, no per-position d x d state)"
    if len(per_tok) >= 2 and not quick:
        growth = per_tok[-1] / per_tok[len(per_tok) // 2]
        mem.status = "held" if growth < 2.0 else "did not hold"
        mem.verdict = (f"linear forward + backward extra memory per token: {per_tok[len(per_tok) // 2] / 1024:.1f} KiB "
                       f"at L = {mem_rows[len(per_tok) // 2][0]}, {per_tok[-1] / 1024:.1f} KiB at L = "
                       f"{mem_rows[-1][0]} (ratio {growth:.2f}; quadratic growth would give "
                       f"{mem_rows[-1][0] / mem_rows[len(per_tok) // 2][0]:.0f}).")
    else:
        mem.status = "not testable"
        mem.verdict = "quick mode: too few and too short lengths to tell linear from quadratic memory."
