"""``torchrun --nproc-per-node 2 -m softmaxkit.distributed.demo``: distributed vs one process.

Every rank builds the same full problem from a seed, runs the distributed function on its
shard and the single-process function on the whole problem, and the largest differences
(over all ranks) and the median times are printed by rank 0:

1. ring attention (:func:`context_parallel_attention`, zigzag layout, causal) for a few
   normalizers, forward + backward; the threshold family goes through Ulysses;
2. Ulysses attention with sparse_softmax;
3. vocabulary-parallel linear cross-entropy (uneven shards, 20% ignored tokens);
4. a tiny Llama (``transformers``, built from a ``LlamaConfig``, nothing downloaded) run
   context-parallel through ``softmaxkit_cp_<name>`` attention: logits and parameter
   gradients against the same model on one process.

Uses NCCL when every rank has a GPU (torchrun's ``LOCAL_RANK`` picks it), gloo otherwise.
Without torchrun it runs as a single process (world size 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import softmaxkit as sk

from . import (
    context_parallel_attention,
    shard_sequence,
    ulysses_attention,
    vocab_parallel_linear_cross_entropy,
)

NORMALIZERS = ("softmax", "softpick", "ssmax", "adaptive_softmax", "sparsemax")


def _init() -> tuple[torch.device, bool]:
    """Initialise the default group from torchrun's environment (or a group of one)."""
    created = False
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": os.environ.get("MASTER_PORT", "29511")})
        use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > int(os.environ.get("LOCAL_RANK", "0"))
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if use_cuda else "gloo")
        created = True
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return device, created


