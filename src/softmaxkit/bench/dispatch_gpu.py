"""Bench ``dispatch --device cuda``: the default ``auto`` backend against torch on a GPU.

The CUDA half of :mod:`softmaxkit.bench.dispatch`: the same grid (op x shape x dtype x
forward or forward + backward), float32 and bfloat16, with four callables timed,
interleaved, in one process: torch (``torch.softmax`` / ``log_softmax`` / ``logsumexp``),
the Triton kernel (:mod:`softmaxkit.kernels.gpu.softmax`; none for log-sum-exp), aten as
``auto`` runs it (:func:`softmaxkit.kernels.dispatch._run_aten`: aten, then a look at one
column for the rows the reference defines differently, which waits for the GPU) and ``auto``
itself. The figure is ``auto / min(torch, kernel)``, as on the CPU.

Each timed call is :data:`QUEUE` calls queued back to back and one synchronisation, divided
by :data:`QUEUE`: the time per call of a training loop, where the CPU's launches overlap the
GPU's work unless something waits for the GPU (a host-device synchronisation shows here, as
it does in the loop).
"""

from __future__ import annotations

import gc

import torch

import softmaxkit as sk

from .._table import Table
from ..kernels import dispatch
from .dispatch import _TORCH, FULL_SHAPES, OPS, PASSES, QUICK_SHAPES, _callable, _sk, interleaved_times, judge_grid

DTYPES = (torch.float32, torch.bfloat16)
#: (the tests run the grid on CPU tensors under Triton's interpreter)
DEVICE = "cuda"
QUEUE = 10
ROUND_BUDGET = 0.03


def _kernel_op(op):
    if op == "logsumexp":
        return None
    from ..kernels.gpu import softmax as gpu
    return getattr(gpu, op)


def _aten_op(op):
    reference = getattr(sk, op)
    return lambda x: dispatch._run_aten(op, reference, x, -1, None, {})


def _queued(fn, x, pass_):
    """``QUEUE`` calls (forward, or forward and backward) and one synchronisation."""
    one = _callable(fn, x, pass_)

    def call():
        for _ in range(QUEUE):
            one()
        _synchronize()
    return call


def _synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def grid_table(shapes, repeats: int, budget: float) -> Table:
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE
    table = Table(f"sk (auto backend) against torch and the Triton kernel, {name}", [
        "shape", "kind", "op", "dtype", "pass", "torch us", "kernel us", "aten route us", "auto us", "auto picks",
        "torch / auto", "auto / best"])
    for kind, shape in shapes:
        for dtype in DTYPES:
            for pass_ in PASSES:
                x = (torch.randn(*shape, device=DEVICE, dtype=torch.float32) * 3).to(dtype)
                if pass_ == "fwd+bwd":
                    x.requires_grad_()
                for op in OPS:
                    picked = dispatch.plan(op, x, -1, None)
                    kernel = _kernel_op(op)
                    fns = [_queued(_TORCH[op], x, pass_), _queued(_aten_op(op), x, pass_), _queued(_sk(op), x, pass_)]
                    if kernel is not None:
                        fns.append(_queued(kernel, x, pass_))
                    times = [t / QUEUE * 1e6 for t in interleaved_times(fns, repeats, budget)]
                    t_torch, t_aten, t_auto = times[:3]
                    t_kernel = times[3] if kernel is not None else float("nan")
                    best = min(t_torch, t_kernel) if kernel is not None else t_torch
                    table.add("x".join(map(str, shape)), kind, op, str(dtype).replace("torch.", ""), pass_,
                              t_torch, t_kernel, t_aten, t_auto, picked, t_torch / t_auto, t_auto / best)
                del x
                gc.collect()
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    judge_grid(table, "the Triton kernel")
    table.notes = (f"torch {torch.__version__}. Times per call: {QUEUE} calls queued and one synchronisation, the "
                   "fastest of interleaved rounds. 'aten route' is aten as auto runs it where it does not take "
                   "the kernel (a look at one column for rows to recompute: it waits for the GPU).")
    return table


def run(quick: bool = False) -> list[Table]:
    if not torch.cuda.is_available():
        return [Table("sk (auto backend) against torch and the Triton kernel (CUDA)", [],
                      skipped="no CUDA device: --device cuda needs a GPU")]
    try:
        import triton  # noqa: F401
    except ImportError:
        return [Table("sk (auto backend) against torch and the Triton kernel (CUDA)", [],
                      skipped="triton is not installed (pip install softmaxkit[gpu])")]
    shapes = QUICK_SHAPES if quick else FULL_SHAPES
    return [grid_table(shapes, repeats=3 if quick else 7, budget=0.005 if quick else ROUND_BUDGET)]
