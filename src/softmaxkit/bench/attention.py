"""Attention with every streamable normalizer, on every path, against torch SDPA.

For each normalizer of the registry that can run without the ``Lq x Lk`` matrix
(``spec.streamable``; names are never listed here), at ``L = 4096, H = 4, D = 64``, causal,
float32 (``--quick``: ``L = 256``), every path that applies is timed:

* ``sdpa``: ``softmaxkit.attention(method="sdpa")``, where the normalizer is ``softmax(a x)``
  for a number ``a`` or (on the CPU) softmax with a sink (:mod:`softmaxkit.attention.sdpa`).
  The baseline of every ratio is ``torch.nn.functional.scaled_dot_product_attention`` itself;
* ``flex``: ``torch.nn.attention.flex_attention``, compiled, with the ``softmax_of`` map
  ``g`` as ``score_mod`` (forward only: FlexAttention has no CPU backward); not in
  ``--quick`` (each compile takes tens of seconds);
* ``fused``, ``streaming``, ``dense``: ``softmaxkit.attention(method=...)``.

Times are medians over rounds of the ratio within a round: each round runs every
contender of one normalizer and SDPA once, back to back, so load drift between rounds
cancels. ``auto`` marks what ``method="auto"`` runs (:func:`softmaxkit.attention.auto_method`).
Peak memory is the extra resident memory of one forward + backward.

Targets (issue 13, CPU): on the path ``auto`` takes, forward <= 1.3x SDPA and
forward+backward <= 1.8x for every one-pass normalizer; forward <= 4x and
forward+backward <= 6x for the threshold family (sparsemax, 1.5-entmax); fused peak
memory at most 1/16 of the dense path at ``L = 16384``.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.nn.functional as F

from .. import forms, registry
from .._table import Table
from ..attention import attention, auto_method
from ..attention.inputs import prepare
from ..attention.sdpa import sdpa_plan
from ._measure import machine_header, median_time, peak_memory_bytes

HEADS, HEAD_DIM = 4, 64
LENGTH, QUICK_LENGTH = 4096, 256
MEMORY_LENGTH, QUICK_MEMORY_LENGTH = 16384, 1024
#: the dense path is timed up to this length (its score matrices take ``~5 x H L^2`` floats)
DENSE_LIMIT = 4096
PATHS = ("sdpa", "flex", "fused", "streaming", "dense")
ONE_PASS_TARGETS = (1.3, 1.8)
THRESHOLD_TARGETS = (4.0, 6.0)
MEMORY_TARGET = 1 / 16
MIB = 2 ** 20


def _inputs(length: int, grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed + length)
    return [torch.randn(1, HEADS, length, HEAD_DIM, generator=g).requires_grad_(grad) for _ in range(3)]


def _flex_applies(spec) -> bool:
    return isinstance(spec.form, forms.SoftmaxOf) and spec.form.passes == 1 and spec.stream is None


def _flex_forward(spec, params: dict, length: int):
    """A compiled FlexAttention forward with ``g`` (and its parameters, per head) as score_mod,
    or the reason it cannot run here."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:
        return f"not available: {err}"
    form = spec.form
    scale = HEAD_DIM ** -0.5

    def score_mod(score, b, h, q_idx, kv_idx):
        count = (q_idx + 1).to(score.dtype)
        return forms.call(form.g, score, params, count)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    try:
        mask = create_block_mask(causal, 1, 1, length, length, device="cpu")
        compiled = torch.compile(flex_attention)
        q, k, v = _inputs(length, False)
        with torch.no_grad():
            compiled(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    except Exception as err:
        return f"not run: {type(err).__name__}: {str(err).splitlines()[0][:80]}"
    return lambda qkv: compiled(qkv[0], qkv[1], qkv[2], score_mod=score_mod, block_mask=mask, scale=scale)


def _baseline(qkv):
    return F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)


def _runs_on_sdpa(spec, params: dict, length: int) -> bool:
    """Whether ``method="sdpa"`` runs the normalizer (softmax(a x); on the CPU a sink too)."""
    q, k, v = _inputs(length, False)
    return sdpa_plan(spec, params, prepare(q, k, v, is_causal=True, attn_mask=None, scale=None)) is not None


def _runner(path: str, name: str, params: dict, flex=None):
    if path == "flex":
        return flex
    return lambda qkv: attention(qkv[0], qkv[1], qkv[2], name, is_causal=True, method=path, **params)


