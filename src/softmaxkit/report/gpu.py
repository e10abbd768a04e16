"""The GPU variants of the benchmark, run by the report as their own part ("bench gpu").

With a CUDA device: the Triton softmax kernel against ``torch.softmax`` on the GPU, and
softmaxkit attention (softmax, sigmoid) against ``scaled_dot_product_attention`` restricted
to its flash backend, in float16. Without one, each table comes back skipped with the
reason, so the claims they test show as "not testable" in the verdict table.

Times are medians of CUDA-synchronised wall times (:func:`softmaxkit.bench._measure.median_time`),
every figure a ratio to the baseline timed in the same run.
"""

from __future__ import annotations

from .._plugins import Outcome
from .._plugins import run as _run_producer
from .._table import Table

NAME = "gpu"
#: The normalizers the FlashSigmoid claim compares: softmax (through softmaxkit's fused kernel) and sigmoid.
CLAIMED = ("softmax", "sigmoid")

FLASH_SIGMOID_CLAIM = ("FlashSigmoid (Ramapuram et al. 2024, arXiv 2409.04431): a sigmoid-attention kernel is 17% "
                       "faster than FlashAttention-2 in the forward pass on H100.")


def available() -> bool:
    """Whether a CUDA device is usable by torch."""
    return why_not() is None


def why_not() -> str | None:
    """Why the GPU variants cannot run here, or ``None`` when they can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def run_outcome(quick: bool = False) -> Outcome:
    """This module run as a producer, like a bench suite."""
    return _run_producer("bench", NAME, __name__, lambda module: module.run(quick=quick))


def _synced(fn):
    import torch

    def call():
        fn()
        torch.cuda.synchronize()
    return call


def softmax_table(quick: bool) -> Table:
    table = Table("GPU softmax forward (Triton) vs torch.softmax, CUDA",
                  ["shape", "dtype", "torch ms", "triton ms", "speedup vs torch.softmax"])
    reason = why_not()
    if reason:
        table.skipped = reason
        return table
    import torch

    from .. import normalize
    from ..bench._measure import median_time
    from ..kernels.dispatch import use_backend

    shapes = [(4096, 32768), (32768, 1024)] if quick else [(4096, 32768), (32768, 1024), (64, 1048576)]
    for shape in shapes:
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(*shape, device="cuda", dtype=dtype)
            t_torch = median_time(_synced(lambda x=x: torch.softmax(x, -1)), repeats=10, warmup=3)
            with use_backend("triton"):
                t_ours = median_time(_synced(lambda x=x: normalize(x, "softmax")), repeats=10, warmup=3)
            name = "x".join(map(str, shape))
            table.add(name, str(dtype).replace("torch.", ""), t_torch * 1e3, t_ours * 1e3, t_torch / t_ours)
            if dtype == torch.float32 and shape == shapes[0]:
                table.add_headline("softmax forward (GPU)", "torch.softmax (CUDA)", t_torch / t_ours,
                                   f"{name}, float32")
    table.notes = "Medians of 10 CUDA-synchronised runs after 3 warm-ups; sk.normalize under use_backend('triton')."
    return table


def attention_table(quick: bool) -> Table:
    table = Table("GPU attention forward vs SDPA flash (causal, float16)",
                  ["normalizer", "L", "SDPA flash ms", "softmaxkit ms", "time / SDPA flash"],
                  claim=FLASH_SIGMOID_CLAIM)
    reason = why_not()
    if reason:
        table.skipped = reason
        table.status = "not testable"
        return table
    import torch
    import torch.nn.functional as F

    from .. import attention
    from ..bench._measure import median_time

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch
        table.skipped = "torch.nn.attention.sdpa_kernel is not available in this torch"
        table.status = "not testable"
        return table
    lengths = [4096] if quick else [4096, 16384]
    ratios = {}
    for length in lengths:
        g = torch.Generator(device="cuda").manual_seed(length)
        q, k, v = (torch.randn(4, 16, length, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t_flash = median_time(
                _synced(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                repeats=10, warmup=3)
        for name in CLAIMED:  # softmax through our fused kernel (not SDPA), and the claim's sigmoid
            try:
                t_ours = median_time(
                    _synced(lambda q=q, k=k, v=v, name=name:
                            attention(q, k, v, name, is_causal=True, method="fused")), repeats=10, warmup=3)
            except Exception as err:
                table.add(name, length, t_flash * 1e3, f"failed: {type(err).__name__}", "-")
                continue
            ratios[(name, length)] = t_ours / t_flash
            table.add(name, length, t_flash * 1e3, t_ours * 1e3, t_ours / t_flash)
            if name == CLAIMED[-1] and length == lengths[0]:
                table.add_headline("attention forward, sigmoid (GPU)", "SDPA flash (softmax)", t_flash / t_ours,
                                   f"L={length}, float16")
    sigmoid = [r for (name, _), r in ratios.items() if name == CLAIMED[-1]]
    if not sigmoid:
        table.status = "not testable"
        table.verdict = "softmaxkit's sigmoid attention did not run on this GPU."
    else:
        best = min(sigmoid)
        table.status = "held" if best <= 1 / 1.17 else "partly" if best < 1 else "did not hold"
        table.verdict = (f"sigmoid attention took {best:.2f}x the time of SDPA flash at best "
                         f"(the claim needs <= {1 / 1.17:.2f}x).")
    table.notes = ("q, k, v of shape (4, 16, L, 64); SDPA restricted to its flash backend; 'softmax' streams with "
                   "temperature 0.9 (plain softmax is SDPA itself). Medians of 10 CUDA-synchronised runs.")
    return table


def run(quick: bool = False) -> list[Table]:
    """The GPU tables (skipped, with the reason, without CUDA)."""
    return [softmax_table(quick), attention_table(quick)]
