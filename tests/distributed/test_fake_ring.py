"""In-process "fake ring": the ranks are threads talking through ThreadComm, no processes.

The same code as the multi-process run (the ring, Ulysses' all-to-alls, the all-reduces),
fast enough to cover every normalizer of the registry, read from its spec.
"""

import math
import threading

import pytest
import torch

import softmaxkit as sk
from softmaxkit.attention.rules import rule_for
from softmaxkit.distributed import (
    ThreadComm,
    context_parallel_attention,
    shard_sequence,
    ulysses_attention,
    unshard_sequence,
    vocab_parallel_linear_cross_entropy,
)

from ..conftest import params_for


def run_ranks(size, fn, timeout=30.0):
    """``fn(comm)`` on ``size`` threads; the per-rank results, or the first rank's exception."""
    comms = ThreadComm.group(size, timeout=timeout)
    results, errors = [None] * size, [None] * size

    def target(rank):
        try:
            results[rank] = fn(comms[rank])
        except BaseException as err:  # noqa: BLE001 - handed to the test
            errors[rank] = err

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _problem(b=2, h=4, hkv=2, length=13, d=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, n, length, d, generator=g, dtype=torch.float64).to(dtype) for n in (h, hkv, hkv, h)]


def compare(name, size, *, layout="contiguous", lengths=None, causal=False, mask=None, fn=None, params=None,
            dtype=torch.float64, block_size=(3, 4), scale_q=1.0, **shape):
    """Max errors (out, dq, dk, dv) of the distributed run against ``sk.attention`` on one process."""
    params = params or {}
    q, k, v, w = _problem(dtype=dtype, **shape)
    q = q * scale_q
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = sk.attention(*ref_in, name, is_causal=causal, attn_mask=mask, method="dense", **params)
    (ref.double() * w.double()).sum().backward()

    def shard(x, r):
        return shard_sequence(x, r, size, layout=layout, lengths=lengths)

    def rank_fn(comm):
        r = comm.rank
        local = [shard(t, r).clone().requires_grad_() for t in (q, k, v)]
        local_mask = None if mask is None else (mask if mask.shape[-2] == 1 else shard(mask, r))
        if fn is ulysses_attention:
            out = ulysses_attention(*local, name, group=comm, is_causal=causal, attn_mask=local_mask, layout=layout,
                                    **params)
        else:
            out = context_parallel_attention(*local, name, group=comm, is_causal=causal, attn_mask=local_mask,
                                             layout=layout, block_size=block_size, **params)
        (out.double() * shard(w, r).double()).sum().backward()
        return [out.detach()] + [t.grad for t in local]

    results, errors = run_ranks(size, rank_fn)
    for err in errors:
        if err is not None:
            raise err
    wants = [ref.detach()] + [t.grad for t in ref_in]
    return [(unshard_sequence([res[i] for res in results], layout=layout).double() - want.double()).abs().max().item()
            for i, want in enumerate(wants)]


def _padding(length, b=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, 1, 1, length, generator=g) > 0.3
    mask[..., 0] = True
    return mask


def _specs():
    return [spec for spec in sk.normalizers()]


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_every_normalizer_on_a_fake_ring(spec):
    """Every normalizer: the ring where it streams (threshold family via Ulysses), else a clear
    error from the ring and Ulysses matching one process."""
    params = params_for(spec.name, 13)
    rule = rule_for(spec.name, {**spec.params, **params})
    lengths = [3, 6, 4]
    if rule is None:
        with pytest.raises(ValueError, match="ulysses_attention"):
            compare(spec.name, 3, lengths=lengths, params=params)
        errs = compare(spec.name, 2, causal=True, mask=_padding(13), fn=ulysses_attention, params=params)
        assert max(errs) < 1e-10, errs
        return
    for kwargs in ({"size": 3, "lengths": lengths, "causal": True, "mask": _padding(13)},
                   {"size": 2, "layout": "zigzag", "length": 12, "causal": True},
                   {"size": 2, "layout": "zigzag", "length": 12, "mask": _padding(12)}):
        size = kwargs.pop("size")
        errs = compare(spec.name, size, params=params, **kwargs)
        assert max(errs) < 1e-10, (kwargs, errs)


