"""Worker processes for the multi-process tests (gloo on 127.0.0.1, spawned by torch.multiprocessing).

Every rank builds the same full problem from a seed, runs the distributed function on its
shard and compares with the single-process result it computes itself; the errors go back
to the test through a JSON file per rank. Several checks share one spawn (spawning and
importing torch is the slow part).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import traceback

import torch
import torch.distributed as dist

import softmaxkit as sk
from softmaxkit.distributed import (
    context_parallel_attention,
    shard_sequence,
    ulysses_attention,
    unshard_sequence,
    vocab_parallel_linear_cross_entropy,
)

#: init_process_group's timeout for the checks (generous: the machine may be busy) and the
#: short one of the group used to test that a failing rank does not hang the others.
GROUP_TIMEOUT_S = 120
FAILURE_TIMEOUT_S = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problem(seed, b, h, hkv, length, d, dtype):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, length, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, hkv, length, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, hkv, length, d, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(b, h, length, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, w


def _shard(x, rank, size, layout, lengths):
    if layout == "contiguous" and lengths is not None:
        return shard_sequence(x, rank, size, layout=layout, lengths=lengths)
    return shard_sequence(x, rank, size, layout=layout)


def attention_check(case: dict) -> dict:
    """Max |distributed - single process| of the output and of every gradient."""
    rank, size = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, case.get("dtype", "float64"))
    b, h, hkv, length, d = case.get("shape", (2, 4, 2, 16, 8))
    layout, lengths = case.get("layout", "zigzag"), case.get("lengths")
    q, k, v, w = _problem(case.get("seed", 0), b, h, hkv, length, d, dtype)
    params = dict(case.get("params", {}))
    learn = case.get("learn")  # a per-head tensor parameter: (name, initial value)
    mask = None
    if case.get("padding"):  # padded keys, a (B, 1, 1, L) mask
        g = torch.Generator().manual_seed(7)
        mask = torch.rand(b, 1, 1, length, generator=g) > 0.25
        mask[..., 0] = True
    if case.get("additive"):
        g = torch.Generator().manual_seed(8)
        mask = torch.randn(b, 1, length, length, generator=g, dtype=torch.float64).to(dtype)
        mask[..., 3] = float("-inf")
    name = case["normalizer"]
    fn = ulysses_attention if case.get("ulysses") else context_parallel_attention

    def leaves():
        out = [t.clone().requires_grad_() for t in (q, k, v)]
        if learn:
            out.append(torch.full((1, h, 1, 1), learn[1], dtype=dtype).requires_grad_())
        return out

    ref_in = leaves()
    ref_params = {**params, **({learn[0]: ref_in[3]} if learn else {})}
    ref = sk.attention(*ref_in[:3], name, is_causal=case.get("causal", False), attn_mask=mask, **ref_params)
    (ref * w).sum().backward()

    full = leaves()
    shards = [_shard(t.detach(), rank, size, layout, lengths).requires_grad_() for t in full[:3]]
    dist_params = {**params, **({learn[0]: full[3]} if learn else {})}
    local_mask = None if mask is None else (mask if mask.shape[-2] == 1 else _shard(mask, rank, size, layout, lengths))
    if "block_size" in case:  # small tiles: several regions per travelling block
        dist_params["block_size"] = tuple(case["block_size"])
    out = fn(*shards, name, is_causal=case.get("causal", False), attn_mask=local_mask, layout=layout, **dist_params)
    (out * _shard(w, rank, size, layout, lengths)).sum().backward()
    errors = {}
    pairs = [("out", out, ref)] + [(f"d{n}", s.grad, r.grad) for n, s, r in zip("qkv", shards, ref_in)]
    for label, got, want in pairs:
        errors[label] = (got.double() - _shard(want, rank, size, layout, lengths).double()).abs().max().item()
    if learn:
        errors["dparam"] = (full[3].grad.double() - ref_in[3].grad.double()).abs().max().item()
    return errors


def cross_entropy_check(case: dict) -> dict:
    rank = dist.get_rank()
    dtype = getattr(torch, case.get("dtype", "float64"))
    n, d, shards = case.get("n", 40), case.get("d", 8), case["shards"]
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(sum(shards), d, generator=g, dtype=torch.float64).to(dtype)
    target = torch.randint(0, sum(shards), (n,), generator=g)
    target[torch.rand(n, generator=g) < 0.2] = -100  # 20% ignored tokens
    kw = {k: case[k] for k in ("label_smoothing", "z_penalty", "reduction") if k in case}
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = sk.losses.linear_cross_entropy(h_ref, w_ref, target, **kw)
    gw = torch.randn(ref.shape, generator=g, dtype=torch.float64).to(dtype)
    (ref * gw).sum().backward()
    start = sum(shards[:rank])
    h_loc = hidden.clone().requires_grad_()
    w_loc = weight[start:start + shards[rank]].clone().requires_grad_()
    loss = vocab_parallel_linear_cross_entropy(h_loc, w_loc, target, vocab_block=case.get("vocab_block"), **kw)
    (loss * gw).sum().backward()
    return {"loss": (loss - ref).abs().max().item(), "dhidden": (h_loc.grad - h_ref.grad).abs().max().item(),
            "dweight": (w_loc.grad - w_ref.grad[start:start + shards[rank]]).abs().max().item()}


def error_check(case: dict) -> dict:
    """The message of the error the call raises on this rank (``None`` when none)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    q, k, v, _ = _problem(0, 1, 2, 2, 12, 4, torch.float64)
    try:
        if case["kind"] == "unequal_zigzag":  # rank 0 holds one token more than the others
            n = 4 + (rank == 0)
            context_parallel_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], "softmax", layout="zigzag")
        elif case["kind"] == "not_distributable":
            context_parallel_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], "sparse_softmax", k=2)
        elif case["kind"] == "too_few_heads":
            ulysses_attention(q[:, :1, :4], k[:, :1, :4], v[:, :1, :4], "softmax")
        elif case["kind"] == "one_rank_fails":
            group = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=FAILURE_TIMEOUT_S))
            if rank == size - 1:
                raise ValueError("this rank fails before the ring starts")
            context_parallel_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], "softmax", group=group,
                                       layout="contiguous")
    except Exception as err:  # noqa: BLE001 - the test reads the type and message
        return {"type": type(err).__name__, "message": str(err)}
    return {"type": None, "message": None}