def _timings(fns: dict, length: int, repeats: int) -> dict:
    """Per contender: (forward / SDPA, forward+backward / SDPA, forward ms, forward+backward ms)."""
    plain = _inputs(length, False)
    grad = _inputs(length, True)

    def forward(fn):
        with torch.no_grad():
            return fn(plain)

    def both(fn):
        return torch.autograd.grad(fn(grad).sum(), grad)

    jobs = {}
    for path, (fn, backward) in fns.items():
        jobs[(path, "fwd")] = lambda fn=fn: forward(fn)
        if backward:
            jobs[(path, "both")] = lambda fn=fn: both(fn)
    for job in jobs.values():  # warm-up (first calls compile kernels, fill caches)
        job()
    times: dict = {key: [] for key in jobs}
    for _ in range(repeats):
        for key, job in jobs.items():
            times[key].append(median_time(job, repeats=1, warmup=0))
    out = {}
    for path in fns:
        if path == "baseline":
            continue
        row = []
        for kind in ("fwd", "both"):
            if (path, kind) in times:
                row.append(statistics.median(t / b for t, b in zip(times[(path, kind)], times[("baseline", kind)])))
            else:
                row.append("no backward")
        row += [1e3 * statistics.median(times[(path, kind)]) if (path, kind) in times else "-"
                for kind in ("fwd", "both")]
        out[path] = row
    return out