def test_additive_mask_gqa_and_one_kv_head():
    g = torch.Generator().manual_seed(3)
    mask = torch.randn(2, 1, 12, 12, generator=g, dtype=torch.float64)
    mask[:, :, :, 5] = float("-inf")
    for name in ("softmax", "softpick", "clipped_softmax", "sparsemax"):  # sparsemax: Ulysses, rows reordered
        assert max(compare(name, 2, layout="zigzag", length=12, mask=mask, hkv=1)) < 1e-10
    per_head = torch.randn(2, 4, 12, 12, generator=g, dtype=torch.float64)  # a mask per head: split with them
    assert max(compare("entmax15", 3, layout="zigzag", length=12, mask=per_head, causal=True)) < 1e-10


def test_learnable_per_head_parameter_gradient_is_summed_over_ranks():
    q, k, v, w = _problem(length=12)
    s_ref = torch.full((1, 4, 1, 1), 0.6, dtype=torch.float64, requires_grad=True)
    ref = sk.attention(q, k, v, "ssmax", is_causal=True, s=s_ref, method="dense")
    (ref * w).sum().backward()

    def rank_fn(comm):
        s = torch.full((1, 4, 1, 1), 0.6, dtype=torch.float64, requires_grad=True)
        sh = [shard_sequence(t, comm.rank, 2) for t in (q, k, v, w)]
        for fn in (context_parallel_attention, ulysses_attention):
            out = fn(*sh[:3], "ssmax", group=comm, is_causal=True, s=s, layout="zigzag")
            (out * sh[3]).sum().backward()
        return s.grad

    results, errors = run_ranks(2, rank_fn)
    assert errors == [None, None]
    for grad in results:  # two calls: twice the gradient, on every rank
        assert torch.allclose(grad, 2 * s_ref.grad, atol=1e-10, rtol=0)