def llama_check(case: dict) -> dict:
    """A tiny Llama context-parallel through softmaxkit_cp_<name> against one process."""
    from softmaxkit.distributed.demo import llama_agreement

    logits, grads = llama_agreement(case["normalizer"], case.get("length", 16), torch.device("cpu"), torch.float64,
                                    layout=case.get("layout", "zigzag"))
    return {"logits": logits, "grads": grads}


CHECKS = {"llama": llama_check, "attention": attention_check, "cross_entropy": cross_entropy_check, "error": error_check}


def worker(rank: int, size: int, port: int, out_dir: str, cases: list) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    results = []
    for case in cases:
        try:
            results.append(CHECKS[case["check"]](case))
        except Exception:  # noqa: BLE001 - reported to the test, which fails with the traceback
            results.append({"crash": traceback.format_exc()})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    # a timed-out group cannot be torn down cleanly: leave without waiting for the others
    os._exit(0)


def spawn(size: int, cases: list, out_dir: str) -> list[list[dict]]:
    """Run ``cases`` on ``size`` gloo processes; per rank, the result of each case."""
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(size, free_port(), out_dir, cases), nprocs=size, join=True)
    out = []
    for rank in range(size):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            out.append(json.load(f))
    return out


def unshard(shards, layout):  # used by the fake-ring tests
    return unshard_sequence(shards, layout=layout)
