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


def align_shift(sums: Sums | None, phi_k: torch.Tensor, shift: torch.Tensor | None):
    """Bring carried ``sums`` and new key features to one common ``shift`` (the larger)."""
    if shift is None or sums is None:
        return sums, phi_k, shift
    if sums.shift is None:
        return sums, phi_k, shift
    common = torch.maximum(sums.shift, shift)
    old = torch.exp(sums.shift - common)
    sums = Sums(sums.kv * old, sums.k * old[..., 0], sums.v, sums.n, common)
    return sums, phi_k * torch.exp(shift - common), common


def one_pass(fq, fk, v, m, sums0: Sums | None = None):
    """Non-causal sums: every query sees every (visible) key. ``fk`` is already zero on
    invisible keys; ``m`` ``(B, H|1, Lk)`` float or None. Returns ``(num, den, vsum, n), Sums``."""
    vm = v if m is None else v * m[..., None]
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
        vm = v * m[..., None]
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


def dense(fq, fk, v, visible):
    """The quadratic form: ``W = phi(Q) phi(K)^T`` masked by ``visible`` ``(B, H, Lq, Lk)``
    (bool); used for masks that vary over queries. ``O(Lq Lk)`` memory."""
    vis = visible.to(v.dtype)
    w = (fq @ fk.transpose(-2, -1)) * vis
    return w @ v, w.sum(-1, keepdim=True), vis @ v, vis.sum(-1, keepdim=True)
