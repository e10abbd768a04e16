"""Kernel benchmark: the numba kernels against torch, the ``entmax`` package and a plain copy.

Every figure is a ratio of medians (at least 5 runs) measured in the same process:
``speedup`` = baseline time / kernel time, ``x copy`` = time / time of copying the same
tensor (the memory-bandwidth bound). Run ``python -m softmaxkit.bench.kernels`` (add
``--quick`` for small shapes) or ``softmaxkit bench kernels``.

Targets from issue 3 (float32, all threads): softmax forward at 4096 x 32768 within 2x
the copy time (4x faster than ``torch.softmax``); softmax backward and log_softmax
forward 3x faster than torch; fused softmax + top-50 at 1024 x 128256 8x faster than
``torch.softmax(x).topk(50)``; sparsemax and entmax15 forward+backward at
1024 x 32768 20x faster than ``entmax``; entmax(alpha=1.3) 20x faster than
``entmax_bisect``; two-pass against three-pass on out-of-cache rows (Dukhan &
Ablavatski 2020 report 18% with AVX2).
"""

from __future__ import annotations

import functools
import gc
import time

import numpy as np
import torch

from .._table import Table
from ..kernels import dispatch
from ..kernels.cpu import functions, sparse_functions
from ..kernels.cpu import topk as topk_kernel
from ._measure import copy_time, machine_header, median_time

FULL = {
    "softmax": [(4096, 32768), (65536, 1024), (32, 4194304)],
    "log_softmax": [(4096, 32768)],
    "topk": [(1024, 128256)],
    "sparse": [(1024, 32768)],
}
QUICK = {
    "softmax": [(256, 32768), (8192, 1024), (4, 1048576)],
    "log_softmax": [(256, 32768)],
    "topk": [(64, 128256)],
    "sparse": [(64, 8192)],
}
REPEATS = 5
TOPK = 50


def _header_note() -> str:
    h = machine_header()
    return (f"{h['cpu']}, {h['threads']} threads, torch {h['torch']}, numba {h['numba']}. "
            "Ratios of medians over >= 5 runs measured in this run; speedup = baseline / kernel, "
            "x copy = time / copy of the same tensor.")


def _warm_up_kernels() -> float:
    """Compile (or load from the on-disk cache) every kernel benchmarked; returns seconds."""
    start = time.perf_counter()
    for dtype in (torch.float32,):
        x = torch.randn(2, 64, dtype=dtype, requires_grad=True)
        for algorithm in ("three_pass", "two_pass", "online"):
            functions.softmax(x, algorithm=algorithm)[0].sum().backward()
        functions.log_softmax(x)[0].sum().backward()
        topk_kernel.softmax_topk(x.detach(), 3)
        sparse_functions.entmax(x, 1.5)[0].sum().backward()
    return time.perf_counter() - start


def _fwd_bwd(f, x, g):
    def run():
        x.grad = None
        y = f(x)
        y.backward(g)
    return run


def softmax_table(shapes) -> Table:
    table = Table("softmax forward, float32", [
        "shape", "torch ms", "kernel ms", "copy ms", "speedup vs torch", "kernel x copy", "torch x copy",
        "three-pass x copy", "two-pass x copy", "online x copy", "three-pass / two-pass"])
    for shape in shapes:
        x = torch.randn(*shape)
        t_copy = copy_time(x, REPEATS)
        t_torch = median_time(functools.partial(torch.softmax, x, -1), REPEATS)
        algo = {a: median_time(functools.partial(functions.softmax, x, algorithm=a), REPEATS)
                for a in ("three_pass", "two_pass", "online")}
        t_kernel = algo[functions.default_algorithm(shape[-1])]
        table.add("x".join(map(str, shape)), t_torch * 1e3, t_kernel * 1e3, t_copy * 1e3, t_torch / t_kernel,
                  t_kernel / t_copy, t_torch / t_copy, algo["three_pass"] / t_copy, algo["two_pass"] / t_copy,
                  algo["online"] / t_copy, algo["three_pass"] / algo["two_pass"])
        del x
        gc.collect()
    table.add_headline("softmax forward", "torch.softmax", table.rows[0][1] / table.rows[0][2], table.rows[0][0])
    table.notes = (f"kernel = default algorithm ({functions.DEFAULT_ALGORITHM}; three_pass for rows of at most "
                   f"{functions._k.BLOCK} entries). Targets: kernel x copy <= 2 and "
                   "speedup >= 4 at 4096x32768; three-pass / two-pass > 1 means two-pass is faster "
                   "(Dukhan & Ablavatski 2020: 1.18 with AVX2 on out-of-cache rows). " + _header_note())
    return table


