r"""Bench ``distributed``: ring attention on P = 1, 2, 4 gloo processes at a fixed total length.

One spawn of 4 CPU processes (torch.multiprocessing, gloo on 127.0.0.1, 1 thread each)
holds process groups of 1, 2 and 4 ranks. For each P, every rank of the group runs
:func:`softmaxkit.distributed.context_parallel_attention` (softmax, causal, zigzag
layout) forward + backward on its shard of the same problem and measures:

* peak memory: the rise of its resident set (``VmHWM``, reset before the call) while it
  builds its shard of ``q, k, v`` and runs forward + backward: the largest over the ranks;
  the baseline is one process running :func:`softmaxkit.attention` (streaming) on the
  whole sequence, measured the same way;
* communication: bytes this rank hands to ``batch_isend_irecv`` per layer (forward +
  backward), counted, and checked against the formula
  ``2 (P - 1) n Hkv D e`` (K, V forward) ``+ 2 (P - 1) n Hkv D e`` (K, V again)
  ``+ 2 P n Hkv D 4`` (dK, dV in float32) with ``n = L / P``, ``e`` bytes per element;
* time (median; on this 2-core machine P = 4 processes share 2 cores, so times beyond
  P = 2 measure contention, not scaling) and the largest difference to the one-process
  output.

The scaling table for P = 8 .. 64 is **modelled, not measured**: per ring step, compute
``t_c(n) = t_1 (n / L)^2`` (the measured one-process time ``t_1`` of the whole L x L
problem, forward and backward separately; attention work grows with the square of the
block) and communication ``t_x(n) = alpha + bytes(n) / beta`` with a stated link of
``beta`` = 12.5 GB/s (100 Gb/s) and ``alpha`` = 10 us per message; the forward overlaps
K/V transfer with compute, ``max(t_c, t_x)``, the backward adds the dK/dV transfer,
which follows the compute; the total is ``P`` steps. Memory per rank is modelled as
``a / P + c``, fitted to the measured P = 1, 2, 4.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
from typing import Any

import torch

from .._table import Table
from ._measure import machine_header, peak_memory_bytes

MIB = 2**20
SIZES = (1, 2, 4)
MODELLED = (8, 16, 32, 64)
#: the stated bandwidth model of the modelled table
LINK_BYTES_PER_S = 12.5e9
LATENCY_S = 10e-6
#: glibc's mmap threshold in the measuring processes (see :func:`measure`)
MMAP_THRESHOLD = 65536


def _config(quick: bool) -> dict:
    if quick:
        return {"b": 1, "h": 4, "hkv": 4, "length": 1536, "d": 64, "block": (64, 128), "repeats": 1}
    return {"b": 1, "h": 4, "hkv": 4, "length": 3072, "d": 64, "block": (64, 128), "repeats": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _worker(rank: int, world: int, port: int, out_dir: str, cfg: dict) -> None:
    import torch.distributed as dist

    from ..attention import attention
    from ..distributed import context_parallel_attention, shard_sequence
    from ..distributed._comm import TorchComm

    class CountingComm(TorchComm):
        sent = 0

        def ring_start(self, send, recv, tag):
            self.sent += sum(t.numel() * t.element_size() for t in send)
            return super().ring_start(send, recv, tag)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    groups = {p: dist.new_group(list(range(p))) for p in SIZES}
    b, h, hkv, length, d = cfg["b"], cfg["h"], cfg["hkv"], cfg["length"], cfg["d"]
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(b, n, length, d, generator=g) for n in (h, hkv, hkv, h))
    results: dict = {}

    def train_step(fn, shard):  # shard(t) returns a new tensor: this rank's inputs, built inside the measurement
        def run():
            leaves = [shard(t).requires_grad_() for t in (q, k, v)]
            out = fn(*leaves)
            (out * shard(w)).sum().backward()
        return run

    if rank == 0:  # the one-process baseline: softmaxkit.attention on the whole sequence
        def full(*t):
            return attention(*t, "softmax", is_causal=True, method="streaming", block_size=cfg["block"])

        step = train_step(full, torch.clone)
        step()  # warm-up: lazy initialisation is not the computation's memory
        results["one"] = {"peak": peak_memory_bytes(step), "time": _median_time(step, cfg["repeats"])}

        def forward_only():
            with torch.no_grad():
                full(q, k, v)

        results["one"]["forward_time"] = _median_time(forward_only, cfg["repeats"])
    with torch.no_grad():
        ref = attention(q, k, v, "softmax", is_causal=True, method="streaming", block_size=cfg["block"])
    dist.barrier()
    for p in SIZES:
        if rank < p:
            comm = CountingComm(groups[p])

            def ring(*t, comm=comm):
                return context_parallel_attention(*t, "softmax", group=comm, is_causal=True, layout="zigzag",
                                                  block_size=cfg["block"])

            def shard(t, p=p):
                return shard_sequence(t, rank, p, layout="zigzag")

            step = train_step(ring, shard)
            step()  # warm-up: gloo connects its pairs and allocates its buffers on first use
            peak = peak_memory_bytes(step)
            comm.sent = 0
            elapsed = _median_time(step, cfg["repeats"])
            sent = comm.sent // cfg["repeats"]
            with torch.no_grad():
                out = ring(*(shard(t) for t in (q, k, v)))
                err = (out - shard(ref)).abs().max().item()
            results[str(p)] = {"peak": peak, "sent": sent, "time": elapsed, "err": err}
        dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def measure(quick: bool = False, config: dict | None = None) -> tuple[dict, dict]:
    """Spawn the 4 processes; per P, the worst rank's peak, bytes sent, time and error.

    ``config`` replaces the sizes of ``quick`` (keys of :func:`_config`)."""
    import torch.multiprocessing as mp

    cfg = {**_config(quick), **(config or {})}
    world = max(SIZES)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    # glibc: every allocation of 64 KiB or more is its own mapping, returned when freed, so that the
    # resident set follows the live tensors (otherwise freed blocks stay resident and are reused unseen)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(_worker, args=(world, _free_port(), out_dir, cfg), nprocs=world, join=True)
            per_rank = []
            for r in range(world):
                with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                    per_rank.append(json.load(f))
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    measured: dict[str | int, Any] = {"one": per_rank[0]["one"]}
    for p in SIZES:
        rows = [per_rank[r][str(p)] for r in range(p)]
        measured[p] = {key: max(row[key] for row in rows) for key in ("peak", "sent", "time", "err")}
    return measured, cfg


def expected_bytes(p: int, cfg: dict, elem: int = 4) -> int:
    """Bytes one rank sends per layer, forward + backward (the formula of the module docstring)."""
    n = cfg["length"] // p
    kv = 2 * n * cfg["b"] * cfg["hkv"] * cfg["d"]
    return (p - 1) * kv * elem * 2 + (p * kv * 4 if p > 1 else 0)


def model_time(p: int, cfg: dict, t_forward: float, t_total: float) -> dict:
    """The modelled time of one layer on ``p`` ranks (see the module docstring)."""
    n = cfg["length"] / p
    frac = (n / cfg["length"]) ** 2
    c_fwd, c_bwd = t_forward * frac, (t_total - t_forward) * frac
    kv_bytes = 2 * n * cfg["b"] * cfg["hkv"] * cfg["d"] * 4
    x_kv = 2 * LATENCY_S + kv_bytes / LINK_BYTES_PER_S
    step_fwd = max(c_fwd, x_kv)
    step_bwd = max(c_bwd, x_kv) + x_kv  # dK, dV (float32, same size here) after the compute
    return {"n": n, "compute": c_fwd + c_bwd, "comm": 2 * x_kv + x_kv, "total": p * (step_fwd + step_bwd)}


def run(quick: bool = False, config: dict | None = None) -> list[Table]:
    """The measured table (P = 1, 2, 4) and the modelled one (P = 8..64); ``config``: see :func:`measure`."""
    header = machine_header()
    measured, cfg = measure(quick, config)
    one = measured["one"]
    b, h, hkv, length, d = cfg["b"], cfg["h"], cfg["hkv"], cfg["length"], cfg["d"]
    title = (f"ring attention (softmax, causal, zigzag), B={b}, H={h}, Hkv={hkv}, L={length}, D={d}, float32, "
             "forward + backward, gloo on CPU")
    table = Table(
        title=title,
        columns=["P", "L per rank", "peak MiB per rank", "memory vs one process", "target <= 1.3/P",
                 "sent MiB per rank per layer", "formula MiB", "time s", "max |out - one process|"],
        claim=("Ring attention (Liu et al. 2023): exact attention over sequence shards with memory per device "
               "proportional to L/P. Target (issue 15): peak memory per rank about 1/P of one process, within "
               "1.3x, at a fixed total L."),
    )
    table.add("1 process (sk.attention)", length, one["peak"] / MIB, 1.0, "-", 0.0, 0.0, one["time"], 0.0)
    verdicts = []
    for p in SIZES:
        m = measured[p]
        ratio = m["peak"] / one["peak"] if one["peak"] else float("nan")
        target = 1.3 / p
        if p > 1:
            verdicts.append(ratio <= target)
        table.add(p, length // p, m["peak"] / MIB, ratio, target, m["sent"] / MIB, expected_bytes(p, cfg) / MIB,
                  m["time"], m["err"])
    held = sum(verdicts)
    table.status = "held" if held == len(verdicts) else ("did not hold" if held == 0 else "partly")
    ratios = ", ".join(f"P={p}: {measured[p]['peak'] / one['peak']:.2f} (target <= {1.3 / p:.2f})"
                       for p in SIZES if p > 1)
    table.verdict = (f"Peak memory per rank relative to one process: {ratios}; {held} of {len(verdicts)} within "
                     f"1.3/P. Largest output difference to one process: "
                     f"{max(measured[p]['err'] for p in SIZES):.1e}.")
    table.notes = (f"{header['cpu']}, 1 torch thread per process, torch {header['torch']}. Memory: rise of VmHWM "
                   "during building the shard inputs + forward + backward, worst rank. Times for P = 4 run 4 "
                   "processes on the machine's cores (contended), so they do not show scaling. Rerun: "
                   "softmaxkit bench distributed" + (" --quick" if quick else "") + ".")

    fit = _fit_memory(measured, one)
    modelled = Table(
        title=f"MODELLED (not measured): ring attention scaling to P = 8..64 ranks at L = {length}",
        columns=["P", "L per rank", "compute per layer s (model)", "comm per step s (model)",
                 "time per layer s (model)", "speed-up vs 1 process (model)", "peak MiB per rank (model)"],
        notes=("Modelled from this run's measurements, not measured: per ring step compute t_c(n) = t_1 (n/L)^2 "
               f"from the one-process forward ({one['forward_time']:.3g} s) and forward + backward "
               f"({one['time']:.3g} s) times; link beta = {LINK_BYTES_PER_S / 1e9:g} GB/s, alpha = "
               f"{LATENCY_S * 1e6:g} us per message; forward step max(t_c, t_x), backward step max(t_c, t_x) + "
               f"t_x (dK, dV); P steps. Memory per rank a/P + c with a = {fit[0] / MIB:.3g} MiB, c = "
               f"{fit[1] / MIB:.3g} MiB fitted to P = 1, 2, 4."),
    )
    for p in MODELLED:
        m = model_time(p, cfg, one["forward_time"], one["time"])
        modelled.add(p, int(m["n"]), m["compute"] * p, m["comm"], m["total"], one["time"] / m["total"],
                     (fit[0] / p + fit[1]) / MIB)
    return [table, modelled]


def _fit_memory(measured: dict, one: dict) -> tuple[float, float]:
    """Least-squares ``a / P + c`` through the measured peaks, with ``c >= 0`` (a rank's fixed
    memory cannot be negative: on tiny inputs the free fit's intercept came out slightly below
    0 and the modelled peak at P = 64 negative); refit through the origin when it would be."""
    xs = [1.0 / p for p in SIZES]
    ys = [float(measured[p]["peak"]) for p in SIZES]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    if my - a * mx >= 0:
        return a, my - a * mx
    squares = sum(x * x for x in xs)
    return (sum(x * y for x, y in zip(xs, ys)) / squares if squares else 0.0), 0.0
