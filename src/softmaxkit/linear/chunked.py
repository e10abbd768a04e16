"""The engine of the kernelised methods: running sums, one pass, chunks, dense reference.

Every kernelised method (:mod:`softmaxkit.linear._spec`) needs, per query ``i``, four sums
over the keys ``j`` it sees:

* ``num_i = sum_j (phi(q_i).phi(k_j)) v_j`` (``Dv`` values),
* ``den_i = sum_j phi(q_i).phi(k_j)``,
* ``vsum_i = sum_j v_j`` and ``n_i = #{j}``.

Non-causal attention gets them from ``S = sum_j phi(k_j) v_j^T`` (``F x Dv``) and
``z = sum_j phi(k_j)`` in one pass. Causal attention is computed in chunks of ``C``
tokens: quadratic inside a chunk (a ``C x C`` tile under the diagonal), and a state
carried between chunks (the exclusive prefix sums of the chunks' ``S`` and ``z``), so
memory is ``O(L (C + F Dv / C))``: no ``L x L`` tensor and no per-position ``F x Dv`` state.
Decoding carries the same sums (:class:`Sums`) from call to call: ``O(F Dv)`` per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Default chunk length of the causal path.
DEFAULT_CHUNK = 64


@dataclass
class Sums:
    """Running sums over the keys seen so far, per (batch, head).

    ``kv`` ``(B, H, F, Dv)``, ``k`` ``(B, H, F)``, ``v`` ``(B, H, Dv)``, ``n`` ``(B, H)``;
    ``shift`` ``(B, H, 1, 1)`` or None: ``kv`` and ``k`` are stored divided by ``exp(shift)``.
    """

    kv: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    n: torch.Tensor
    shift: torch.Tensor | None = None

    def detach(self) -> Sums:
        return Sums(self.kv.detach(), self.k.detach(), self.v.detach(), self.n.detach(),
                    None if self.shift is None else self.shift.detach())


def common_shift(phi_k: torch.Tensor, shift: torch.Tensor, visible: torch.Tensor | None):
    """Key features with per-key log scales ``shift`` ``(B, H, L, 1)`` (``phi * e^shift`` is the
    feature) brought to one scale per (batch, head), the largest over the visible keys:
    ``(phi * e^(shift - G), G)``, ``G`` ``(B, H, 1, 1)``. Every factor is at most 1: no overflow,
    and the keys that dominate keep their precision (for non-causal attention, where every
    query sees the same keys)."""
    s = _visible_shifts(shift[..., 0], visible)
    g = s.amax(-1, keepdim=True)
    g = torch.where(torch.isfinite(g), g, torch.zeros_like(g))[..., None]
    return phi_k * torch.exp((shift - g).clamp_max(0.0)), g


def _visible_shifts(shift: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """``shift`` ``(B, H, L)`` with ``-inf`` on the keys that do not count (invisible, or NaN:
    a NaN key reaches the output through its features, not through the common scale)."""
    hidden = torch.isnan(shift)
    if visible is not None:
        hidden = hidden | ~visible
    return shift.detach().masked_fill(hidden, float("-inf"))


def causal_chunked_shifted(fq, fk, shift, v, m, sums0: Sums | None = None, chunk: int = DEFAULT_CHUNK):
    """:func:`causal_chunked` for key features with per-key log scales (FAVOR+): key ``j`` is
    ``fk_j e^{shift_j}``, ``shift`` ``(B, H, T, 1)``.

    Each query ``i`` is computed in the units of the largest scale among the keys it sees,
    ``r_i`` (a running maximum over the positions): every factor ``e^{r_j - r_i}`` is at most 1,
    and no key is measured against a future key's scale (a key far larger than the earlier
    ones would make their features underflow). The state carried between chunks is kept in
    the units of the last key it holds and rescaled by ``e^{r_prev - r_now} <= 1`` at each
    chunk. Returns ``(num, den, None, n)``, the :class:`Sums` after the last key (``shift`` its
    scale) and ``r`` ``(B, H, T, 1)``: ``num`` and ``den`` are divided by ``e^{r}`` (the
    caller's floor on ``den`` must be too).
    """
    b, h, t, f = fq.shape
    dv = v.shape[-1]
    dtype, device = v.dtype, v.device
    s = _visible_shifts(shift[..., 0], None if m is None else m.expand(b, h, t) > 0)
    start = (torch.full((b, h, 1), float("-inf"), dtype=dtype, device=device) if sums0 is None or sums0.shift is None
             else sums0.shift[..., 0].detach())
    run = torch.cummax(torch.cat([start, s], -1), -1).values[..., 1:]
    # before the first visible key (nothing seen) any scale will do: the smallest one seen later
    finite = torch.isfinite(run)
    lowest = run.masked_fill(~finite, float("inf")).amin(-1, keepdim=True)
    run = torch.where(finite, run, torch.where(torch.isfinite(lowest), lowest, torch.zeros_like(lowest)))
    fk = fk * torch.exp((s - run).clamp_max(0.0))[..., None]           # (fk e^{shift}) e^{-r_j}
    mm = torch.ones(1, 1, t, dtype=dtype, device=device) if m is None else m
    vm = v if m is None else hide(v, m)
    va = torch.cat([vm, mm[..., None].expand(b, h, t, 1)], dim=-1)       # (B, H, T, Dv + 1)
    if sums0 is not None:
        state = torch.cat([sums0.kv, sums0.k[..., None]], dim=-1)
        prev = start[..., 0] if sums0.shift is not None else run[..., 0]
    else:
        state = torch.zeros(b, h, f, dv + 1, dtype=dtype, device=device)
        prev = run[..., 0]
    outs = []
    step = max(1, chunk)
    # split once (not sliced per chunk: each slice's backward filled a zero tensor of the whole
    # sequence, quadratic in the number of chunks; the split's backward concatenates once)
    for r, fqc, fkc, vac in zip(run.split(step, -1), fq.split(step, -2), fk.split(step, -2), va.split(step, -2)):
        decay = torch.exp((r[..., None, :] - r[..., :, None]).clamp_max(0.0))   # e^{r_j - r_i}, j <= i
        w = torch.tril((fqc @ fkc.transpose(-2, -1)) * decay)
        carried = (fqc @ state) * torch.exp((prev[..., None] - r).clamp_max(0.0))[..., None]
        outs.append(carried + w @ vac)
        now = r[..., -1]
        keys = (fkc * torch.exp(r - now[..., None])[..., None]).transpose(-2, -1) @ vac
        state = state * torch.exp((prev - now).clamp_max(0.0))[..., None, None] + keys
        prev = now
    out = torch.cat(outs, dim=-2)
    cnt = torch.cumsum(mm, -1).expand(b, h, t)
    if sums0 is not None:
        cnt = cnt + sums0.n[..., None]
    vlast = vm.sum(-2).expand(b, h, dv) if sums0 is None else sums0.v + vm.sum(-2)
    last = Sums(state[..., :dv], state[..., dv], vlast, cnt[..., -1], prev[..., None, None])
    return (out[..., :dv], out[..., dv:], None, cnt[..., None]), last, run[..., None]


def hide(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``v`` with 0 on the keys ``m`` ``(B, H|1, L)`` (0. / 1.) hides: a select, not a product, so
    that a NaN or inf in a padding token's value stays out of the sums."""
    return torch.where(m[..., None] > 0, v, torch.zeros((), dtype=v.dtype, device=v.device))


def one_pass(fq, fk, v, m, sums0: Sums | None = None):
    """Non-causal sums: every query sees every (visible) key. ``fk`` is already zero on
    invisible keys; ``m`` ``(B, H|1, Lk)`` float or None. Returns ``(num, den, vsum, n), Sums``."""
    vm = v if m is None else hide(v, m)
    kv = fk.transpose(-2, -1) @ vm
    kz = fk.sum(-2)
    vs = vm.sum(-2)
    b, h = fq.shape[:2]
    n = (torch.full((b, h), float(v.shape[-2]), dtype=v.dtype, device=v.device) if m is None
         else m.sum(-1).expand(b, h))
    if sums0 is not None:
        kv, kz, vs, n = kv + sums0.kv, kz + sums0.k, vs + sums0.v, n + sums0.n
    num = fq @ kv
    den = fq @ kz[..., None]
    return (num, den, vs[..., None, :], n[..., None, None]), Sums(kv, kz, vs, n)


def causal_chunked(fq, fk, v, m, sums0: Sums | None = None, chunk: int = DEFAULT_CHUNK, need_vsum: bool = True):
    """Causal sums for ``T`` queries against the ``T`` keys at the same positions (query
    ``t`` sees keys ``<= t``) after the keys already summed in ``sums0``.

    ``fq`` ``(B, H, T, F)``, ``fk`` ``(B, H, T, F)`` (zero on invisible keys), ``v``
    ``(B, H, T, Dv)``, ``m`` ``(B, H|1, T)`` float or None. Returns
    ``(num, den, vsum, n)`` per query (``vsum`` None unless ``need_vsum``) and the
    :class:`Sums` after the last key. The denominator rides along with the values as one
    extra column (``[v, m]``), so each tile costs two matrix products.
    """
    b, h, t, f = fq.shape
    dv = v.shape[-1]
    dtype, device = v.dtype, v.device
    c = max(1, min(chunk, t))
    nc = -(-t // c)
    pad = nc * c - t
    if m is None:
        m = torch.ones(1, 1, t, dtype=dtype, device=device)
        vm = v
    else:
        vm = hide(v, m)
    mh = m.shape[1]
    va = torch.cat([vm, m[..., None].expand(b, h, t, 1)], dim=-1)          # (B, H, T, Dv + 1)
    if pad:
        fq = torch.nn.functional.pad(fq, (0, 0, 0, pad))
        fk = torch.nn.functional.pad(fk, (0, 0, 0, pad))
        va = torch.nn.functional.pad(va, (0, 0, 0, pad))
        m = torch.nn.functional.pad(m, (0, pad))
    fq = fq.reshape(b, h, nc, c, f)
    fk = fk.reshape(b, h, nc, c, f)
    va = va.reshape(b, h, nc, c, dv + 1)
    m = m.reshape(m.shape[0], mh, nc, c)

    w = torch.tril(fq @ fk.transpose(-2, -1))                              # (B, H, N, C, C)
    kva = fk.transpose(-2, -1) @ va                                        # (B, H, N, F, Dv+1) per chunk
    cnt = m.sum(-1)                                                        # (B, H|1, N)
    if kva.requires_grad:   # exclusive prefix sums over the chunks
        kva_in = torch.cat([torch.zeros_like(kva[:, :, :1]), kva[:, :, :-1].cumsum(2)], dim=2)
    else:
        kva_in = torch.empty_like(kva)
        kva_in[:, :, 0] = 0
        kva_in[:, :, 1:] = kva[:, :, :-1].cumsum(2)
    cnt_in = cnt.cumsum(2) - cnt
    if sums0 is not None:
        kva0 = torch.cat([sums0.kv, sums0.k[..., None]], dim=-1)
        kva_in = kva_in + kva0[:, :, None]
        cnt_in = cnt_in + sums0.n[:, :, None]
    out = (fq @ kva_in).add_(w @ va)                                       # (B, H, N, C, Dv+1)
    n = (torch.cumsum(m, -1) + cnt_in[..., None])[..., None].expand(b, h, nc, c, 1)
    vsum = None
    if need_vsum:
        vs = va[..., :dv].cumsum(-2)                                       # inclusive, inside a chunk
        vtot = vs[..., -1, :]
        vs_in = vtot.cumsum(2) - vtot
        if sums0 is not None:
            vs_in = vs_in + sums0.v[:, :, None]
        vsum = vs + vs_in[..., None, :]

    def rows(x):
        return x.reshape(b, h, nc * c, x.shape[-1])[:, :, :t]

    total = kva_in[:, :, -1] + kva[:, :, -1]
    if need_vsum:
        vlast = vs_in[:, :, -1] + vtot[:, :, -1]
    else:   # the methods that skip vsum never read it
        vlast = torch.zeros(b, h, dv, dtype=dtype, device=device)
    last = Sums(total[..., :dv], total[..., dv], vlast, (cnt_in[:, :, -1] + cnt[:, :, -1]).expand(b, h))
    return (rows(out[..., :dv]), rows(out[..., dv:]), None if vsum is None else rows(vsum), rows(n)), last


def dense(fq, fk, v, visible, key_shift=None):
    """The quadratic form: ``W = phi(Q) phi(K)^T`` on ``visible`` ``(B, H, Lq, Lk)`` (bool);
    used for masks that vary over queries. ``O(Lq Lk)`` memory. With per-key log scales
    ``key_shift`` ``(B, H, Lk, 1)`` (key ``j`` is ``fk_j e^{shift_j}``) each query is computed in
    the units of the largest key it sees. Returns ``((num, den, vsum, n), shift)``: the
    sums and their per-query log scale ``(B, H, Lq, 1)`` (None without ``key_shift``)."""
    w = fq @ fk.transpose(-2, -1)
    shift = None
    if key_shift is not None:
        s = _visible_shifts(key_shift[..., 0][..., None, :].expand(w.shape), visible)
        shift = s.amax(-1, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        w = w * torch.exp((s - shift).clamp_max(0.0))
    w = torch.where(visible, w, torch.zeros((), dtype=w.dtype, device=w.device))
    v = hide(v, visible.any(-2).to(v.dtype))
    vis = visible.to(v.dtype)
    return (w @ v, w.sum(-1, keepdim=True), vis @ v, vis.sum(-1, keepdim=True)), shift