def log_softmax_and_backward_table(shapes) -> Table:
    table = Table("softmax backward, log_softmax forward, logsumexp, float32", [
        "shape", "op", "torch ms", "kernel ms", "speedup vs torch", "kernel x copy"])
    for shape in shapes:
        x = torch.randn(*shape)
        t_copy = copy_time(x, REPEATS)
        t_torch = median_time(functools.partial(torch.log_softmax, x, -1), REPEATS)
        t_kernel = median_time(functools.partial(functions.log_softmax, x), REPEATS)
        table.add("x".join(map(str, shape)), "log_softmax forward", t_torch * 1e3, t_kernel * 1e3,
                  t_torch / t_kernel, t_kernel / t_copy)
        t_torch = median_time(functools.partial(torch.logsumexp, x, -1), REPEATS)
        t_kernel = median_time(functools.partial(functions.logsumexp, x), REPEATS)
        table.add("x".join(map(str, shape)), "logsumexp forward", t_torch * 1e3, t_kernel * 1e3,
                  t_torch / t_kernel, t_kernel / t_copy)
        xg = x.clone().requires_grad_()
        g = torch.randn_like(x)
        y_torch = torch.softmax(xg, -1)
        y_kernel = functions.softmax(xg)[0]
        t_torch = median_time(
            functools.partial(torch.autograd.grad, y_torch, xg, g, retain_graph=True), REPEATS)
        t_kernel = median_time(
            functools.partial(torch.autograd.grad, y_kernel, xg, g, retain_graph=True), REPEATS)
        table.add("x".join(map(str, shape)), "softmax backward", t_torch * 1e3, t_kernel * 1e3,
                  t_torch / t_kernel, t_kernel / t_copy)
        del x, xg, g, y_torch, y_kernel
        gc.collect()
    for row in table.rows[:3]:
        table.add_headline(row[1], "torch", row[2] / row[3], row[0])
    table.notes = "Target: speedup >= 3 for softmax backward and log_softmax forward. " + _header_note()
    return table


def preallocated_table(shapes) -> Table:
    """Kernel against aten kernel, both writing into preallocated outputs.

    Allocating a fresh output (as ``torch.softmax`` and the public functions do) costs
    page faults that, on a loaded or memory-managed VM, can exceed the computation;
    this table times the computation alone, on both sides.
    """
    from ..kernels.cpu import softmax as k
    from ..kernels.cpu import sync_threads
    table = Table("softmax kernels into preallocated outputs, float32", [
        "shape", "op", "aten ms", "kernel ms", "speedup vs torch", "kernel x copy"])
    sync_threads()
    aten = torch.ops.aten
    for shape in shapes:
        x = torch.randn(*shape)
        y = torch.softmax(x, -1)
        g = torch.randn_like(x)
        out = torch.empty_like(x)
        lse = np.empty(shape[0], np.float32)
        special = np.zeros(shape[0], np.uint8)
        xn, yn, gn, on = x.numpy(), y.numpy(), g.numpy(), out.numpy()
        one = np.float32(1.0)
        t_copy = copy_time(x, REPEATS)
        label = "x".join(map(str, shape))
        for algorithm in ("three_pass", "two_pass", "online"):
            code = k.ALGORITHMS[algorithm]
            t_torch = median_time(functools.partial(aten._softmax.out, x, -1, False, out=out), REPEATS)
            t_kernel = median_time(
                functools.partial(k.normalize_rows, xn, on, lse, special, one, code, k.PROBS), REPEATS)
            table.add(label, f"softmax forward ({algorithm})", t_torch * 1e3, t_kernel * 1e3, t_torch / t_kernel,
                      t_kernel / t_copy)
        t_torch = median_time(functools.partial(aten._log_softmax.out, x, -1, False, out=out), REPEATS)
        t_kernel = median_time(
            functools.partial(k.normalize_rows, xn, on, lse, special, one, k.ONLINE, k.LOG_PROBS), REPEATS)
        table.add(label, "log_softmax forward", t_torch * 1e3, t_kernel * 1e3, t_torch / t_kernel, t_kernel / t_copy)
        t_torch = median_time(
            functools.partial(aten._softmax_backward_data.out, g, y, -1, torch.float32, grad_input=out), REPEATS)
        t_kernel = median_time(
            functools.partial(k.backward_rows, yn, gn, on, special, one, k.PROBS), REPEATS)
        table.add(label, "softmax backward", t_torch * 1e3, t_kernel * 1e3, t_torch / t_kernel, t_kernel / t_copy)
        del x, y, g, out
        gc.collect()
    table.notes = ("Both sides write into preallocated tensors (aten ``_softmax.out``, ``_log_softmax.out``, "
                   "``_softmax_backward_data.out`` against the numba kernels), so no page faults are timed. "
                   + _header_note())
    return table