def _timed(fn, repeats: int) -> tuple[object, float]:
    """The result and the median time of ``fn()`` over ``repeats`` runs after one warm-up run
    (gloo connects and allocates on first use)."""
    fn()
    times, result = [], None
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def _max_over_ranks(x: float, device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _say(*args) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


def attention_rows(args, device, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    b, h, hkv, length, d = 1, args.heads, max(args.heads // 2, 1), args.length, args.dim
    q, k, v, w = (torch.randn(b, n, length, d, generator=g, dtype=dtype).to(device) for n in (h, hkv, hkv, h))
    cases = [(n, "ring (zigzag)") for n in args.normalizers] + [("sparse_softmax", "ulysses")]
    _say(f"\n1-2. attention, B={b}, H={h}, Hkv={hkv}, L={length} (L/P={length // size} per rank), D={d}, {dtype}, "
         f"causal, forward + backward; errors are max over ranks of |distributed - one process|")
    _say(f"{'normalizer':<18}{'path':<15}{'out err':>10}{'grad err':>10}{'dist ms':>10}{'1-proc ms':>11}")
    from ..attention.rules import rule_for

    for name, path in cases:
        params = sk.registry.get(name).params_for_length({}, 8)  # parameters without a default (sparse_softmax's k)
        if path.startswith("ring") and hasattr(rule_for(name, {**sk.registry.get(name).params, **params}) or 0,
                                               "search"):
            path = "ring->ulysses"  # the threshold family is delegated
        layout = "zigzag" if path.startswith("ring") else "contiguous"

        def one_process(name=name, params=params):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = sk.attention(*leaves, name, is_causal=True, **params)
            (out * w).sum().backward()
            return out.detach(), [t.grad for t in leaves]

        def distributed(name=name, params=params, layout=layout, path=path):
            leaves = [shard_sequence(t, rank, size, layout=layout).clone().requires_grad_() for t in (q, k, v)]
            fn = context_parallel_attention if path.startswith("ring") else ulysses_attention
            out = fn(*leaves, name, is_causal=True, layout=layout, **params)
            (out * shard_sequence(w, rank, size, layout=layout)).sum().backward()
            return out.detach(), [t.grad for t in leaves]

        (ref, ref_grads), t_one = _timed(one_process, args.repeats)
        (out, grads), t_dist = _timed(distributed, args.repeats)
        err = (out - shard_sequence(ref, rank, size, layout=layout)).abs().max().item()
        gerr = max((gr - shard_sequence(rg, rank, size, layout=layout)).abs().max().item()
                   for gr, rg in zip(grads, ref_grads))
        err, gerr = _max_over_ranks(err, device), _max_over_ranks(gerr, device)
        t_dist = _max_over_ranks(t_dist, device)
        _say(f"{name:<18}{path:<15}{err:>10.2e}{gerr:>10.2e}{t_dist * 1e3:>10.1f}{t_one * 1e3:>11.1f}")


def cross_entropy_rows(args, device, dtype):
    rank, size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    n, d, vocab = args.tokens, args.dim, args.vocab
    hidden = torch.randn(n, d, generator=g, dtype=dtype).to(device)
    weight = (torch.randn(vocab, d, generator=g, dtype=dtype) / d ** 0.5).to(device)
    target = torch.randint(0, vocab, (n,), generator=g)
    target[torch.rand(n, generator=g) < 0.2] = -100
    target = target.to(device)
    cuts = [round(vocab * (i + 0.5 * (i > 0)) / (size + 0.5)) for i in range(size)] + [vocab]  # uneven shards
    lo, hi = cuts[rank], cuts[rank + 1]

    def one_process():
        hh, ww = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = sk.losses.linear_cross_entropy(hh, ww, target, label_smoothing=0.1)
        loss.backward()
        return loss.detach(), hh.grad, ww.grad

    def distributed():
        hh, ww = hidden.clone().requires_grad_(), weight[lo:hi].clone().requires_grad_()
        loss = vocab_parallel_linear_cross_entropy(hh, ww, target, label_smoothing=0.1)
        loss.backward()
        return loss.detach(), hh.grad, ww.grad

    (ref, rh, rw), t_one = _timed(one_process, args.repeats)
    (loss, gh, gw), t_dist = _timed(distributed, args.repeats)
    err = max(abs(loss - ref).item(), (gh - rh).abs().max().item(), (gw - rw[lo:hi]).abs().max().item())
    err, t_dist = _max_over_ranks(err, device), _max_over_ranks(t_dist, device)
    _say(f"\n3. vocab-parallel linear cross-entropy, N={n}, V={vocab} in {size} uneven shards "
         f"({[cuts[i + 1] - cuts[i] for i in range(size)]}), D={d}, 20% ignored, label smoothing 0.1")
    _say(f"   max |loss, grad - one process| = {err:.2e}; {t_dist * 1e3:.1f} ms distributed, "
         f"{t_one * 1e3:.1f} ms one process")


def llama_agreement(name: str, length: int, device, dtype, layout: str = "zigzag") -> tuple[float, float]:
    """A tiny Llama (built from a ``LlamaConfig``, nothing downloaded) run context-parallel with
    ``softmaxkit_cp_<name>`` against the same model on one process (``softmaxkit_<name>``):
    the largest differences of this rank's logits and of the parameter gradients (all-reduced)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from . import hf as cp_hf

    rank, size = dist.get_rank(), dist.get_world_size()
    sk.hf.register()
    cp_hf.register(layout=layout)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    # transformers' decorated Module.to confuses mypy (it asks for ``self``): a stub problem
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)  # type: ignore[call-arg]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 128, (2, length), generator=g).to(device)
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)  # the next token, global
    positions = torch.arange(length, device=device).expand(2, -1)
    count = int((labels != -100).sum())

    def loss_of(logits, lab):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=-100,
                                                 reduction="sum") / count

    model.set_attn_implementation(sk.hf.implementation_name(name))
    model.zero_grad()
    ref_logits = model(input_ids=ids, position_ids=positions).logits
    loss_of(ref_logits, labels).backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]

    model.set_attn_implementation(cp_hf.PREFIX + name)
    model.zero_grad()

    def shard(x):
        return shard_sequence(x, rank, size, layout=layout, dim=1)

    logits = model(input_ids=shard(ids), position_ids=shard(positions)).logits
    loss_of(logits, shard(labels)).backward()
    worst = 0.0
    for p, rg in zip(model.parameters(), ref_grads):
        dist.all_reduce(p.grad)  # the total loss is the sum of the ranks' losses
        worst = max(worst, (p.grad - rg).abs().max().item())
    return (logits - shard(ref_logits)).abs().max().item(), worst


def llama_rows(args, device, dtype):
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - transformers is a dev dependency
        _say(f"\n4. tiny Llama: skipped ({exc})")
        return
    from .hf import PREFIX

    name = args.llama_normalizer
    err, worst = llama_agreement(name, args.llama_length, device, dtype)
    err, worst = _max_over_ranks(err, device), _max_over_ranks(worst, device)
    _say(f"\n4. tiny Llama (2 layers, 4 heads / 2 kv heads, L={args.llama_length}, zigzag over "
         f"{dist.get_world_size()} ranks), attn_implementation='{PREFIX}{name}' vs "
         f"'{sk.hf.implementation_name(name)}' on one process:")
    _say(f"   max |logits diff| = {err:.2e}, max |parameter grad diff| = {worst:.2e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m softmaxkit.distributed.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=1024, help="total sequence length (a multiple of 2P)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--normalizers", type=lambda s: s.split(","), default=list(NORMALIZERS))
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llama-normalizer", default="softpick")
    parser.add_argument("--llama-length", type=int, default=64)
    parser.add_argument("--no-llama", action="store_true")
    args = parser.parse_args(argv)
    device, created = _init()
    dtype = getattr(torch, args.dtype)
    _say(f"softmaxkit.distributed demo: {dist.get_world_size()} process(es), backend {dist.get_backend()}, "
         f"device {device}, {torch.get_num_threads()} torch threads per process")
    attention_rows(args, device, dtype)
    cross_entropy_rows(args, device, dtype)
    if not args.no_llama:
        llama_rows(args, device, dtype)
    if created:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
