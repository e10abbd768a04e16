"""Bench ``losses``: the output layer against plain torch, as ratios measured in one run.

* ``linear_cross_entropy`` (forward + backward) against ``F.cross_entropy(hidden @
  weight.T, target)``, which holds the ``N x V`` logits, their log-softmax and their
  gradient: peak memory and time.
* ``sample`` (top-k and top-p decoding over a 128k vocabulary) against the usual torch
  pipeline: softmax over the vocabulary, then topk (or sort) and multinomial.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .._table import Table, verdict_of
from ..losses import linear_cross_entropy
from ..losses.linear_cross_entropy import default_chunk_size, default_vocab_block
from ..sampling import _blocked_topk, sample
from ..topk import softmax_topk
from ._measure import machine_header, median_time, peak_memory_bytes

MIB = 2**20


def run(quick: bool = False) -> list[Table]:
    header = machine_header()
    machine = (f"Machine: {header['cpu']}, {header['threads']} torch threads, torch {header['torch']}, "
               f"numba {header['numba']}.")
    return [linear_cross_entropy_table(quick, machine), sampling_table(quick, machine)]


# ----------------------------------------------------------------------------------------
# linear cross-entropy
# ----------------------------------------------------------------------------------------

def _lce_problem(n: int, v: int, d: int):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=g).requires_grad_()
    weight = (torch.randn(v, d, generator=g) / d ** 0.5).requires_grad_()
    target = torch.randint(0, v, (n,), generator=g)
    target[::17] = -100
    return hidden, weight, target


def linear_cross_entropy_table(quick: bool, machine: str) -> Table:
    n, v, d = (1024, 16384, 256) if quick else (4096, 65536, 512)
    repeats = 3 if quick else 5
    hidden, weight, target = _lce_problem(n, v, d)
    inputs = (hidden, weight)
    chunk = default_chunk_size(n, v)
    block = default_vocab_block(chunk, v)

    def plain_torch():
        loss = F.cross_entropy(hidden @ weight.T, target)
        return (loss,) + torch.autograd.grad(loss, inputs)

    def softmaxkit():
        loss = linear_cross_entropy(hidden, weight, target)
        return (loss,) + torch.autograd.grad(loss, inputs)

    def softmaxkit_per_token():
        loss = linear_cross_entropy(hidden, weight, target, reduction="none").sum() / (target != -100).sum()
        return (loss,) + torch.autograd.grad(loss, inputs)

    methods = {
        "plain torch: F.cross_entropy(hidden @ weight.T)": plain_torch,
        "sk.losses.linear_cross_entropy (mean: fused gradients)": softmaxkit,
        "sk.losses.linear_cross_entropy (none: recomputing backward)": softmaxkit_per_token,
    }
    reference = plain_torch()
    table = Table(
        title=f"linear_cross_entropy, N = {n}, V = {v}, D = {d}, float32, forward + backward",
        columns=["method", "ms", "time vs torch", "peak MiB", "memory vs torch", "max |loss - torch|",
                 "max |grad - torch|"],
        claim=("Target (issue 5), N = 4096, V = 65536, D = 512: peak memory at most 1/8 of the plain torch path "
               "and time at most 1.1x, forward + backward."),
    )
    results = {}
    for name, fn in methods.items():
        out = fn()
        loss_err = (out[0] - reference[0]).abs().item()
        grad_err = max((a - b).abs().max().item() for a, b in zip(out[1:], reference[1:]))
        del out
        seconds = median_time(fn, repeats=repeats)
        peak = peak_memory_bytes(fn)
        results[name] = (seconds, peak)
        base_t, base_m = results[next(iter(methods))]
        table.add(name, 1e3 * seconds, seconds / base_t, peak / MIB, peak / max(base_m, 1), loss_err, grad_err)
    base_t, base_m = results[next(iter(methods))]
    fused_t, fused_m = results["sk.losses.linear_cross_entropy (mean: fused gradients)"]
    time_ratio, mem_ratio = fused_t / base_t, fused_m / max(base_m, 1)
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    size = "" if not quick else " (quick mode: a smaller problem than the target's)"
    table.verdict = (f"linear_cross_entropy used {mem_ratio:.3f}x the peak memory of plain torch "
                     f"({fused_m / MIB:.0f} MiB vs {base_m / MIB:.0f} MiB; target <= 0.125: {met(mem_ratio <= 0.125)}) "
                     f"and took {time_ratio:.2f}x its time (target <= 1.1: {met(time_ratio <= 1.1)}){size}.")
    table.status = verdict_of([mem_ratio <= 0.125, time_ratio <= 1.1])
    table.add_headline("linear cross-entropy forward+backward", "plain torch", 1 / time_ratio, f"N={n}, V={v}, D={d}")
    table.notes = (f"Medians of {repeats} runs after one warm-up; gradients for hidden and weight; 1 token in 17 "
                   "ignored (ignore_index=-100). Peak = extra resident memory during one forward + backward "
                   "(bench._measure.peak_memory_bytes), inputs excluded, gradients included. "
                   "Default chunking (losses.linear_cross_entropy.default_chunk_size / default_vocab_block): "
                   f"{chunk} tokens per chunk, vocabulary blocks of {block}. " + machine)
    return table


# ----------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------

def torch_top_k_sample(logits: torch.Tensor, k: int, generator) -> torch.Tensor:
    """The usual torch pipeline: softmax over the vocabulary, topk, multinomial."""
    probs = torch.softmax(logits, dim=-1)
    values, indices = probs.topk(k, dim=-1)
    drawn = torch.multinomial(values, 1, generator=generator)
    return indices.gather(-1, drawn).squeeze(-1)


def torch_top_p_sample(logits: torch.Tensor, p: float, generator) -> torch.Tensor:
    """The usual torch nucleus sampling: softmax, sort, cumulative sum, mask, multinomial."""
    probs = torch.softmax(logits, dim=-1)
    values, indices = probs.sort(dim=-1, descending=True)
    before = values.cumsum(-1) - values
    values = values.masked_fill(before >= p, 0.0)
    drawn = torch.multinomial(values, 1, generator=generator)
    return indices.gather(-1, drawn).squeeze(-1)


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def sampling_table(quick: bool, machine: str) -> Table:
    batch, vocab = 64, 128256
    repeats = 7 if quick else 15
    g = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(batch, vocab, generator=g)
    table = Table(
        title=f"sample over V = {vocab}, batch {batch}, float32",
        columns=["setting", "torch ms", "sk.sampling.sample ms", "speed-up (x)"],
        claim="Target (issue 5): sample(top_k=50) over V = 128256, batch 64, at least 5x faster than "
              "torch softmax + topk + multinomial.",
    )
    cases = [
        ("top_k=50", lambda: torch_top_k_sample(logits, 50, g), lambda: sample(logits, top_k=50, generator=g)),
        ("top_k=50, temperature=0.7", lambda: torch_top_k_sample(logits / 0.7, 50, g),
         lambda: sample(logits, top_k=50, temperature=0.7, generator=g)),
        ("top_p=0.9", lambda: torch_top_p_sample(logits, 0.9, g), lambda: sample(logits, top_p=0.9, generator=g)),
        ("selection only, k=50: torch.topk vs fused softmax_topk kernel", lambda: logits.topk(50),
         lambda: softmax_topk(logits, 50)),
        ("selection only, k=50: torch.topk vs block-maximum top-k (what sample uses)", lambda: logits.topk(50),
         lambda: _blocked_topk(logits, 50)),
    ]
    threads = torch.get_num_threads()
    speedups = {}
    for name, base, ours in cases + [(f"top_k=50, 1 thread (others: {threads})",) + cases[0][1:]]:
        with _threads(1 if "1 thread" in name else threads):
            t_base = median_time(base, repeats=repeats)
            t_ours = median_time(ours, repeats=repeats)
        speedups[name] = t_base / t_ours
        table.add(name, 1e3 * t_base, 1e3 * t_ours, t_base / t_ours)
    s, single = speedups["top_k=50"], speedups[f"top_k=50, 1 thread (others: {threads})"]
    table.verdict = (f"sample(top_k=50) was {s:.1f}x faster than torch softmax + topk + multinomial with "
                     f"{threads} threads, {single:.1f}x with 1 (target >= 5x: {'met' if s >= 5 else 'not met'}).")
    table.status = "held" if s >= 5 else "partly" if s > 1 else "did not hold"
    table.add_headline("sample(top_k=50)", "torch softmax + topk + multinomial", s, f"batch {batch}, V={vocab}")
    table.notes = (f"Medians of {repeats} runs after one warm-up. top_k selects the 50 largest logits by block "
                   "maxima (no softmax over the vocabulary); top_p takes full-row probabilities of a growing "
                   "candidate set from the fused softmax_topk kernel. Both draw by inverse CDF. " + machine)
    return table