def _softmax_then_topk(x: torch.Tensor):
    return torch.softmax(x, -1).topk(TOPK, dim=-1)


def topk_table(shapes) -> Table:
    table = Table(f"fused softmax + top-{TOPK}, float32", [
        "shape", "torch softmax+topk ms", "fused ms", "speedup vs torch", "fused x copy"])
    for shape in shapes:
        x = torch.randn(*shape)
        t_copy = copy_time(x, REPEATS)
        t_torch = median_time(functools.partial(_softmax_then_topk, x), REPEATS)
        t_kernel = median_time(functools.partial(topk_kernel.softmax_topk, x, TOPK), REPEATS)
        table.add("x".join(map(str, shape)), t_torch * 1e3, t_kernel * 1e3, t_torch / t_kernel, t_kernel / t_copy)
        del x
        gc.collect()
    table.claim = "Milakov & Gimelshein 2018: fused Softmax+TopK up to 5x faster than unfused (GPU)."
    best = max(row[3] for row in table.rows)
    table.status = "held" if best >= 5 else "partly" if best > 1 else "did not hold"
    table.verdict = (f"the fused kernel was {best:.2f}x faster than torch.softmax(x).topk({TOPK}) at best, on this "
                     "CPU (the paper measured GPUs); 'up to 5x' holds when a case reaches 5x, partly when the "
                     "fused kernel is faster but less.")
    table.add_headline(f"softmax + top-{TOPK}", "torch.softmax(x).topk", table.rows[0][3], table.rows[0][0])
    table.notes = "Target (issue 3): speedup >= 8 at 1024x128256, k = 50. " + _header_note()
    return table


def sparse_table(shapes) -> Table:
    table = Table("sparsemax / entmax forward+backward, float32", [
        "shape", "op", "peer", "peer ms", "kernel ms", "speedup vs peer"])
    try:
        import entmax as peer
    except ImportError:
        table.skipped = "the entmax package is not installed (pip install entmax)"
        return table
    cases = [
        ("sparsemax", "entmax.sparsemax", lambda t: peer.sparsemax(t, -1),
         lambda t: sparse_functions.entmax(t, 2.0)[0]),
        ("entmax15", "entmax.entmax15", lambda t: peer.entmax15(t, -1), lambda t: sparse_functions.entmax(t, 1.5)[0]),
        ("entmax alpha=1.3", "entmax.entmax_bisect",
         lambda t: peer.entmax_bisect(t, alpha=1.3, dim=-1), lambda t: sparse_functions.entmax(t, 1.3)[0]),
    ]
    for shape in shapes:
        x = (torch.randn(*shape) * 2).requires_grad_()
        g = torch.randn(*shape)
        for name, peer_name, peer_fn, kernel_fn in cases:
            t_peer = median_time(_fwd_bwd(peer_fn, x, g), REPEATS, warmup=0)
            t_kernel = median_time(_fwd_bwd(kernel_fn, x, g), REPEATS)
            table.add("x".join(map(str, shape)), name, peer_name, t_peer * 1e3, t_kernel * 1e3, t_peer / t_kernel)
        del x, g
        gc.collect()
    for row in table.rows[:len(cases)]:
        table.add_headline(f"{row[1]} forward+backward", row[2], row[5], row[0])
    table.notes = ("Target (issue 3): speedup >= 20 for each, forward + backward, at 1024x32768 (scores "
                   "randn * 2). " + _header_note())
    return table


TWO_PASS_CLAIM = ("Dukhan & Ablavatski 2020 (arXiv 2001.04438): the Two-Pass softmax (mantissa, exponent) is up to "
                  "28% (AVX512) / 18% (AVX2) faster than the Three-Pass algorithm on out-of-cache inputs.")
ONLINE_CLAIM = ("Milakov & Gimelshein 2018 (arXiv 1805.02867): the online normalizer makes softmax up to 1.3x "
                "faster than the safe (three-pass) softmax.")


