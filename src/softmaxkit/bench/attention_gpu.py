"""Bench ``attention --device cuda``: the fused Triton kernels against SDPA's flash backend.

Problem (issue 13's GPU targets): ``B = 4``, ``H = 16``, ``D = 128``, ``L = 8192``, causal,
bfloat16. For every normalizer that declares Triton pieces (quick: one per family plus
sparsemax and entmax15), the forward and the forward + backward of
:func:`softmaxkit.attention.fused_triton.fused_attention` as ratios to
``scaled_dot_product_attention`` restricted to the flash backend, timed with CUDA events,
interleaved (SDPA, kernel, SDPA, ...) and reported as the median of the paired ratios.
Each normalizer is also compared with its dense float32 reference at a small shape
(``L = 512``) for a sanity check of the output.

Targets: one-pass normalizers forward <= 1.25x and forward + backward <= 1.5x;
sparsemax and entmax15 (threshold family) forward <= 2.5x. Without CUDA (or without
triton) the suite returns one skipped table with the reason.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.nn.functional as F

from .. import registry
from .._table import Table

BATCH, HEADS, HEAD_DIM, LENGTH = 4, 16, 128, 8192
QUICK_NAMES = ["softmax", "ssmax", "softpick", "relu_l1", "sigmoid", "sparsemax", "entmax15"]
#: plain softmax would go to SDPA itself; the kernel runs it with a temperature
PARAMS: dict[str, dict[str, Any]] = {"softmax": {"temperature": 0.9}}
TARGETS = {"one pass": (1.25, 1.5), "threshold": (2.5, None)}


def _cuda_time(fn, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def _paired(baseline, candidate, repeats: int) -> float:
    baseline()
    candidate()
    torch.cuda.synchronize()
    ratios = []
    for _ in range(repeats):
        t0 = _cuda_time(baseline, warmup=0)
        t1 = _cuda_time(candidate, warmup=0)
        ratios.append(t1 / t0)
    return statistics.median(ratios)


def _sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _skipped(reason: str) -> list[Table]:
    return [Table(title="Fused Triton attention vs SDPA flash (CUDA)", columns=[], skipped=reason)]


def run(quick: bool = False) -> list[Table]:
    if not torch.cuda.is_available():
        return _skipped("no CUDA device: the GPU bench runs only with --device cuda on a GPU")
    try:
        import triton  # noqa: F401
    except ImportError:
        return _skipped("triton is not installed (pip install softmaxkit[gpu])")
    from ..attention import attention
    from ..attention.fused_triton import fused_attention

    names = [s.name for s in registry.normalizers() if s.triton is not None]
    if quick:
        names = [n for n in names if n in QUICK_NAMES]
    repeats = 5 if quick else 7
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (BATCH, HEADS, LENGTH, HEAD_DIM)
    qkv = [torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
    grad = torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)
    small = [t[:1, :2, :512].detach().float().contiguous() for t in qkv]

    def fb(fn):
        def call():
            out = fn(*qkv)
            torch.autograd.grad(out, qkv, grad)
        return call

    table = Table(title=f"Fused Triton attention / SDPA flash, bf16, B={BATCH}, H={HEADS}, D={HEAD_DIM}, "
                        f"L={LENGTH}, causal (median of {repeats} paired runs)",
                  columns=["normalizer", "family", "forward / SDPA", "fwd+bwd / SDPA", "target fwd",
                           "target fwd+bwd", "meets target", "max |err| vs dense fp32 (L=512)"])
    for name in names:
        spec = registry.get(name)
        params = PARAMS.get(name, {})
        kind = "threshold" if spec.family == "threshold" else "one pass"
        t_fwd, t_fb = TARGETS[kind]

        def fwd(q, k, v, name=name, params=params):
            return fused_attention(q, k, v, name, is_causal=True, **params)

        with torch.no_grad():
            r_fwd = _paired(lambda: _sdpa(*qkv), lambda: fwd(*qkv), repeats)
        r_fb = _paired(fb(_sdpa), fb(fwd), repeats) if t_fb is not None or not quick else float("nan")
        ok = r_fwd <= t_fwd and (t_fb is None or r_fb <= t_fb)
        with torch.no_grad():
            sq, sk_, sv = small
            ref = attention(sq, sk_, sv, name, is_causal=True, method="dense", **params)
            err = (fused_attention(sq, sk_, sv, name, is_causal=True, **params) - ref).abs().max().item()
        table.add(name, spec.family, r_fwd, r_fb, t_fwd, t_fb if t_fb is not None else "-", "yes" if ok else "no",
                  err)
        torch.cuda.empty_cache()
    return [table]