def _return_freed_memory() -> None:
    """Make glibc hand large freed blocks back to the kernel, so that the resident high-water
    mark counts every tensor of the next measurement (it would otherwise reuse freed pages)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD fixed at 128 KiB: big tensors are mmapped
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _memory(path: str, name: str, params: dict, length: int) -> float:
    qkv = _inputs(length, True)
    fn = _runner(path, name, params)
    _return_freed_memory()
    return peak_memory_bytes(lambda: torch.autograd.grad(fn(qkv).sum(), qkv)) / MIB


def _extrapolate(points: dict[int, float], length: int) -> float:
    """``a L^2 + b L`` through the two largest measured lengths."""
    (l1, m1), (l2, m2) = sorted(points.items())[-2:]
    a = (m2 / l2 - m1 / l1) / (l2 - l1)
    b = m1 / l1 - a * l1
    return a * length ** 2 + b * length


def _streamable():
    return [spec for spec in registry.normalizers() if spec.streamable]


def _one_per_form(specs: list) -> list:
    """The first normalizer of each family (those with their own rule grouped by pass count)."""
    seen, out = set(), []
    for spec in specs:
        key = spec.family or spec.streaming
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


def _status(good: int, total: int) -> str:
    if total == 0:
        return "not testable"
    return "held" if good == total else ("did not hold" if good == 0 else "partly")


def run(quick: bool = False, names: list[str] | None = None, length: int | None = None,
        paths: tuple[str, ...] = PATHS, repeats: int | None = None, memory: bool = True,
        device: str = "cpu") -> list[Table]:
    """The time table (every streamable normalizer x path) and the memory table.

    ``names``, ``length``, ``paths``, ``repeats`` and ``memory=False`` narrow a run (for
    a partial rerun from Python); the CLI runs everything. ``device="cuda"`` runs the fused
    Triton kernels against SDPA flash instead (:mod:`.attention_gpu`; skipped without CUDA)."""
    if device == "cuda":
        from .attention_gpu import run as run_gpu

        return run_gpu(quick=quick)
    header = machine_header()
    length = length or (QUICK_LENGTH if quick else LENGTH)
    repeats = repeats or (3 if quick else 5)
    specs = [s for s in _streamable() if names is None or s.name in names]
    if quick and names is None:  # one normalizer per form (and per own-rule kind): the demo's time budget
        specs = _one_per_form(specs)
    time_table = Table(
        title=f"attention time (L={length}, H={HEADS}, D={HEAD_DIM}, causal, float32): ratios to SDPA, lower is faster",
        columns=["normalizer", "family", "passes", "path", "auto", "fwd / SDPA", "fwd+bwd / SDPA", "fwd ms",
                 "fwd+bwd ms", "peak MiB fwd+bwd"])
    for spec in specs:
        params: dict[str, Any] = {}
        q, k, v = _inputs(length, False)
        chosen = auto_method(q, k, v, spec.name, is_causal=True, **params)
        fns: dict = {"baseline": (_baseline, True)}
        skipped = {}
        for path in paths:
            if path == "sdpa":
                if _runs_on_sdpa(spec, params, length):
                    fns[path] = (_runner(path, spec.name, params), True)
            elif path == "flex":
                if quick or not _flex_applies(spec):
                    continue
                flex = _flex_forward(spec, spec.with_defaults(params), length)
                if isinstance(flex, str):
                    skipped[path] = flex
                    continue
                fns[path] = (flex, False)
            elif path == "dense" and length > DENSE_LIMIT:
                skipped[path] = f"not run above L={DENSE_LIMIT}"
            else:
                fns[path] = (_runner(path, spec.name, params), True)
        timed = _timings(fns, length, repeats)
        for path in paths:
            if path in skipped:
                time_table.add(spec.name, spec.family or "-", spec.streaming, path, "", skipped[path], "-", "-", "-",
                               "-")
            if path not in timed:
                continue
            time_table.add(spec.name, spec.family or "-", spec.streaming, path, "auto" if path == chosen else "",
                           *timed[path], "-")
    if memory:  # after every timing: the measurement fixes glibc's mmap threshold, which slows allocations
        for row in time_table.rows:
            if row[3] not in ("flex",) and isinstance(row[5], float):
                row[9] = _memory(row[3], row[0], {}, length)
    machine = (f"Machine: {header['cpu']}, {header['threads']} torch threads, torch {header['torch']}. "
               f"Each ratio is the median over {repeats} rounds of the ratio within a round (every path of "
               "the normalizer and SDPA once, back to back).")
    time_table.notes = (machine + " SDPA = torch scaled_dot_product_attention(is_causal=True) (softmax), the "
                        "baseline of every ratio. flex: compiled FlexAttention with g as score_mod, forward only "
                        f"(no CPU backward). Peak MiB: extra resident memory of one forward + backward. Targets on the "
                        f"auto path: one-pass fwd <= {ONE_PASS_TARGETS[0]}, fwd+bwd <= {ONE_PASS_TARGETS[1]}; "
                        f"threshold family fwd <= {THRESHOLD_TARGETS[0]}, fwd+bwd <= {THRESHOLD_TARGETS[1]}.")
    time_table.claim = ("issue 13, CPU: fused attention within 1.3x SDPA forward and 1.8x forward+backward for "
                        "every one-pass normalizer, 4x / 6x for sparsemax and 1.5-entmax (L=4096, H=4, D=64, "
                        "causal, float32)")
    _time_verdict(time_table, quick, length)
    _attention_headline(time_table)
    tables = [time_table]
    if memory:
        tables.append(_memory_table(specs, quick, machine))
    return tables


def _time_verdict(table: Table, quick: bool, length: int) -> None:
    auto_rows = [r for r in table.rows if r[4] == "auto" and isinstance(r[5], float)]
    checks = []
    for r in auto_rows:
        if r[2] == "one pass":
            limits = ONE_PASS_TARGETS
        elif r[1] == "threshold":
            limits = THRESHOLD_TARGETS
        else:
            continue
        ok = r[5] <= limits[0] and isinstance(r[6], float) and r[6] <= limits[1]
        checks.append((r[0], r[3], r[5], r[6], ok))
    misses = [c for c in checks if not c[4]]
    summary = "; ".join(f"{n} ({p}) {f:.2f} / {b:.2f}" for n, p, f, b, _ in misses) or "none"
    table.verdict = (f"at L={length}, {len(checks) - len(misses)} of {len(checks)} targeted normalizers meet both "
                     f"targets on their auto path; misses (fwd / fwd+bwd ratios): {summary}")
    if quick or length != LENGTH:
        table.status = "not testable"
        table.verdict += f" (L={length}: the targets are set at L={LENGTH}; run without --quick)"
    else:
        table.status = _status(len(checks) - len(misses), len(checks))


def _attention_headline(table: Table) -> None:
    """Forward time of the auto path of the slowest one-pass normalizer against SDPA."""
    rows = [r for r in table.rows if r[4] == "auto" and r[2] == "one pass" and isinstance(r[5], float)]
    if rows:
        worst = max(rows, key=lambda r: r[5])
        table.add_headline("attention forward (auto path, slowest one-pass normalizer)", "torch SDPA (softmax)",
                           1 / worst[5], f"{worst[0]} ({worst[3]})")


def _memory_table(specs, quick: bool, machine: str) -> Table:
    """Fused against dense peak memory at the long length, one normalizer per fused kind."""
    from ..attention.fused import kind_for

    long = QUICK_MEMORY_LENGTH if quick else MEMORY_LENGTH
    short = [long // 8, long // 4] if not quick else [long // 4, long // 2]
    table = Table(title=f"attention peak extra memory of forward+backward at L={long} (H={HEADS}, D={HEAD_DIM}, "
                        "causal, float32)",
                  columns=["normalizer", "fused kind", "L", "fused MiB", "streaming MiB", "dense MiB",
                           "fused / dense"])
    seen = set()
    extrapolated = []
    for spec in specs:
        kind = kind_for(spec, spec.with_defaults({}))
        if kind in seen:
            continue
        seen.add(kind)
        dense = {n: _memory("dense", spec.name, {}, n) for n in short}
        dense_long = _extrapolate(dense, long)
        extrapolated.append(spec.name)
        fused_mib = _memory("fused", spec.name, {}, long)
        stream_mib = _memory("streaming", spec.name, {}, long)
        table.add(spec.name, kind, long, fused_mib, stream_mib, dense_long, fused_mib / max(dense_long, 1.0))
    worst = max((r[6] for r in table.rows), default=float("nan"))
    table.notes = (machine + f" Dense memory at L={long} extrapolated as a L^2 + b L from L={short[0]} and "
                   f"{short[1]} (measured) for: {', '.join(extrapolated)}. Target: fused / dense <= 1/16 = 0.0625.")
    table.claim = "issue 13, CPU: fused peak memory at most 1/16 of the dense path at L=16384"
    table.verdict = f"at L={long}, fused / dense peak memory is at most {worst:.4f} (target 0.0625)"
    if quick:
        table.status = "not testable"
        table.verdict += f" (quick: L={long}, the target is set at L={MEMORY_LENGTH})"
    else:
        good = sum(r[6] <= MEMORY_TARGET for r in table.rows)
        table.status = _status(good, len(table.rows))
    return table