def algorithm_tables(softmax: Table) -> list[Table]:
    """The two published claims about softmax algorithms, judged on the softmax table's timings
    (three-pass, two-pass, online kernels, each over the copy time of the same tensor)."""
    from ._measure import machine_header

    columns = softmax.columns
    three, two, online = (columns.index(f"{a} x copy") for a in ("three-pass", "two-pass", "online"))
    simd = machine_header()["simd"]
    two_pass = Table("two-pass vs three-pass softmax (numba kernels, inputs larger than the cache)",
                     ["shape", "MiB", "three-pass / two-pass"], claim=TWO_PASS_CLAIM)
    online_t = Table("online vs three-pass softmax (numba kernels)", ["shape", "MiB", "three-pass / online"],
                     claim=ONLINE_CLAIM)
    for row in softmax.rows:
        mib = np.prod([int(d) for d in row[0].split("x")]) * 4 / 2**20
        two_pass.add(row[0], float(mib), row[three] / row[two])
        online_t.add(row[0], float(mib), row[three] / row[online])
    target = {"avx512f": 1.28, "avx2": 1.18}.get(simd)
    best = max(r[2] for r in two_pass.rows)
    if target is None:
        two_pass.status = "not testable"
        two_pass.verdict = f"this CPU has no AVX2 (SIMD level: {simd}); best ratio measured {best:.2f}."
    else:
        two_pass.status = "held" if best >= target else "partly" if best > 1 else "did not hold"
        two_pass.verdict = (f"three-pass time / two-pass time is {best:.2f} at best (claim for {simd}: "
                            f"{target:.2f}); above 1 the two-pass kernel is faster.")
    best = max(r[2] for r in online_t.rows)
    online_t.status = "held" if best >= 1.3 else "partly" if best > 1 else "did not hold"
    online_t.verdict = (f"three-pass time / online time is {best:.2f} at best (claim: up to 1.3; the paper "
                        "measured GPUs); above 1 the online kernel is faster.")
    note = ("Ratios of the timings in the 'softmax forward, float32' table (same run, same inputs); "
            f"SIMD level of this CPU: {simd}. " + _header_note())
    two_pass.notes = online_t.notes = note
    return [two_pass, online_t]


def exp_accuracy_table() -> Table:
    from ..kernels.cpu._exp import exp_array
    table = Table("exp accuracy: max relative error against a higher-precision reference",
                  ["dtype", "kernel exp", "torch.exp", "kernel / torch"])
    rng = np.random.default_rng(0)
    for dtype, low, high in ((np.float32, -87.3, 88.7), (np.float64, -708.0, 709.0)):
        x = np.concatenate([np.linspace(low, high, 1_000_001), rng.uniform(-30, 0, 500_000)]).astype(dtype)
        ours = np.empty_like(x)
        exp_array(x, ours, False)
        theirs = torch.exp(torch.from_numpy(x)).numpy()
        ref = np.exp(x.astype(np.longdouble))
        normal = ref > np.finfo(dtype).tiny
        e_ours = float(np.max(np.abs(ours[normal] / ref[normal] - 1)))
        e_torch = float(np.max(np.abs(theirs[normal] / ref[normal] - 1)))
        table.add(np.dtype(dtype).name, e_ours, e_torch, e_ours / e_torch)
    table.notes = ("Inputs: a linspace over the normal range and uniform samples of the softmax range; "
                   "reference np.longdouble (x87 80-bit).")
    return table


def run(quick: bool = False) -> list[Table]:
    """Benchmark tables of the numba kernels (quick: smaller shapes, well under a minute)."""
    shapes = QUICK if quick else FULL
    compile_s = _warm_up_kernels()
    with dispatch.use_backend("numba"):
        tables = [
            softmax_table(shapes["softmax"]),
            log_softmax_and_backward_table(shapes["log_softmax"]),
            preallocated_table(shapes["log_softmax"]),
            topk_table(shapes["topk"]),
            sparse_table(shapes["sparse"]),
            exp_accuracy_table(),
        ]
    tables[0].notes = (tables[0].notes or "") + f" Kernel compile or cache load before timing: {compile_s:.1f} s."
    return tables[:1] + algorithm_tables(tables[0]) + tables[1:]


def main(argv: list[str] | None = None) -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, fewer seconds")
    args = parser.parse_args(argv)
    for table in run(quick=args.quick):
        print(table.to_markdown())
        print()


if __name__ == "__main__":
    main()
