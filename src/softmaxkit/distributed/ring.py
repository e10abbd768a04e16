r"""Ring (context-parallel) attention for every streamable normalizer.

Each rank holds a shard of the sequence: its queries and its keys/values. The key/value
blocks travel around the ring of ranks (``batch_isend_irecv`` to ``rank + 1``, from
``rank - 1``); while a block is being used, the next one is already on its way, so
communication overlaps compute. Each rank runs, for its own queries, the streaming
engine of :mod:`softmaxkit.attention.streaming` over key tiles that arrive from the other
ranks: the same :class:`~softmaxkit.attention.rules.StreamRule` (the normalizer's form as
passes of summed terms), the same running state per query (shift ``c``, maximum and its
ties, minimum, the sums) and the same overflow-safe merge of a block's partial sums into
the running ones, ``S <- S e^{c_old - c_new} + S_block`` with ``c = shift(max)``, in
float32 or wider (Milakov & Gimelshein 2018, arXiv 1805.02867; the log-sum-exp merge of
ring attention, Liu, Zaharia & Abbeel 2023, arXiv 2310.01889). A normalizer with two
passes (adaptive softmax, clipped softmax) runs two rings, with its statistics computed
between them.

The backward pass is a ring too: the blocks travel again, each rank recomputes its tiles
and differentiates the rule (as the single-process engine does), and the gradients of
``K`` and ``V`` travel with their blocks, each rank adding its queries' contribution,
until they come home after ``P`` hops.

Memory per rank. A block travels in regions (about :data:`REGIONS` per block): region
``i`` goes on to the next rank, and region ``i`` of the next block comes in, while the
rank works on region ``i + 1``; the regions live in a pool of ``m + 1`` reused buffers,
so a rank holds ``1 + 1/m`` blocks of K/V besides its own, not two or three. The
travelling dK/dV is one buffer per tensor, passed on in place, which becomes this rank's
gradient when it comes home. For the backward the ring keeps the output it returned
(which the caller holds anyway) instead of the last pass's value sum, a second tensor of
the output's size: the rule's output is ``a * S`` with ``a`` per query row
(:attr:`~softmaxkit.forms.StreamRule.output_scales_values`), so ``S = out / a``; rules
with two value sums and half-precision outputs keep ``S``. The tile backward forms the
terms' gradients directly and runs autograd between gradient edges, so that a tile
costs a few ``block_q x block_k`` buffers. Gradients of per-head tensor parameters (SSMax's
``s``, MultiMax's ``r, t``) are summed over the ranks, so every rank holds the gradient
of the total loss, as for ``K`` and ``V``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge

from .. import registry
from .._checks import can_branch_on, check_bool, check_finite, check_floating
from .._rows import compute_dtype
from ..attention.inputs import Tile
from ..attention.inputs import check_mask as check_attention_mask
from ..attention.rules import StreamRule, rule_for
from ._comm import Comm, call_signature, check_layout, gather_lengths, resolve, ring_positions, ring_segments

__all__ = ["context_parallel_attention"]

DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 512
#: pieces in which a travelling gradient is passed on in place (see ``_Ring._pass_on``)
GRAD_CHUNKS = 8
#: about how many regions a key/value block is cut into on the ring (see ``_Ring.circulate``):
#: a rank holds one block plus one region in flight, ``1 + 1/REGIONS`` blocks, not two
REGIONS = 4


class _Pool:
    """Region buffers for the tensors of a travelling block, reused once given back.

    A slot holds one flat buffer per tensor, of ``numel`` elements (the largest region);
    :meth:`view` shapes the start of it as a region of that tensor."""

    def __init__(self, like):
        self.like = like  # (tensor, numel) per travelling tensor
        self.free: list = []

    def take(self) -> list:
        return self.free.pop() if self.free else [t.new_empty(n) for t, n in self.like]

    def give(self, slot) -> None:
        self.free.append(slot)

    @staticmethod
    def view(slot, j: int, shape) -> torch.Tensor:
        return slot[j][:math.prod(shape)].view(shape)


def _fz(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


@dataclass
class _Ring:
    """Everything one rank knows about the distributed problem (no tensors that need grad)."""

    comm: Comm
    rule: StreamRule
    fixed: dict
    tensor_names: list
    scale: float
    is_causal: bool
    offset: int  # Lk_total - Lq_total (causal alignment to the end of the keys)
    q_segments: list  # this rank's query pieces (global_start, local_start, length)
    k_segments: list  # every rank's key pieces
    k_lengths: list
    groups: int
    bool_mask: torch.Tensor | None  # (B, H, Lq_local, Lk_total), True = visible
    additive: torch.Tensor | None
    count: torch.Tensor | None = None  # visible keys per local query (B, H, Lq, 1)
    block_q: int = DEFAULT_BLOCK_Q
    block_k: int = DEFAULT_BLOCK_K
    sent_bytes: int = 0
    empty_rows: bool = False
    out_dtype: torch.dtype = torch.float32
    regions: list = field(default_factory=list)  # per rank, its key block's regions (see cut_regions)

    # -- tiles ---------------------------------------------------------------------
    def tiles(self, region, device):
        """The visible tiles of this rank's queries against the keys of ``region`` (key
        columns ``c0:c1`` relative to the region's start)."""
        kg, _, kn = region
        for qg, ql, qn in self.q_segments:
            for a in range(0, qn, self.block_q):
                b = min(a + self.block_q, qn)
                g0, g1 = qg + a, qg + b
                for c in range(0, kn, self.block_k):
                    d = min(c + self.block_k, kn)
                    h0, h1 = kg + c, kg + d
                    visible = None
                    if self.is_causal:
                        if h0 > g1 - 1 + self.offset:
                            continue
                        if h1 - 1 > g0 + self.offset:
                            rows = torch.arange(g0, g1, device=device).unsqueeze(-1)
                            visible = torch.arange(h0, h1, device=device) <= rows + self.offset
                    if self.bool_mask is not None:
                        part = self.bool_mask[..., ql + a:ql + b, h0:h1]
                        visible = part if visible is None else part & visible
                    additive = None
                    if self.additive is not None:
                        additive = self.additive[..., ql + a:ql + b, h0:h1]
                        finite = additive != float("-inf")
                        visible = finite if visible is None else finite & visible
                    yield Tile(ql + a, ql + b, c, d, visible, additive)

    def scores(self, qs: torch.Tensor, kb: torch.Tensor, t: Tile) -> torch.Tensor:
        k = kb[:, :, t.c0:t.c1].to(qs.dtype)
        if self.groups > 1:
            k = k.repeat_interleave(self.groups, dim=1)
        x = torch.matmul(qs, k.transpose(-1, -2))
        if t.additive is not None:
            x = x + t.additive
        if t.visible is not None:
            # every hidden score as 0 (as the single-process streaming path): a hidden score far
            # above the visible ones overflowed e^{x-c} in softpick's terms, and the backward's
            # select then formed 0 * inf = NaN
            x = torch.where(t.visible, x, torch.zeros((), dtype=x.dtype, device=x.device))
        return x

    def values(self, vb: torch.Tensor, t: Tile, dtype) -> torch.Tensor:
        v = vb[:, :, t.c0:t.c1].to(dtype)
        return v.repeat_interleave(self.groups, dim=1) if self.groups > 1 else v

    def fold(self, g: torch.Tensor) -> torch.Tensor:
        """A gradient over the repeated heads summed back onto the key/value heads."""
        if self.groups == 1:
            return g
        b, h, n, d = g.shape
        return g.view(b, h // self.groups, self.groups, n, d).sum(2)

    # -- the ring --------------------------------------------------------------------
    def cut_regions(self) -> None:
        """Cut every rank's key block into regions: about :data:`REGIONS` near-equal pieces of
        its segments, none narrower than a ``block_k`` tile (so tiles are never narrower than
        asked, except at a region's end); every block gets the same number (``None``: empty).

        The regions of a zigzag block's two segments alternate (front, back, front, ...):
        under causal masking a front piece and its back piece together cost every rank
        about the same, so that ranks, which move in step region by region, seldom wait."""
        regions = []
        for segs in self.k_segments:
            total = sum(kn for _, _, kn in segs)
            pieces = []
            for kg, kl, kn in segs:
                count = max(1, min(round(REGIONS * kn / total), kn // self.block_k))
                span = -(-kn // count)  # count near-equal pieces, none narrower than block_k
                pieces.append([(kg + a, kl + a, min(span, kn - a)) for a in range(0, kn, span)])
            regions.append([r for i in range(max(map(len, pieces), default=0)) for part in pieces
                            for r in part[i:i + 1]])
        m = max(len(r) for r in regions)
        self.regions = [r + [None] * (m - len(r)) for r in regions]

    @staticmethod
    def _piece(t: torch.Tensor, region) -> torch.Tensor:
        _, kl, kn = region
        return t[:, :, kl:kl + kn]

    def circulate(self, tensors, visit, grad_dtype=None):
        """Send the blocks of ``tensors`` (K, V) around the ring and call ``visit(region, parts,
        grad_parts)`` for every region of every rank's block, this rank's own first.

        A block travels region by region: as soon as this rank has used region ``i`` of the
        block it holds, region ``i`` goes on to the next rank while region ``i`` of the next
        block comes in from the previous one, during the work on region ``i + 1``. So a rank
        holds its block, the received regions of the next one and one region in flight:
        ``1 + 1/m`` blocks besides its own inputs (``m`` regions per block), in a pool of
        ``m + 1`` region buffers that are reused from step to step.

        With ``grad_dtype``, a gradient buffer per tensor travels with the blocks (the visitor
        adds into ``grad_parts``); after every step it is passed on in place (see
        :meth:`_pass_on`), and after ``P`` steps the gradients of this rank's own tensors are
        home and returned."""
        comm, size = self.comm, self.comm.size
        own = [t.contiguous() for t in tensors]
        grads = None
        if grad_dtype is not None:
            grads = [torch.zeros(t.shape, dtype=grad_dtype, device=t.device) for t in own]
        longest = max((r[2] for regs in self.regions for r in regs if r is not None), default=0)
        pool = _Pool([(t, t.shape[0] * t.shape[1] * longest * t.shape[3]) for t in own])
        cur: list = []  # per region of the block at hand: (pool slot, its views), once it came over the ring
        pending = None  # the exchange in flight: (handle, slot to free when it is done, region received)

        def settle():
            nonlocal pending
            if pending is not None:
                handle, done, _ = pending
                comm.ring_wait(handle)
                if done is not None:
                    pool.give(done)
                pending = None

        for step in range(size):
            src = (comm.rank - step) % size
            nsrc = (src - 1) % size
            ahead = step < size - 1  # the next block comes in during this step
            incoming: list = []
            for i, region in enumerate(self.regions[src]):
                slot, parts = (None, None) if step == 0 else cur[i]
                if pending is not None and pending[2] == i:  # this very region is still arriving
                    settle()
                if region is not None:
                    if step == 0:
                        parts = [self._piece(t, region) for t in own]
                    visit(region, parts, None if grads is None else [self._piece(g, region) for g in grads])
                if not ahead:
                    continue  # the last block: nothing goes on; its buffers are dropped
                settle()  # the previous region has left and the one before it has arrived
                send = []
                if region is not None:
                    send = list(parts)
                    if step == 0 and not all(x.is_contiguous() for x in send):
                        slot = pool.take()
                        send = [pool.view(slot, j, x.shape).copy_(x) for j, x in enumerate(send)]
                nregion = self.regions[nsrc][i]
                rslot, recv = None, []
                if nregion is not None:
                    rslot = pool.take()
                    recv = [pool.view(rslot, j, self._shape(t, nregion[2])) for j, t in enumerate(own)]
                self.sent_bytes += sum(x.numel() * x.element_size() for x in send)
                pending = (comm.ring_start(send, recv, tag=0), slot, i)
                incoming.append((rslot, recv))
            cur = incoming
            if not ahead:
                pool.free.clear()  # the block is used up: its buffers go before the gradients move
            if grads is not None and size > 1:
                for j in range(len(grads)):
                    grads[j] = self._pass_on(grads[j], self._shape(grads[j], self.k_lengths[nsrc]),
                                             tag=len(own) + j)
        settle()
        return grads

    @staticmethod
    def _shape(t: torch.Tensor, n: int):
        return (*t.shape[:2], n, t.shape[-1])

    def _pass_on(self, g: torch.Tensor, incoming_shape, tag: int) -> torch.Tensor:
        """Send ``g`` to the next rank and return the tensor received from the previous one.

        With equal shards on every rank the exchange is done in place, in :data:`GRAD_CHUNKS`
        pieces along the sequence through a small staging buffer, so no second copy of the
        gradient is ever held; otherwise whole, into a new tensor. The choice is global (every
        rank's lengths), never per pair: a sender and its receiver that compared different pairs
        of shards ([3, 3, 2]) split one message differently and the collective aborted."""
        comm = self.comm
        self.sent_bytes += g.numel() * g.element_size()
        if len(set(self.k_lengths)) > 1:
            buf = torch.empty(incoming_shape, dtype=g.dtype, device=g.device)
            comm.ring_wait(comm.ring_start([g], [buf], tag=tag))
            return buf
        n = g.shape[2]
        step = max(1, -(-n // GRAD_CHUNKS))
        for a in range(0, n, step):
            part = g[:, :, a:a + step].contiguous()
            buf = torch.empty_like(part)
            comm.ring_wait(comm.ring_start([part], [buf], tag=tag))
            g[:, :, a:a + step].copy_(buf)
        return g

    # -- per-row state ---------------------------------------------------------------
    @staticmethod
    def view(params: dict, rows: dict, r0: int, r1: int, lq: int) -> dict:
        st: dict[str, Any] = {"params": params}
        for key, val in rows.items():
            if isinstance(val, torch.Tensor) and val.dim() >= 2 and val.shape[-2] == lq:
                st[key] = val[..., r0:r1, :]
            else:
                st[key] = val
        return st


class _Extremes:
    """Running maximum (``largest``) or minimum of ``z`` per query row, with its ties."""

    def __init__(self, like: torch.Tensor, largest: bool):
        self.sign = 1.0 if largest else -1.0
        self.value = torch.full_like(like, float("-inf"))
        self.ties = torch.zeros_like(like)

    def update(self, r0, r1, z, visible, count_ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
        signed = z if self.sign > 0 else -z
        if visible is not None:
            signed = signed.masked_fill(~visible, float("-inf"))
        block = signed.amax(-1, keepdim=True)
        old = self.value[..., r0:r1, :]
        new = torch.maximum(old, block)
        if count_ties:
            hits = (signed == block).sum(-1, keepdim=True).to(z.dtype)
            hits = torch.where(block > float("-inf"), hits, torch.zeros_like(hits))
            ties = self.ties[..., r0:r1, :]
            self.ties[..., r0:r1, :] = torch.where(block > old, hits, torch.where(block == old, ties + hits, ties))
        old = old.clone()
        self.value[..., r0:r1, :] = new
        return old, new

    def final(self) -> torch.Tensor:
        return _fz(self.value) * self.sign


def _ring_forward(ring: _Ring, q, k, v, params: dict):
    """This rank's output rows and what backward needs."""
    rule = ring.rule
    b, h, lq, _ = q.shape
    dv = v.shape[-1]
    rows: dict = {}
    if rule.needs_count:
        rows["n"] = ring.count
    last = rule.passes - 1
    all_sums = []
    for p in range(rule.passes):
        values = rule.value_terms[p]
        top = _Extremes(q[..., :1], True) if rule.shifted[p] else None
        bottom = _Extremes(q[..., :1], False) if (p == last and rule.min_grad) else None
        if top is not None:
            rows[f"c{p}"] = torch.zeros_like(top.value)
        # an empty tile gives the names and shapes of the sums (all zero)
        st0 = _Ring.view(params, rows, 0, lq, lq)
        z0 = rule.z(p, q.new_zeros(b, h, lq, 0), st0)
        sums = {name: (torch.matmul(t, q.new_zeros(b, h, 0, dv)) if name in values else t.sum(-1, keepdim=True))
                .expand(b, h, lq, -1).clone()
                for name, t in rule.terms(p, z0, None, st0).items()}
        def visit(region, parts, _, p=p, values=values, top=top, bottom=bottom, sums=sums):
            kb, vb = parts
            for t in ring.tiles(region, q.device):
                st = _Ring.view(params, rows, t.r0, t.r1, lq)
                x = ring.scores(q[:, :, t.r0:t.r1] * ring.scale, kb, t)
                z = rule.z(p, x, st)
                if top is not None:
                    old, new = top.update(t.r0, t.r1, z, t.visible, p == last and rule.max_grad)
                    c_old, c_new = _fz(rule.shift(old)), _fz(rule.shift(new))
                    alpha = torch.where(old > float("-inf"), torch.exp(c_old - c_new), torch.ones_like(c_new))
                    moved = rule.rescaled({name: s[..., t.r0:t.r1, :] for name, s in sums.items()}, alpha,
                                          c_old, c_new)
                    for name, s in sums.items():
                        s[..., t.r0:t.r1, :] = moved[name]
                    rows[f"c{p}"][..., t.r0:t.r1, :] = c_new
                    st[f"c{p}"] = c_new
                if bottom is not None:
                    bottom.update(t.r0, t.r1, z, t.visible, True)
                for name, term in rule.terms(p, z, t.visible, st).items():
                    part = (torch.matmul(term, ring.values(vb, t, term.dtype)) if name in values
                            else term.sum(-1, keepdim=True))
                    sums[name][..., t.r0:t.r1, :] += part

        ring.circulate([k, v], visit)
        if top is not None:
            rows[f"m{p}"] = top.final()
            rows[f"ties{p}"] = top.ties.clamp_min(1.0)
        if bottom is not None:
            rows[f"mn{p}"] = bottom.final()
            rows[f"minties{p}"] = bottom.ties.clamp_min(1.0)
        all_sums.append(sums)
        if p < last:
            rows.update(rule.stats(p, sums, {"params": params, **rows}))
    out = rule.output(all_sums[-1], {"params": params, **rows})
    if ring.empty_rows:  # queries that see no key output 0
        assert ring.count is not None  # set with empty_rows
        out = torch.where(ring.count > 0, out, torch.zeros_like(out))
    return out, (all_sums, rows)


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


def _grads(outputs, inputs, grad_outputs):
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    if not wanted:
        return [None] * len(inputs)
    got = torch.autograd.grad(outputs, [inputs[i] for i in wanted], grad_outputs, allow_unused=True)
    out = [None] * len(inputs)
    for i, g in zip(wanted, got):
        out[i] = g
    return out


def _add(acc: dict, key, g, r0=None, r1=None, like=None) -> None:
    if g is None:
        return
    if r0 is None:
        acc[key] = g if acc.get(key) is None else acc[key] + g
        return
    if acc.get(key) is None:
        acc[key] = torch.zeros_like(like)
    acc[key][..., r0:r1, :] += g


def _ring_backward(ring: _Ring, q, k, v, params: dict, saved, dout, need_v: bool, out_saved=None):
    """``dq`` (local), ``dk``, ``dv`` (this rank's blocks, after travelling the ring) and the
    local gradients of the tensor parameters (summed over ranks by the caller).

    A value sum saved as ``None`` is recovered from the output ``out_saved``: the rule's
    output is ``a * S`` with ``a`` per row (:attr:`StreamRule.output_scales_values`), so
    ``S = out / a`` where ``a != 0`` (and 0 where ``a = 0``: those rows output 0)."""
    rule = ring.rule
    all_sums, kept = saved
    lq = q.shape[2]
    last = rule.passes - 1
    st_full = {"params": params, **kept}
    row_diff: dict = {}  # differentiable per-row quantities: stats of earlier passes, used extremes
    extremes = [key for flag, key in ((rule.max_grad, f"m{last}"), (rule.min_grad, f"mn{last}")) if flag]
    for key in extremes:
        st_full[key] = row_diff[key] = _leaf(kept[key], True)
    param_names = [n for n, t in params.items() if isinstance(t, torch.Tensor) and t.requires_grad]
    sum_leaves, stat_graphs = [], []
    with torch.enable_grad():
        for p in range(rule.passes):
            leaves = {name: _leaf(t, True) for name, t in all_sums[p].items() if t is not None}
            sum_leaves.append(leaves)
            if p < last:
                stats = rule.stats(p, leaves, st_full)
                stat_graphs.append(stats)
                for name, value in stats.items():
                    st_full[name] = row_diff[name] = _leaf(value, value.requires_grad)
    acc: dict = {}  # gradients of per-row quantities and (key "param:<name>") parameters
    row_names = [n for n, t in row_diff.items() if t.requires_grad]
    value_names = [n for n in all_sums[last] if n in rule.value_terms[last]]
    detached = {**kept, **{n: t.detach() for n, t in row_diff.items()}}

    def sum_rows(name, r0, r1) -> torch.Tensor:
        """Rows ``r0:r1`` of the last pass's sum ``name`` (a value sum not kept: from the output)."""
        t = all_sums[last][name]
        if t is not None:
            return t[..., r0:r1, :]
        assert out_saved is not None  # kept in its place
        out = out_saved[..., r0:r1, :]
        probe = {n: (out.new_ones(*out.shape[:-1], 1) if s is None else s[..., r0:r1, :])
                 for n, s in all_sums[last].items()}
        with torch.no_grad():
            a = rule.output(probe, _Ring.view(params, detached, r0, r1, lq))
            if ring.empty_rows:
                assert ring.count is not None  # set with empty_rows
                a = torch.where(ring.count[..., r0:r1, :] > 0, a, torch.zeros_like(a))
            nonzero = a != 0
            return torch.where(nonzero, out / torch.where(nonzero, a, torch.ones_like(a)), torch.zeros_like(out))

    def output_rows(r0, r1, grad_values: bool, graph: bool):
        """The output of rows ``r0:r1`` from the sums (autograd graph to the sums, the per-row
        quantities and the parameters when ``graph``)."""
        leaves = {n: _leaf(sum_rows(n, r0, r1), graph or (grad_values and n in value_names))
                  for n in all_sums[last]}
        st = _Ring.view(params, st_full if graph else detached, r0, r1, lq)
        out = rule.output(leaves, st)
        if ring.empty_rows:
            assert ring.count is not None  # set with empty_rows
            out = torch.where(ring.count[..., r0:r1, :] > 0, out, torch.zeros_like(out))
        return out, leaves, st

    # the gradient of the output, one block of rows at a time: the per-row sums' gradients
    # are kept; those of the value sums (rows x Dv, as large as the output) are recomputed
    # per tile in the ring below instead of being held for every row
    g_sums: dict = {}
    big = set()
    for r0 in range(0, lq, ring.block_q):
        r1 = min(r0 + ring.block_q, lq)
        with torch.enable_grad():
            out, leaves, st = output_rows(r0, r1, False, True)
            names = list(leaves)
            gs = _grads([out], [leaves[n] for n in names] + [st[n] for n in row_names] +
                        [params[n] for n in param_names], [dout[..., r0:r1, :]])
        for name, g in zip(names, gs):
            if g is None:
                g_sums.setdefault(name, None)
            elif name in value_names:
                big.add(name)
                g_sums[name] = "recompute"
            else:
                if g_sums.get(name) is None:
                    g_sums[name] = torch.zeros_like(all_sums[last][name])  # a row sum: (B, H, Lq, 1)
                g_sums[name][..., r0:r1, :] = g
        rest = gs[len(names):]
        for name, g in zip(row_names, rest[:len(row_names)]):
            _add(acc, name, g, r0, r1, row_diff[name])
        for name, g in zip(param_names, rest[len(row_names):]):
            _add(acc, "param:" + name, g)
        del out, gs

    cache: dict = {}

    def value_grads(r0, r1) -> dict:
        """The gradients of the value sums of rows ``r0:r1`` (recomputed; the last block cached)."""
        if cache.get("rows") != (r0, r1):
            with torch.enable_grad():
                out, leaves, _ = output_rows(r0, r1, True, False)
                names = sorted(big)
                gs = _grads([out], [leaves[n] for n in names], [dout[..., r0:r1, :]])
            cache.clear()
            cache.update(dict(zip(names, gs)), rows=(r0, r1))
        return cache

    dqs = torch.zeros_like(q)
    cdt = q.dtype

    def term_gradients(terms: dict, values, g_sums, vt, t: Tile, outs: list):
        """Append ``(term, gradient)`` to ``outs`` for the terms with a gradient, one entry per
        distinct tensor; return ``dV`` of the tile (None without value terms)."""
        by_term: dict = {}  # id(term) -> index in outs
        mine: dict = {}  # id(term) -> whether its gradient in outs is a tensor of our own
        dvt = None
        for name, term in terms.items():
            g = g_sums.get(name)
            if g is None:
                continue
            if isinstance(g, str):  # recomputed for these rows
                g = value_grads(t.r0, t.r1)[name]
                if g is None:
                    continue
            else:
                g = g[..., t.r0:t.r1, :]
            if name in values:
                if need_v:
                    part = torch.matmul(term.detach().transpose(-1, -2), g)
                    dvt = part if dvt is None else dvt.add_(part)
                g = torch.matmul(g, vt.transpose(-1, -2))
            if not term.requires_grad:
                continue
            owned = name in values  # g is a new tensor of the term's shape, free to add into
            i = by_term.get(id(term))
            if i is None:
                by_term[id(term)] = len(outs)
                outs.append((term, g if owned else g.expand_as(term)))
                mine[id(term)] = owned
            elif mine[id(term)]:
                outs[i][1].add_(g)
            else:
                outs[i] = (term, g.add_(outs[i][1]) if owned else g + outs[i][1])
                mine[id(term)] = True
        return dvt

    def tile_backward(p, values, extremes, g_sums, kb, vb, dkb, dvb, t: Tile) -> None:
        """Add one tile's share to ``dq``, ``dK``, ``dV`` and the per-row and parameter gradients.

        The gradient of each summed term is formed directly (``g V^T`` for a value sum, ``g``
        for a row sum; terms that are the same tensor, as softmax's numerator and
        denominator, get one gradient), ``dV`` is ``term^T g``; autograd then runs only from
        the terms back to the scores, between gradient edges, so that neither the terms nor
        the scores are held while it runs (the scores come from a query leaf, and
        ``q K^T`` keeps only its inputs): a few tiles of memory, not a dozen."""
        st = _Ring.view(params, kept, t.r0, t.r1, lq)
        tile_leaves = {}
        for name in row_names:
            if name in extremes:
                continue
            tile_leaves[name] = st[name] = _leaf(row_diff[name].detach()[..., t.r0:t.r1, :], True)
        qs = _leaf(q[:, :, t.r0:t.r1] * ring.scale, True)
        outs: list = []  # (tensor whose gradient is known, that gradient)
        with torch.enable_grad():
            x = ring.scores(qs, kb, t)
            x_edge = get_gradient_edge(x)
            z = rule.z(p, x, st)
            del x
            terms = rule.terms(p, z, t.visible, st)
            if p == last:
                for flag, key, ties in ((rule.max_grad, f"m{p}", f"ties{p}"), (rule.min_grad, f"mn{p}", f"minties{p}")):
                    if flag and acc.get(key) is not None:
                        hit = z.detach() == kept[key][..., t.r0:t.r1, :]
                        if t.visible is not None:
                            hit = hit & t.visible
                        outs.append(((z * hit).sum(-1, keepdim=True), (acc[key] / kept[ties])[..., t.r0:t.r1, :]))
        del z
        dvt = term_gradients(terms, values, g_sums, ring.values(vb, t, cdt) if values else None, t, outs)
        del terms
        if dvt is not None:
            dvb[:, :, t.c0:t.c1] += ring.fold(dvt)
            del dvt
        if not outs:
            return
        names = list(tile_leaves)
        inputs = [tile_leaves[n] for n in names] + [params[n] for n in param_names]
        wanted = [0] + [1 + i for i, u in enumerate(inputs) if u.requires_grad]
        edges = [get_gradient_edge(u) for u, _ in outs]
        gouts = [g for _, g in outs]
        targets = [x_edge] + [get_gradient_edge(inputs[i - 1]) for i in wanted[1:]]
        del outs, inputs
        got = torch.autograd.grad(edges, targets, gouts, allow_unused=True)
        del gouts
        grads: list = [None] * (1 + len(names) + len(param_names))
        for i, g in zip(wanted, got):
            grads[i] = g
        del got
        dx = grads[0]
        if dx is not None:
            kt = kb[:, :, t.c0:t.c1].to(cdt)
            if ring.groups > 1:
                kt = kt.repeat_interleave(ring.groups, dim=1)
            dqs[:, :, t.r0:t.r1] += torch.matmul(dx, kt)
            dkb[:, :, t.c0:t.c1] += ring.fold(torch.matmul(dx.transpose(-1, -2), qs))
        for name, g in zip(names, grads[1:1 + len(names)]):
            _add(acc, name, g, t.r0, t.r1, row_diff[name])
        for name, g in zip(param_names, grads[1 + len(names):]):
            _add(acc, "param:" + name, g)

    dk = dv = None
    for p in range(last, -1, -1):
        values = rule.value_terms[p]
        # decided by every rank together: a rank with nothing to send back (all its queries before
        # every key) skipped a ring the others entered, and they waited on it
        needed = any(g is not None for g in g_sums.values()) or bool(extremes)
        if ring.comm.size > 1:
            needed = any(flag for (flag,) in ring.comm.all_gather_ints([int(needed)]))
        if needed:
            def visit(region, parts, grad_parts, p=p, values=values, extremes=extremes, g_sums=g_sums):
                kb, vb = parts
                dkb, dvb = grad_parts
                for t in ring.tiles(region, q.device):
                    tile_backward(p, values, extremes, g_sums, kb, vb, dkb, dvb, t)

            own_dk, own_dv = ring.circulate([k, v], visit, grad_dtype=cdt)
            dk = own_dk if dk is None else dk.add_(own_dk)
            dv = own_dv if dv is None else dv.add_(own_dv)
        if p > 0:
            stats = stat_graphs[p - 1]
            pairs = [(stats[n], acc[n]) for n in row_names if n in stats and acc.get(n) is not None]
            leaves = sum_leaves[p - 1]
            if pairs:
                with torch.enable_grad():
                    gs = _grads([a for a, _ in pairs], list(leaves.values()) + [params[n] for n in param_names],
                                [g for _, g in pairs])
                g_sums = dict(zip(leaves, gs[:len(leaves)]))
                for name, g in zip(param_names, gs[len(leaves):]):
                    _add(acc, "param:" + name, g)
            else:
                g_sums = {}
        extremes = []  # only the last pass uses them
    if dk is None:
        dk = torch.zeros(k.shape, dtype=cdt, device=k.device)
        dv = torch.zeros(v.shape, dtype=cdt, device=v.device)
    return dqs.mul_(ring.scale), dk, dv, {n: acc.get("param:" + n) for n in param_names}


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ring: _Ring, q, k, v, *tensors):
        cdt = compute_dtype(q.dtype)
        params = dict(ring.fixed)
        params.update(zip(ring.tensor_names, [t.to(cdt) for t in tensors]))
        out, saved = _ring_forward(ring, q.to(cdt), k, v, params)
        result = out.to(ring.out_dtype)
        all_sums, _ = saved
        rule, last = ring.rule, ring.rule.passes - 1
        value_names = [n for n in all_sums[last] if n in rule.value_terms[last]]
        kept_out = None
        if len(value_names) == 1 and result is out and rule.output_scales_values:
            # the output is a * S (a per row): keep it, which the caller holds anyway, instead of
            # the value sum S, a second tensor of the output's size (see _ring_backward)
            all_sums[last] = {n: (None if n == value_names[0] else t) for n, t in all_sums[last].items()}
            kept_out = result
        ctx.ring, ctx.saved = ring, saved
        ctx.save_for_backward(q, k, v, kept_out, *tensors)
        return result

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():   # create_graph=True: the ring's tile backward builds no graph
            raise RuntimeError("context_parallel_attention has first derivatives only: a backward with "
                               "create_graph=True (a gradient penalty, a Hessian-vector product) is not "
                               "supported; ulysses_attention has one where softmaxkit.attention's local path does")
        ring = ctx.ring
        q, k, v, kept_out, *tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad
        cdt = compute_dtype(q.dtype)
        params = dict(ring.fixed)
        params.update({n: _leaf(t.to(cdt), needs[4 + i]) for i, (n, t) in enumerate(zip(ring.tensor_names, tensors))})
        dq, dk, dv, dparams = _ring_backward(ring, q.to(cdt), k, v, params, ctx.saved, dout.to(cdt), needs[3],
                                             kept_out)
        grads = []
        for name, t in zip(ring.tensor_names, tensors):
            g = dparams.get(name)
            if g is None and name in dparams:
                g = torch.zeros_like(params[name])
            if name in dparams:
                g = ring.comm.all_reduce_sum_(g.contiguous().clone())
                g = _unbroadcast(g, t.shape).to(t.dtype)
            grads.append(g)
        return (None, dq.to(q.dtype) if needs[1] else None, dk.to(k.dtype) if needs[2] else None,
                dv.to(v.dtype) if needs[3] else None, *grads)


def _unbroadcast(g: torch.Tensor, shape) -> torch.Tensor:
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


# --------------------------------------------------------------------------------------
# checks shared with Ulysses
# --------------------------------------------------------------------------------------

def check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_floating(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L_local, D) (this rank's shard of the sequence), "
                             f"got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, h, _, d = q.shape
    bk, hk, lk, dk = k.shape
    if (bk, hk, lk) != tuple(v.shape[:3]):
        raise ValueError(f"k and v must agree in (B, H, L), got {tuple(k.shape)} and {tuple(v.shape)}")
    if bk != b or dk != d:
        raise ValueError(f"q and k must agree in batch size and head dimension, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if hk == 0 or h % hk:
        raise ValueError(f"the number of query heads ({h}) must be a multiple of the key/value heads ({hk})")
    # (a rank may hold no query or no key: its shard is empty, the others' are not; refusing it on
    # that rank alone left the others waiting in the first exchange until the timeout)


def check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d) if d else 1.0
    check_finite(scale, "scale", allow_tensor=False)   # (as softmaxkit.attention: ValueError for NaN / inf)
    return float(scale)


def check_params(normalizer: str, params: dict, b: int, h: int, dtype, device, validate: bool = True
                 ) -> tuple[dict, list]:
    """The normalizer's parameters with defaults, validated; names of the per-head tensors."""
    spec = registry.get(normalizer)
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise TypeError(f"normalizer {normalizer!r} got unexpected parameter(s) {unknown}; "
                        f"accepted: {', '.join(spec.params) or 'none'}")
    merged = {**spec.params, **params}
    tensors = []
    for name, val in params.items():
        if not isinstance(val, torch.Tensor):
            continue
        default = spec.params.get(name)
        shape = val.shape[1:] if isinstance(default, (tuple, list)) else val.shape
        try:
            ok = torch.broadcast_shapes(shape, (b, h, 1, 1)) == (b, h, 1, 1)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"parameter {name!r} of shape {tuple(val.shape)} must be a number or a per-head tensor "
                             f"broadcastable to (B, H, 1, 1) = {(b, h, 1, 1)}: parameters that vary per query or key "
                             "cannot be distributed")
        tensors.append(name)
    if validate:  # let the reference check the values on one row per (batch, head)
        dummy = torch.zeros(b, h, 1, 2, dtype=dtype, device=device)
        registry.normalize(dummy, normalizer, dim=-1, **params)
    return merged, tensors


def check_mask(attn_mask, shape, q=None):
    """``attn_mask`` (this rank's query rows against every key, in global key order)."""
    return check_attention_mask(attn_mask, shape, "(B, H, L_local, L_total)",
                                ": rows are this rank's queries, columns every key in global order", q=q)


def _check_blocks(block_size) -> tuple[int, int]:
    if block_size is None:
        return DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K
    if isinstance(block_size, bool) or not isinstance(block_size, (int, tuple, list)):
        raise TypeError(f"block_size must be a positive int or a pair (block_q, block_k), got "
                        f"{type(block_size).__name__}")
    pair = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    if len(pair) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in pair):
        raise ValueError(f"block_size must be a positive int or a pair (block_q, block_k), got {block_size!r}")
    return pair


def _needs_whole_rows(attn_mask) -> bool:
    """Whether a float ``attn_mask`` needs :func:`softmaxkit.attention`'s dense path, which the
    ring cannot run: a ``+inf`` (that key takes its row's whole weight; the ring's running
    shifts formed ``inf - inf``, NaN in the rows and in every gradient of ``k`` and ``v``), or a
    learned bias (one that requires grad: the ring takes the mask as a constant and gave it
    no gradient). :func:`ulysses_attention` runs such masks, whole rows on each rank."""
    if not isinstance(attn_mask, torch.Tensor) or not attn_mask.is_floating_point():
        return False
    if attn_mask.requires_grad and torch.is_grad_enabled():
        return True
    return (attn_mask.numel() > 0 and can_branch_on(attn_mask)
            and bool(attn_mask.detach().amax() == float("inf")))


def _count(ring: _Ring, b: int, h: int, qpos: torch.Tensor, lk_total: int, dtype, device) -> torch.Tensor:
    """Visible keys per local query, ``(B, H, Lq, 1)``."""
    qpos = qpos.to(device)
    if ring.bool_mask is None and ring.additive is None:
        if ring.is_causal:
            n = (qpos + ring.offset + 1).clamp(0, lk_total)
        else:
            n = torch.full_like(qpos, lk_total)
        return n.to(dtype).view(1, 1, -1, 1).expand(b, h, -1, 1)
    if ring.bool_mask is not None:
        visible = ring.bool_mask
    else:
        assert ring.additive is not None
        visible = ring.additive.ne(float("-inf"))
    if ring.is_causal:
        visible = visible & (torch.arange(lk_total, device=device) <= (qpos + ring.offset).unsqueeze(-1))
    return visible.sum(-1, keepdim=True).to(dtype).expand(b, h, -1, 1)


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, /, normalizer: str = "softmax", *,
                               group=None, is_causal: bool = False, attn_mask: torch.Tensor | None = None,
                               layout: str = "zigzag", scale: float | None = None, block_size=None,
                               **params) -> torch.Tensor:
    r"""Ring (context-parallel) attention over sequence shards, with any streamable normalizer.

    .. math:: \mathrm{out}_i = \sum_j p_{ij} v_j,\quad
              p_{i\cdot} = \mathrm{normalize}(q_i K^\top \cdot \mathrm{scale} + a_{i\cdot})

    over the keys of *every* rank, exactly as :func:`softmaxkit.attention` on the whole
    sequence. Each rank passes its shard: ``q`` ``(B, H, Lq_local, D)``, ``k`` and ``v``
    ``(B, Hkv, Lk_local, D|Dv)`` (``Hkv`` divides ``H``: grouped-query attention; only the
    ``Hkv`` heads travel). Key/value blocks go around the ring with
    ``torch.distributed.batch_isend_irecv``, the next block in flight while the current one
    is used; the partial sums of each block merge into the running state with the
    overflow-safe rule of the normalizer's streaming form (see the module docstring), in
    float32 for float16/bfloat16 inputs. The backward pass is a second ring in which
    ``dK``/``dV`` travel with their blocks. Ring attention: Liu, Zaharia & Abbeel 2023,
    "Ring Attention with Blockwise Transformers", arXiv 2310.01889; online normalizer:
    Milakov & Gimelshein 2018, arXiv 1805.02867.

    Normalizers:
        * one-pass streamable ones (softmax, ssmax, sa_softmax, multimax, softpick,
          stablemax, sigmoid, relu, relu_l1, softplus_l1, ...) run one ring; two-pass ones
          (adaptive_softmax, clipped_softmax) run two rings forward and two backward.
          Softpick's and normalized SA-softmax's global extremes are part of the
          per-query running state, so they are exact.
        * the threshold family (sparsemax, entmax15, entmax and as_entmax with a number alpha) is
          **delegated to** :func:`ulysses_attention` (one all-to-all each way): a
          distributed threshold search would cost one ring (or one all-reduce of every
          query's partial sums) per bisection step, tens of them.
        * normalizers without a streaming form (sparse_softmax, entmax or as_entmax with a
          tensor alpha) raise ``ValueError``: use :func:`ulysses_attention`.
        * a float ``attn_mask`` with a ``+inf`` on some rank (that key takes its row's whole
          weight) or that requires grad (a learned bias) is also delegated to
          :func:`ulysses_attention`, which runs :func:`softmaxkit.attention`'s dense path there.

    Layout (``layout=``): ``"zigzag"`` (default): the sequence is cut into ``2P`` equal
    chunks and rank ``r`` holds chunks ``r`` and ``2P - 1 - r`` concatenated, which gives
    every rank the same causal work (all ranks need the same even local length);
    ``"contiguous"``: rank ``r`` holds the ``r``-th piece, and pieces may differ in length
    (a rank may hold no query or no key: one decoding query on the last rank).
    :func:`softmaxkit.distributed.shard_sequence` cuts a tensor either way.

    Visibility: ``is_causal`` uses global positions (query ``i`` sees key ``j <= i + Lk -
    Lq``, totals over ranks); ``attn_mask`` (bool, True = visible, or float, added) holds
    this rank's query rows against **every** key in global order: broadcastable to
    ``(B, H, Lq_local, Lk_total)``; a padding mask is ``(B, 1, 1, Lk_total)``. Queries
    with no visible key output 0.

    Args:
        normalizer: a registered name.
        group: a ``torch.distributed`` process group (default: the default group).
        scale: multiplies ``q k^T``; default ``1 / sqrt(D)``.
        block_size: ``block`` or ``(block_q, block_k)`` of the tiles inside each block.
        **params: the normalizer's parameters: numbers, or per-head tensors broadcastable to
            ``(B, H, 1, 1)`` (learnable; their gradient is summed over the ranks).

    Memory: besides its shard of the inputs, output and gradients, a rank holds ``1 + 1/m``
    key/value blocks on the ring (``m`` regions per block, see the module docstring) and a
    few tiles. The backward reads the returned output: changing it in place before the
    backward raises autograd's error (as for torch's own functions that keep their output).

    Returns:
        ``(B, H, Lq_local, Dv)``: this rank's output rows, in the dtype of ``q``.
    """
    check_qkv(q, k, v)
    check_layout(layout)
    is_causal = check_bool(is_causal, "is_causal")
    b, h, lq, d = q.shape
    scale = check_scale(scale, d)
    cdt = compute_dtype(q.dtype)
    merged, tensor_names = check_params(normalizer, params, b, h, cdt, q.device, validate=False)
    rule = rule_for(normalizer, merged)
    if rule is None:
        raise ValueError(f"normalizer {normalizer!r} with these parameters cannot run on the ring: it has no "
                         "streaming form with O(1) state per query (e.g. sparse_softmax's top-k, entmax or as_entmax "
                         "with a tensor alpha); use softmaxkit.distributed.ulysses_attention, which shards heads")
    if hasattr(rule, "search"):
        from .ulysses import ulysses_attention

        return ulysses_attention(q, k, v, normalizer, group=group, is_causal=is_causal, attn_mask=attn_mask,
                                 layout=layout, scale=scale, **params)
    check_params(normalizer, params, b, h, cdt, q.device)
    block_q, block_k = _check_blocks(block_size)
    comm = resolve(group)
    lengths = gather_lengths(comm, [lq, k.shape[2], int(_needs_whole_rows(attn_mask))],
                             call_signature(q, k, v, is_causal, layout, normalizer, merged, scale,
                                            block_size=f"{block_q},{block_k}"))
    if any(x[2] for x in lengths):   # (decided by every rank alike: each one joins the all-to-alls)
        from .ulysses import ulysses_attention

        return ulysses_attention(q, k, v, normalizer, group=comm, is_causal=is_causal, attn_mask=attn_mask,
                                 layout=layout, scale=scale, **params)
    q_lengths, k_lengths = [x[0] for x in lengths], [x[1] for x in lengths]
    q_segs = ring_segments(layout, q_lengths, "q")
    k_segs = ring_segments(layout, k_lengths, "k and v")
    lq_total, lk_total = sum(q_lengths), sum(k_lengths)
    bool_mask, additive = check_mask(attn_mask, (b, h, lq, lk_total), q=q)
    if additive is not None:
        additive = additive.to(cdt)
    fixed = {n: val for n, val in merged.items() if n not in tensor_names}
    ring = _Ring(comm, rule, fixed, tensor_names, scale, is_causal, lk_total - lq_total, q_segs[comm.rank],
                 k_segs, k_lengths, h // k.shape[1], bool_mask, additive, block_q=block_q, block_k=block_k,
                 out_dtype=q.dtype)
    ring.cut_regions()
    ring.count = _count(ring, b, h, ring_positions(q_segs[comm.rank]), lk_total, cdt, q.device)
    ring.empty_rows = bool((ring.count == 0).any())
    tensors = [merged[n] for n in tensor_names]
    return _RingAttention.apply(ring, q, k, v, *tensors)