def test_hostile_scores_and_rows_with_no_visible_key():
    for name in ("softmax", "softpick", "sa_softmax"):
        errs = compare(name, 2, layout="zigzag", length=12, causal=True, scale_q=1e4 ** 0.5)
        assert max(errs) < 1e-8 * 1e4, (name, errs)
    fills = torch.zeros(1, 1, 12, 12, dtype=torch.float64)
    fills[..., 3, :] = torch.finfo(torch.float64).min   # a padded query row (Hugging Face's fill)
    fills[..., 5, 4:] = torch.finfo(torch.float64).min
    errs = compare("sa_softmax", 2, layout="zigzag", length=12, mask=fills, params={"normalized": True})
    assert max(errs) < 1e-10, errs
    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool)
    mask[:, :, 2] = False  # query 2 sees nothing
    q, k, v, _ = _problem(length=12)

    def rank_fn(comm):
        sh = [shard_sequence(t, comm.rank, 2).clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*sh, "softpick", group=comm, attn_mask=shard_sequence(mask, comm.rank, 2))
        out.sum().backward()
        return out.detach(), [t.grad for t in sh]

    results, errors = run_ranks(2, rank_fn)
    assert errors == [None, None]
    out = unshard_sequence([r[0] for r in results])
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert all(torch.isfinite(g).all() for r in results for g in r[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computes_in_float32(dtype):
    q, k, v, _ = _problem(length=12, dtype=dtype)
    ref = sk.attention(q.float(), k.float(), v.float(), "softmax", is_causal=True)

    def rank_fn(comm):
        sh = [shard_sequence(t, comm.rank, 2) for t in (q, k, v)]
        return context_parallel_attention(*sh, "softmax", group=comm, is_causal=True)

    results, errors = run_ranks(2, rank_fn)
    assert errors == [None, None]
    assert all(r.dtype == dtype for r in results)
    assert (unshard_sequence(results).float() - ref).abs().max() < 2e-2


def _vocab_parallel_matches_one_process(hidden, weight, target, shards, **kwargs):
    """``vocab_parallel_linear_cross_entropy`` on ``len(shards)`` thread ranks, the output layer's
    rows split by ``shards``, against ``linear_cross_entropy`` in one process: the loss and the
    hidden gradient on every rank, the weight gradient gathered. Returns the ranks' results."""
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = sk.losses.linear_cross_entropy(h_ref, w_ref, target, label_smoothing=0.1, z_penalty=1e-2)
    ref.backward()

    def rank_fn(comm):
        a = sum(shards[:comm.rank])
        h = hidden.clone().requires_grad_()
        w = weight[a:a + shards[comm.rank]].clone().requires_grad_()
        loss = vocab_parallel_linear_cross_entropy(h, w, target, group=comm, label_smoothing=0.1, z_penalty=1e-2,
                                                   **kwargs)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    results, errors = run_ranks(len(shards), rank_fn, timeout=20.0)
    assert errors == [None] * len(shards), errors
    for loss, gh, _ in results:
        assert abs(loss - ref).item() < 1e-12 and (gh - h_ref.grad).abs().max() < 1e-12
    assert (torch.cat([r[2] for r in results]) - w_ref.grad).abs().max() < 1e-12
    return results


def test_vocab_parallel_cross_entropy_on_threads():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(30, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(23, 6, generator=g, dtype=torch.float64)
    target = torch.randint(0, 23, (30,), generator=g)
    target[torch.rand(30, generator=g) < 0.2] = -100
    _vocab_parallel_matches_one_process(hidden, weight, target, [4, 12, 7], vocab_block=5, chunk_size=7)


def test_vocab_parallel_cross_entropy_refuses_a_double_backward():
    """create_graph=True: a clear error, not a gradient without a graph (a second derivative
    of 0)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(10, 4, generator=g, dtype=torch.float64)
    target = torch.randint(0, 10, (6,), generator=g)

    def rank_fn(comm):
        h = hidden.clone().requires_grad_()
        w = weight[5 * comm.rank:5 * comm.rank + 5].clone().requires_grad_()
        loss = vocab_parallel_linear_cross_entropy(h, w, target, group=comm)
        torch.autograd.grad(loss, h, create_graph=True)

    _, errors = run_ranks(2, rank_fn)
    assert all(isinstance(e, RuntimeError) and "first derivatives only" in str(e) for e in errors), errors


def test_a_failing_rank_does_not_hang_the_others():
    q, k, v, _ = _problem(length=12)

    def rank_fn(comm):
        if comm.rank == 1:
            raise KeyError("rank 1 fails before the ring")
        sh = [shard_sequence(t, comm.rank, 2) for t in (q, k, v)]
        return context_parallel_attention(*sh, "softmax", group=comm)

    _, errors = run_ranks(2, rank_fn, timeout=1.0)
    assert isinstance(errors[1], KeyError)
    assert isinstance(errors[0], RuntimeError) and "timed out" in str(errors[0])


def test_bad_inputs():
    q, k, v, _ = _problem(length=8)
    with pytest.raises(ValueError, match="init_process_group"):
        context_parallel_attention(q, k, v, "softmax")
    with pytest.raises(ValueError, match="init_process_group"):
        ulysses_attention(q, k, v, "softmax")
    with pytest.raises(ValueError, match="init_process_group"):
        vocab_parallel_linear_cross_entropy(q[0, 0], q[0, 0], torch.zeros(8, dtype=torch.long))
    comm = ThreadComm.group(1)[0]
    with pytest.raises(ValueError, match="layout"):
        context_parallel_attention(q, k, v, "softmax", group=comm, layout="ring")
    with pytest.raises(ValueError, match="attn_mask"):
        context_parallel_attention(q, k, v, "softmax", group=comm, attn_mask=torch.ones(8, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="shape"):
        context_parallel_attention(q[0], k[0], v[0], "softmax", group=comm)
    with pytest.raises(ValueError, match="per-head"):
        context_parallel_attention(q, k, v, "ssmax", group=comm, s=torch.ones(2, 4, 8, 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="unexpected parameter"):
        context_parallel_attention(q, k, v, "softmax", group=comm, alpha=2.0)
    with pytest.raises(ValueError, match="zigzag"):
        context_parallel_attention(q[:, :, :7], k[:, :, :7], v[:, :, :7], "softmax", group=comm, layout="zigzag")
    with pytest.raises(ValueError, match="zigzag"):
        shard_sequence(q, 0, 3, layout="zigzag")


def test_shard_roundtrip():
    x = torch.arange(24.0).view(1, 1, 24, 1)
    for layout in ("contiguous", "zigzag"):
        for size in (1, 2, 3):
            assert torch.equal(unshard_sequence([shard_sequence(x, r, size, layout=layout) for r in range(size)],
                                                layout=layout), x)
    assert shard_sequence(x, 1, 2, layout="zigzag")[0, 0, :, 0].tolist() == list(range(6, 12)) + list(range(12, 18))


def test_head_split_uneven_and_repeated_kv_heads():
    from softmaxkit.distributed.ulysses import head_split

    assert head_split(8, 4, 3) == ([4, 2, 2], [2, 1, 1], 1)  # GQA groups stay together
    assert head_split(4, 2, 3) == ([2, 1, 1], [2, 1, 1], 2)  # fewer kv heads than ranks: repeated
    assert head_split(3, 3, 2) == ([2, 1], [2, 1], 1)
    with pytest.raises(ValueError, match="heads"):
        head_split(2, 2, 3)


def test_ring_keeps_one_block_and_one_region_of_keys_in_flight(monkeypatch):
    """K/V travel region by region through a pool of m + 1 region buffers (m regions per
    block), reused from step to step: a rank never holds more than 1 + 1/m blocks of them."""
    from softmaxkit.distributed import ring as ring_module

    made: list = []
    take = ring_module._Pool.take

    def counting_take(self):
        if not self.free:
            self.made = getattr(self, "made", 0) + 1
            made.append(self.made)
        return take(self)

    monkeypatch.setattr(ring_module._Pool, "take", counting_take)
    # 4 ranks, 32 keys each in two zigzag halves of 16, block_k = 4: 2 regions of 8 per half, m = 4
    errs = compare("softmax", 4, layout="zigzag", length=128, causal=True, block_size=(8, 4), b=1)
    assert max(errs) < 1e-10, errs
    assert made and max(made) == 4 + 1, max(made)


@pytest.mark.parametrize("name, params", [("softmax", {}), ("softpick", {}), ("sigmoid", {}),
                                          ("sa_softmax", {"normalized": True}), ("adaptive_softmax", {})])
def test_backward_from_the_kept_output_or_the_sums(name, params):
    """One value sum: the backward recovers it from the output (out = a S); two (normalized
    SA-softmax) or a half-precision output: the sums are kept. Gradients are exact either way."""
    for kwargs in ({"size": 3, "lengths": [5, 2, 6], "causal": True, "mask": _padding(13)},
                   {"size": 2, "layout": "zigzag", "length": 12, "causal": True}):
        size = kwargs.pop("size")
        errs = compare(name, size, params=params, **kwargs)
        assert max(errs) < 1e-10, (name, kwargs, errs)


def test_half_precision_backward_keeps_the_sums():
    q, k, v, w = _problem(length=12, dtype=torch.float16)
    ref_in = [t.float().requires_grad_() for t in (q, k, v)]
    (sk.attention(*ref_in, "softmax", is_causal=True) * w.float()).sum().backward()

    def rank_fn(comm):
        sh = [shard_sequence(t, comm.rank, 2).clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*sh, "softmax", group=comm, is_causal=True)
        (out.float() * shard_sequence(w, comm.rank, 2).float()).sum().backward()
        return [t.grad for t in sh]

    results, errors = run_ranks(2, rank_fn)
    assert errors == [None, None]
    for i, want in enumerate(t.grad for t in ref_in):
        got = unshard_sequence([r[i] for r in results])
        assert got.dtype == torch.float16
        assert (got.float() - want).abs().max() < 3e-2


def test_changing_the_output_in_place_before_backward_is_an_error():
    """The backward reads the output it returned (as torch's own ops that keep their output):
    changing it in place first raises autograd's error instead of giving a wrong gradient."""
    q, k, v, _ = _problem(length=12)

    def rank_fn(comm):
        sh = [shard_sequence(t, comm.rank, 2).clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*sh, "softmax", group=comm, is_causal=True)
        out.mul_(2.0)
        out.sum().backward()

    results, errors = run_ranks(2, rank_fn)
    assert all(isinstance(err, RuntimeError) and "inplace" in str(err) for err in errors), errors


@pytest.mark.parametrize("lengths", [[3, 3, 2], [2, 2, 3], [3, 2, 2]])
def test_shards_some_equal_some_not(lengths):
    """Audit 2026-12-02: each rank chose by itself whether to send the travelling dk / dv in
    pieces (its block against the one it received), so a sender and its receiver disagreed
    when some neighbouring shards were equal and others not, and the backward aborted."""
    n = sum(lengths)
    errs = compare("softmax", 3, lengths=lengths, causal=True, length=n)
    assert max(errs) < 1e-10, errs


def test_softpick_backward_with_hidden_scores_far_above_the_visible_ones():
    """Hidden scores stayed raw unless an additive mask was given: a causal future key or a padded
    key far above the visible ones overflowed e^{x-c} and made dq, dk NaN."""
    mask = _padding(12)
    errs = compare("softpick", 2, length=12, causal=True, mask=mask, scale_q=60.0, dtype=torch.float32)
    assert all(math.isfinite(e) for e in errs) and max(errs) < 1e-3, errs


@pytest.mark.parametrize("name", ["clipped_softmax", "adaptive_softmax"])
def test_two_pass_rule_when_one_rank_sees_no_key(name):
    """Causal with Lq > Lk: rank 0's queries all come before every key. It skipped a backward ring
    that the others entered (its dk was wrong, the others waited until the timeout)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(2))
    params = params_for(name, 6)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = sk.attention(*ref_in, name, is_causal=True, method="dense", **params)
    ref.sum().backward()

    def rank_fn(comm):
        r = comm.rank
        local = [shard_sequence(t, r, 2, layout="contiguous").clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*local, name, group=comm, is_causal=True, block_size=(3, 4),
                                         layout="contiguous", **params)
        out.sum().backward()
        return [out.detach()] + [t.grad for t in local]

    results, errors = run_ranks(2, rank_fn, timeout=20.0)
    assert errors == [None, None], errors
    for i, want in enumerate([ref.detach()] + [t.grad for t in ref_in]):
        got = unshard_sequence([res[i] for res in results], layout="contiguous")
        assert (got - want).abs().max() < 1e-10, i


@pytest.mark.parametrize("fn", [context_parallel_attention, ulysses_attention])
@pytest.mark.parametrize("what", ["head dim", "dtype", "is_causal", "normalizer"])
def test_ranks_that_disagree_get_a_clear_error(fn, what):
    """Audit 2026-12-02: a rank with another head dim or dtype aborted gloo (SIGABRT); another
    is_causal ran silently; another normalizer waited until the timeout."""
    def rank_fn(comm):
        r = comm.rank
        d = 8 if (what == "head dim" and r == 1) else 4
        dtype = torch.float32 if (what == "dtype" and r == 1) else torch.float64
        q, k, v = (torch.randn(1, 2, 3, d, dtype=dtype) for _ in range(3))
        name = "ssmax" if (what == "normalizer" and r == 1) else "softmax"
        causal = what == "is_causal" and r == 1
        return fn(q, k, v, name, group=comm, is_causal=causal, layout="contiguous")

    _, errors = run_ranks(2, rank_fn, timeout=20.0)
    for err in errors:
        assert isinstance(err, ValueError) and what in str(err), err


def test_ulysses_double_backward_equals_one_process():
    """Hostile sweep 2026-12-04: the all-to-alls' backward was the raw exchange (no graph), so a
    backward with create_graph=True silently dropped every second-order term through it (a
    Hessian-vector product 4.3 off of 6.3)."""
    q, k, v, w = _problem(length=8)
    b0 = torch.full((1, 4, 1, 1), -0.5, dtype=torch.float64)

    def second(qq, kk, vv, b, out, ww):
        gq, _ = torch.autograd.grad((out * ww).sum(), (qq, b), create_graph=True)
        return torch.autograd.grad((gq ** 2).sum() + (qq ** 2).sum(), (qq, kk, vv, b))

    ref_in = [t.clone().requires_grad_() for t in (q, k, v, b0)]
    ref = sk.attention(*ref_in[:3], "sigmoid", is_causal=True, method="dense", bias_offset=ref_in[3])
    want = second(*ref_in, ref, w)

    def rank_fn(comm):
        local = [shard_sequence(t, comm.rank, 2).clone().requires_grad_() for t in (q, k, v)]
        b = b0.clone().requires_grad_()
        out = ulysses_attention(*local, "sigmoid", group=comm, is_causal=True, layout="zigzag", bias_offset=b)
        return second(*local, b, out, shard_sequence(w, comm.rank, 2))

    results, errors = run_ranks(2, rank_fn)
    assert errors == [None, None], errors
    for i in range(3):
        assert (unshard_sequence([r[i] for r in results]) - want[i]).abs().max() < 1e-10, i
    assert all((r[3] - want[3]).abs().max() < 1e-10 for r in results)


def test_ring_double_backward_is_a_clear_error():
    """Hostile sweep 2026-12-04: create_graph=True raised "a leaf Variable that requires grad is
    being used in an in-place operation" from inside the ring's backward."""
    q, k, v, _ = _problem(length=8)

    def rank_fn(comm):
        local = shard_sequence(q, comm.rank, 2).clone().requires_grad_()
        out = context_parallel_attention(local, shard_sequence(k, comm.rank, 2), shard_sequence(v, comm.rank, 2),
                                         "softpick", group=comm, is_causal=True)
        torch.autograd.grad(out.sum(), local, create_graph=True)

    _, errors = run_ranks(2, rank_fn)
    assert all(isinstance(e, RuntimeError) and "first derivatives only" in str(e) for e in errors), errors


@pytest.mark.parametrize("name", ["softpick", "adaptive_softmax", "clipped_softmax", "relu_l1"])
def test_ring_with_a_plus_inf_in_the_mask_equals_one_process(name):
    """Hostile sweep 2026-12-04: a +inf in a float mask (that key takes its row's whole weight,
    which softmaxkit.attention computes on its dense path) gave NaN rows and NaN dk, dv on the
    ring; such masks go to Ulysses now. Only rank 0's rows hold the +inf: every rank follows."""
    mask = torch.zeros(1, 1, 8, 8, dtype=torch.float64)
    mask[..., 0, 5] = float("inf")   # rows 0, 1: rank 0's (zigzag)
    mask[..., 1, 3] = mask[..., 1, 6] = float("inf")
    errs = compare(name, 2, layout="zigzag", length=8, b=1, h=2, hkv=2, mask=mask, params=params_for(name, 8))
    assert max(errs) < 1e-10, errs


@pytest.mark.parametrize("fn", [context_parallel_attention, ulysses_attention])
def test_a_learned_bias_gets_its_gradient(fn):
    """Hostile sweep 2026-12-04: a float attn_mask that requires grad got no gradient (the ring
    and Ulysses' exchange took it as a constant): with nothing else to differentiate, backward
    raised "element 0 of tensors does not require grad"."""
    q, k, v, w = _problem(length=8, b=1, h=2, hkv=1)
    bias = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    ref = sk.attention(*ref_in[:3], "softpick", attn_mask=ref_in[3], method="dense")
    (ref * w).sum().backward()

    def rank_fn(comm):
        local = [shard_sequence(t, comm.rank, 2).clone().requires_grad_() for t in (q, k, v, bias)]
        out = fn(*local[:3], "softpick", group=comm, attn_mask=local[3], layout="zigzag")
        (out * shard_sequence(w, comm.rank, 2)).sum().backward()
        return [out.detach()] + [t.grad for t in local]

    results, errors = run_ranks(2, rank_fn)
    assert errors == [None, None], errors
    for i, want in enumerate([ref.detach()] + [t.grad for t in ref_in]):
        assert (unshard_sequence([r[i] for r in results]) - want).abs().max() < 1e-10, i


def test_scale_and_block_size_errors_name_them():
    """Hostile sweep 2026-12-04: block_size=4.0 raised "'float' object is not iterable", and a NaN
    scale a TypeError (softmaxkit.attention: ValueError)."""
    q, k, v, _ = _problem(length=8)
    comm = ThreadComm.group(1)[0]
    for fn in (context_parallel_attention, ulysses_attention):
        with pytest.raises(ValueError, match="scale must be finite"):
            fn(q, k, v, "softmax", group=comm, scale=float("nan"))
        with pytest.raises(TypeError, match="scale must be a number"):
            fn(q, k, v, "softmax", group=comm, scale="0.5")
    with pytest.raises(TypeError, match="block_size"):
        context_parallel_attention(q, k, v, "softmax", group=comm, block_size=4.0)
    with pytest.raises(ValueError, match="block_size"):
        context_parallel_attention(q, k, v, "softmax", group=comm, block_size=(4, 0))


def test_shard_sequence_checks_its_arguments():
    """Hostile sweep 2026-12-04: a float rank raised "list indices must be integers", True passed
    as rank 1, negative lengths summing to the total reached narrow()'s RuntimeError, float
    lengths its TypeError, a dim out of range an IndexError."""
    x = torch.arange(12.0).view(1, 1, 12, 1)
    for kwargs, err, match in [({"rank": 0.5}, TypeError, "rank"), ({"rank": True}, TypeError, "rank"),
                               ({"world_size": 0}, ValueError, "world_size"), ({"dim": 5}, ValueError, "dim=5"),
                               ({"lengths": [-2, 14], "layout": "contiguous"}, ValueError, "lengths"),
                               ({"lengths": [6.0, 6.0], "layout": "contiguous"}, TypeError, "lengths")]:
        args = {"rank": 0, "world_size": 2, **kwargs}
        with pytest.raises(err, match=match):
            shard_sequence(x, args.pop("rank"), args.pop("world_size"), **args)
    with pytest.raises(ValueError, match="got none"):
        unshard_sequence([])
    assert torch.equal(unshard_sequence([shard_sequence(x, r, 2, dim=-2) for r in range(2)], dim=-2), x)


@pytest.mark.parametrize("what", ["number of tokens", "dtype", "reduction", "label_smoothing",
                                  "whether hidden requires grad"])
def test_vocab_parallel_ranks_that_disagree_get_a_clear_error(what):
    """Hostile sweep 2026-12-04: a rank with another token count or dtype aborted gloo (SIGABRT);
    another reduction or label smoothing gave each rank its own loss, and a mixed gradient."""
    def rank_fn(comm):
        r = comm.rank
        n = 5 + r if what == "number of tokens" else 5
        dtype = torch.float32 if (what == "dtype" and r == 1) else torch.float64
        hidden = torch.randn(n, 4, dtype=dtype, requires_grad=what == "whether hidden requires grad" and r == 0)
        weight = torch.randn(3, 4, dtype=dtype)
        kwargs = {"reduction": "sum" if (what == "reduction" and r == 1) else "mean",
                  "label_smoothing": 0.1 if (what == "label_smoothing" and r == 1) else 0.0}
        return vocab_parallel_linear_cross_entropy(hidden, weight, torch.randint(0, 6, (n,)), group=comm, **kwargs)

    _, errors = run_ranks(2, rank_fn, timeout=20.0)
    for err in errors:
        assert isinstance(err, ValueError) and what in str(err), err


@pytest.mark.parametrize("what", ["block_size", "parameters", "scale", "which inputs require grad"])
def test_ranks_that_disagree_on_tiles_parameters_or_gradients_get_a_clear_error(what):
    """Hostile sweep 2026-12-04: ranks with other tile sizes cut their travelling blocks into
    other regions (a size mismatch: gloo aborts); a per-head tensor parameter on one rank and a
    number on another hung the ring's backward until the timeout (Ulysses: an IndexError); a
    rank whose inputs needed no gradient skipped the backward ring that the others waited in;
    another scale silently gave each rank another attention."""
    q, k, v, _ = _problem(length=16, b=1)

    def rank_fn(comm):
        r = comm.rank
        sh = [shard_sequence(t, r, 2).clone().requires_grad_(what != "which inputs require grad" or r == 0)
              for t in (q, k, v)]
        s = torch.full((1, 4, 1, 1), 0.5, dtype=torch.float64, requires_grad=True)
        kwargs = {"s": s if (what != "parameters" or r == 0) else 0.5,
                  "scale": 0.3 if (what == "scale" and r == 1) else None,
                  "block_size": (4, 4 if (what != "block_size" or r == 0) else 8)}
        out = context_parallel_attention(*sh, "ssmax", group=comm, is_causal=True, **kwargs)
        out.sum().backward()

    _, errors = run_ranks(2, rank_fn, timeout=20.0)
    for err in errors:
        assert isinstance(err, ValueError) and what in str(err), err


@pytest.mark.parametrize("fn", [context_parallel_attention, ulysses_attention])
@pytest.mark.parametrize("name", ["softmax", "adaptive_softmax", "softpick", "sparsemax"])
def test_a_rank_may_hold_no_query_or_no_key(fn, name):
    """Hostile sweep 2026-12-04: an empty local shard (one decoding query, on the last rank; more
    ranks than tokens) raised ValueError on that rank alone, and the others waited in the first
    exchange until the timeout. Empty shards are computed like any other."""
    g = torch.Generator().manual_seed(0)
    for lq, lk in (([0, 1, 2], [5, 4, 0]), ([0, 0, 3], [5, 0, 2]), ([0, 0, 0], [1, 2, 3]), ([1, 2, 3], [0, 0, 0])):
        q = torch.randn(1, 3, sum(lq), 4, generator=g, dtype=torch.float64)
        k = torch.randn(1, 3, sum(lk), 4, generator=g, dtype=torch.float64)
        v = torch.randn(1, 3, sum(lk), 3, generator=g, dtype=torch.float64)
        ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = sk.attention(*ref_in, name, is_causal=True, method="dense")
        ref.sum().backward()

        def rank_fn(comm, lq=lq, lk=lk, q=q, k=k, v=v):
            local = [shard_sequence(t, comm.rank, 3, layout="contiguous", lengths=n).clone().requires_grad_()
                     for t, n in ((q, lq), (k, lk), (v, lk))]
            out = fn(*local, name, group=comm, is_causal=True, layout="contiguous")
            out.sum().backward()
            return [out.detach()] + [t.grad for t in local]

        results, errors = run_ranks(3, rank_fn, timeout=20.0)
        assert errors == [None] * 3, (lq, lk, errors)
        for i, want in enumerate([ref.detach()] + [t.grad for t in ref_in]):
            got = unshard_sequence([r[i] for r in results], layout="contiguous")
            assert got.shape == want.shape and (got.numel() == 0 or (got - want).abs().max() < 1e-10), (lq, lk, i)


def test_vocab_parallel_cross_entropy_with_an_empty_shard():
    """Hostile sweep 2026-12-04: a rank holding no row of the output layer raised ValueError on
    that rank alone (the others waited in the first all-gather until the timeout)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64)
    target = torch.randint(0, 9, (7,), generator=g)
    results = _vocab_parallel_matches_one_process(hidden, weight, target, [4, 0, 5])
    assert results[1][2].shape == (0, 4)

    def empty_everywhere(comm):
        return vocab_parallel_linear_cross_entropy(hidden, weight[:0], target, group=comm)

    _, errors = run_ranks(2, empty_everywhere, timeout=20.0)
    assert all(isinstance(e, ValueError) and "no row" in str(e) for e in errors), errors


def test_thread_comm_group_checks_its_arguments():
    """Hostile sweep 2026-12-04: ThreadComm.group(0) returned no rank, group(1.5) raised "can't
    multiply sequence by non-int", and a negative timeout was taken."""
    with pytest.raises(ValueError, match="size"):
        ThreadComm.group(0)
    with pytest.raises(TypeError, match="size"):
        ThreadComm.group(1.5)
    with pytest.raises(ValueError, match="timeout"):
        ThreadComm.group(2, timeout=-1.0)
