r"""Streaming attention: any :class:`~.rules.StreamRule`, in tiles, never the ``Lq x Lk`` matrix.

Queries are taken ``block_q`` rows at a time and keys ``block_k`` columns at a time. For
each row block, every pass of the rule runs over the visible key tiles, keeping per query
only the running shift (maximum), the sums of the rule's terms and, where the rule needs
them, the running minimum and the number of keys that tie with the maximum. Extra memory
is ``O(block_q * block_k)`` for a tile plus ``O(Lq * D)`` for the sums.

The backward pass recomputes the tiles (as FlashAttention does, Dao et al. 2022,
arXiv 2205.14135) and differentiates the rule on each tile with autograd: first the
output with respect to the last pass's sums and the statistics, then each pass in
reverse, feeding the gradients of earlier statistics back to the sums they came from.
A maximum that the output uses as a value (softpick's ``eps e^{m-c}``, the range of
normalized SA-softmax) sends its gradient to the keys attaining it, split evenly between
ties as ``torch.amax`` does.

First derivatives only: a backward that must build a graph of the gradient
(``create_graph=True``, double backward) raises ``RuntimeError`` naming
``method='dense'``, whose gradients are ordinary autograd graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .inputs import AttentionInputs, Tile
from .rules import StreamRule

DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 512

def double_backward_error(path: str) -> str:
    """The error a first-derivative-only path raises when a graph of its gradient is requested."""
    return (f"double backward is not supported by the {path} path; use method='dense' "
            "(the gradient was requested with create_graph=True, e.g. for a gradient "
            "penalty or a Hessian-vector product)")


DOUBLE_BACKWARD_ERROR = double_backward_error("streaming")


@dataclass
class Plan:
    rule: StreamRule
    inp: AttentionInputs
    fixed: dict
    tensor_names: list[str]
    block_q: int = DEFAULT_BLOCK_Q
    block_k: int = DEFAULT_BLOCK_K


def _finite_or_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _scores(qs: torch.Tensor, k: torch.Tensor, t: Tile) -> torch.Tensor:
    """``(q * scale) k^T (+ additive mask)`` on a tile, every invisible entry replaced by 0.

    Rules evaluate their pieces on the whole tile and zero the invisible entries afterwards;
    a hidden raw score (causal or bool mask) can be large enough for a piece to overflow
    there (softpick's ``e^{x - c}`` past the visible maximum ``c``), and ``inf * 0`` in the
    backward of that zeroing would make the gradient NaN."""
    x = torch.matmul(qs, k[:, :, t.c0:t.c1].transpose(-1, -2))
    if t.additive is not None:
        x = x + t.additive
        assert t.visible is not None  # an additive mask's tile carries its visibility
    if t.visible is not None:
        x = torch.where(t.visible, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x


class _Extremes:
    """Running maximum (or minimum) of ``z`` over visible keys and how many keys attain it."""

    def __init__(self, like: torch.Tensor, largest: bool):
        self.sign = 1.0 if largest else -1.0
        self.value = torch.full_like(like, float("-inf"))
        self.ties = torch.zeros_like(like)

    def update(self, z: torch.Tensor, visible, count_ties: bool) -> torch.Tensor:
        signed = z * self.sign if self.sign < 0 else z
        if visible is not None:
            signed = signed.masked_fill(~visible, float("-inf"))
        block = signed.amax(-1, keepdim=True)
        new = torch.maximum(self.value, block)
        if count_ties:
            hits = (signed == block).sum(-1, keepdim=True).to(z.dtype)
            hits = torch.where(block > float("-inf"), hits, torch.zeros_like(hits))
            self.ties = torch.where(block > self.value, hits,
                                    torch.where(block == self.value, self.ties + hits, self.ties))
        self.value = new
        return new

    def final(self) -> torch.Tensor:
        return _finite_or_zero(self.value) * self.sign


def _row_state(plan: Plan, r0: int, r1: int, params: dict) -> dict:
    st: dict = {"params": params}
    if plan.rule.needs_count:
        st["n"] = plan.inp.visible_count(r0, r1, plan.block_k)
    return st


def _accumulate(sums: dict, terms: dict, values: frozenset, vb: torch.Tensor) -> None:
    for name, term in terms.items():
        part = torch.matmul(term, vb) if name in values else term.sum(-1, keepdim=True)
        if name in sums:
            sums[name] = sums[name] + part
        else:
            sums[name] = part


def _reduce(rule, qs, k, tiles, st, fn, how: str) -> torch.Tensor:
    """``fn(z, visible)`` over the key tiles, reduced by ``how`` (``"max"`` over keys, or
    ``"sum"`` of what ``fn`` already summed per tile): the search passes of a rule."""
    total = None
    for t in tiles:
        z = rule.z(0, _scores(qs, k, t), st)
        part = fn(z, t.visible)
        if how == "max":
            part = part.amax(-1, keepdim=True)
            total = part if total is None else torch.maximum(total, part)
        else:
            total = part if total is None else total + part
    assert total is not None  # called with at least one tile
    return total


def _forward_rows(plan: Plan, q, k, v, r0: int, r1: int, params: dict):
    """Output rows ``r0:r1`` and what their backward needs (None when they see no key)."""
    rule, inp = plan.rule, plan.inp
    tiles = list(inp.tiles(r0, r1, plan.block_k))
    if not tiles:
        return None, None
    qs = q[:, :, r0:r1] * inp.scale
    st = _row_state(plan, r0, r1, params)
    last = rule.passes - 1
    if hasattr(rule, "search"):
        st.update(rule.search(lambda fn, how: _reduce(rule, qs, k, tiles, st, fn, how), st))
    all_sums = []
    for p in range(rule.passes):
        sums: dict = {}
        top = bottom = None
        column = qs.new_empty(qs.shape[:-1] + (1,))  # one value per query row (also when D = 0)
        if rule.shifted[p]:
            top = _Extremes(column, largest=True)
        if p == last and rule.min_grad:
            bottom = _Extremes(column, largest=False)
        count_ties = p == last
        score_at_max = column.new_zeros(column.shape) if top is not None and rule.keeps_score_at_max(st) else None
        for t in tiles:
            x = _scores(qs, k, t)
            z = rule.z(p, x, st)
            if score_at_max is not None and top is not None:   # (score_at_max implies top)
                zd = z if t.visible is None else z.masked_fill(~t.visible, float("-inf"))
                block = zd.amax(-1, keepdim=True)
                at = x.gather(-1, zd.argmax(-1, keepdim=True))
                score_at_max = torch.where(block > top.value, at, score_at_max)
            if top is not None:
                seen = top.value > float("-inf")
                c_old = _finite_or_zero(rule.shift(top.value))
                m = top.update(z, t.visible, count_ties and rule.max_grad)
                c_new = _finite_or_zero(rule.shift(m))
                if sums:
                    # a row that has seen no visible key yet summed only zeros, against the
                    # stand-in shift 0: rescaling them by e^{0 - c_new} would overflow to
                    # inf when its first visible maximum is below -88 (float32), and inf * 0
                    # is NaN. Those sums stay as they are.
                    alpha = torch.where(seen, torch.exp(c_old - c_new), torch.ones_like(c_new))
                    sums = rule.rescaled(sums, alpha, c_old, c_new)
                st[f"c{p}"] = c_new
            if bottom is not None:
                bottom.update(z, t.visible, count_ties)
            _accumulate(sums, rule.terms(p, z, t.visible, st), rule.value_terms[p], v[:, :, t.c0:t.c1])
        if score_at_max is not None:
            st[f"xm{p}"] = score_at_max
        if top is not None:
            st[f"m{p}"] = top.final()
            st[f"ties{p}"] = top.ties.clamp_min(1.0)
        if bottom is not None:
            st[f"mn{p}"] = bottom.final()
            st[f"minties{p}"] = bottom.ties.clamp_min(1.0)
        all_sums.append(sums)
        if p < last:
            st.update(rule.stats(p, sums, st))
    out = rule.output(all_sums[-1], st)
    keep = {key: val for key, val in st.items() if key != "params"}
    return out, (all_sums, keep)


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


def _grads(outputs, inputs, grad_outputs):
    """``autograd.grad`` over the inputs that require grad; None for the others."""
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    got = torch.autograd.grad(outputs, [inputs[i] for i in wanted], grad_outputs, allow_unused=True)
    out = [None] * len(inputs)
    for i, g in zip(wanted, got):
        out[i] = g
    return out


def _add(acc: dict, key, g) -> None:
    if g is not None:
        acc[key] = g if acc.get(key) is None else acc[key] + g


def _backward_rows(plan: Plan, q, k, v, r0, r1, params: dict, saved, dout, dq, dk, dv, dparams: dict,
                   needs_v: bool) -> None:
    rule, inp = plan.rule, plan.inp
    all_sums, kept = saved
    last = rule.passes - 1
    st = {"params": params, **kept}
    diff = {f"param:{name}": t for name, t in params.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    extremes = [key for flag, key in ((rule.max_grad, f"m{last}"), (rule.min_grad, f"mn{last}")) if flag]
    for key in extremes:  # the output uses them as values: their gradient goes to the keys attaining them
        st[key] = diff[key] = _leaf(kept[key], True)
    sum_leaves, stat_graphs = [], []
    with torch.enable_grad():
        for p in range(rule.passes):
            leaves = {name: _leaf(s, True) for name, s in all_sums[p].items()}
            sum_leaves.append(leaves)
            if p < last:
                stats = rule.stats(p, leaves, st)
                stat_graphs.append(stats)
                for name, value in stats.items():
                    st[name] = diff[f"stat:{name}"] = _leaf(value, value.requires_grad)
        out = rule.output(sum_leaves[-1], st)
    acc: dict = {}
    names = list(diff)
    outs = _grads([out], list(sum_leaves[-1].values()) + [diff[n] for n in names], [dout])
    g_sums = dict(zip(sum_leaves[-1], outs))
    for name, g in zip(names, outs[len(g_sums):]):
        _add(acc, name, g)
    qs = q[:, :, r0:r1] * inp.scale
    dqs = torch.zeros_like(qs)
    for p in range(last, -1, -1):
        values = rule.value_terms[p]
        for t in inp.tiles(r0, r1, plan.block_k):
            x = _leaf(_scores(qs, k, t), True)
            vb = _leaf(v[:, :, t.c0:t.c1], needs_v and bool(values))
            with torch.enable_grad():
                z = rule.z(p, x, st)
                terms = rule.terms(p, z, t.visible, st)
                outs, gouts = [], []
                for name, term in terms.items():
                    if g_sums.get(name) is None or not term.requires_grad:
                        continue
                    outs.append(torch.matmul(term, vb) if name in values else term.sum(-1, keepdim=True))
                    gouts.append(g_sums[name])
                for flag, key, ties in ((rule.max_grad, f"m{p}", f"ties{p}"), (rule.min_grad, f"mn{p}", f"minties{p}")):
                    if flag and p == last and acc.get(key) is not None:
                        hit = z.detach() == kept[key]
                        if t.visible is not None:
                            hit = hit & t.visible
                        outs.append((z * hit).sum(-1, keepdim=True))
                        gouts.append(acc[key] / kept[ties])
            if not outs:
                continue
            grads = _grads(outs, [x, vb] + [diff[n] for n in names], gouts)
            dx = grads[0]
            if dx is not None:
                # the scale on k before the product: dS k alone can overflow where dS k scale
                # does not (SA-Softmax's gradients near finfo.max)
                dqs += torch.matmul(dx, k[:, :, t.c0:t.c1] * inp.scale)
                dk[:, :, t.c0:t.c1] += torch.matmul(dx.transpose(-1, -2), qs)
            if grads[1] is not None:
                dv[:, :, t.c0:t.c1] += grads[1]
            for name, g in zip(names, grads[2:]):
                if name not in extremes:
                    _add(acc, name, g)
        if p > 0:
            stats = stat_graphs[p - 1]
            pairs = [(stats[n.split(":", 1)[1]], acc[n]) for n in names
                     if n.startswith("stat:") and n.split(":", 1)[1] in stats and acc.get(n) is not None]
            leaves = sum_leaves[p - 1]
            if pairs:
                with torch.enable_grad():
                    param_leaves = [diff[n] for n in names if n.startswith("param:")]
                    gs = _grads([a for a, _ in pairs], list(leaves.values()) + param_leaves, [b for _, b in pairs])
                g_sums = dict(zip(leaves, gs[:len(leaves)]))
                for n, g in zip([n for n in names if n.startswith("param:")], gs[len(leaves):]):
                    _add(acc, n, g)
            else:
                g_sums = {}
    dq[:, :, r0:r1] += dqs
    for name, g in acc.items():
        if name.startswith("param:"):
            _add(dparams, name.split(":", 1)[1], g)


def _forward(plan: Plan, q, k, v, tensors):
    """The output, by query blocks over key tiles, and each block's ``(r0, r1, kept state)``."""
    params = dict(plan.fixed)
    params.update(zip(plan.tensor_names, tensors))
    b, h, lq, lk = plan.inp.shape
    out = q.new_zeros(b, h, lq, v.shape[-1])
    saved = []
    for r0 in range(0, lq, plan.block_q):
        r1 = min(r0 + plan.block_q, lq)
        rows, keep = _forward_rows(plan, q, k, v, r0, r1, params)
        if rows is not None:
            out[:, :, r0:r1] = rows
        saved.append((r0, r1, keep))
    return out, saved


class _StreamingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: Plan, q, k, v, *tensors):
        out, ctx.chunks = _forward(plan, q, k, v, tensors)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, *tensors)
        return out

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():
            # backward runs with grad mode on exactly when a graph of the gradient is wanted
            # (create_graph=True); the tiles below are differentiated on detached leaves, so
            # the gradient it returns has no graph and its derivatives would be silently wrong.
            raise RuntimeError(DOUBLE_BACKWARD_ERROR)
        plan = ctx.plan
        q, k, v, *tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad
        params = dict(plan.fixed)
        params.update({name: _leaf(t, needs[4 + i]) for i, (name, t) in enumerate(zip(plan.tensor_names, tensors))})
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dparams: dict = {}
        for r0, r1, keep in ctx.chunks:
            if keep is not None:
                _backward_rows(plan, q, k, v, r0, r1, params, keep, dout[:, :, r0:r1], dq, dk, dv, dparams,
                               needs[3])
        # zeros for a wanted parameter no visible score used (empty inputs, every row hidden)
        return (None, dq if needs[1] else None, dk if needs[2] else None, dv if needs[3] else None,
                *[(torch.zeros_like(t) if dparams.get(name) is None else dparams[name]) if need else None
                  for name, t, need in zip(plan.tensor_names, tensors, needs[4:])])


def streaming_attention(rule: StreamRule, inp: AttentionInputs, params: dict,
                        block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K) -> torch.Tensor:
    """Attention with ``rule`` over key tiles; differentiable in q, k, v and tensor parameters.
    While ``torch.compile`` traces, the forward's tiles are differentiated as they are (dynamo
    cannot trace the backward's ``autograd.grad`` over each tile): right for rules without a
    threshold search (the caller sends those to the dense path there)."""
    names = [n for n, val in params.items() if isinstance(val, torch.Tensor)]
    fixed = {n: val for n, val in params.items() if n not in names}
    tensors = [params[n].to(dtype=inp.q.dtype, device=inp.q.device) for n in names]
    plan = Plan(rule, inp, fixed, names, block_q, block_k)
    if torch.compiler.is_compiling():
        out = _forward(plan, inp.q, inp.k, inp.v, tensors)[0]
    else:
        out = _StreamingAttention.apply(plan, inp.q, inp.k, inp.v, *tensors)
    return out.to(inp.out_dtype)
