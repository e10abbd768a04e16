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


def causal_chunked(fq, fk, v, m, sums0: Sums | None = None, chunk: int = DEFAULT_CHUNK):
    """Causal sums for ``T`` queries against the ``T`` keys at the same positions (query
    ``t`` sees keys ``<= t``) after the keys already summed in ``sums0``.

    ``fq`` ``(B, H, T, F)``, ``fk`` ``(B, H, T, F)`` (zero on invisible keys), ``v``
    ``(B, H, T, Dv)``, ``m`` ``(B, H|1, T)`` float or None. Returns
    ``(num, den, vsum, n)`` per query and the :class:`Sums` after the last key.
    """
    b, h, t, f = fq.shape
    dv = v.shape[-1]
    dtype, device = v.dtype, v.device
    c = max(1, min(chunk, t))
    nc = -(-t // c)
    pad = nc * c - t
    if m is None:
        m = torch.ones(1, 1, t, dtype=dtype, device=device)
    mh = m.shape[1]
    if pad:
        fq = torch.nn.functional.pad(fq, (0, 0, 0, pad))
        fk = torch.nn.functional.pad(fk, (0, 0, 0, pad))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
        m = torch.nn.functional.pad(m, (0, pad))
    fq = fq.reshape(b, h, nc, c, f)
    fk = fk.reshape(b, h, nc, c, f)
    v = v.reshape(b, h, nc, c, dv)
    m = m.reshape(m.shape[0], mh, nc, c)
    vm = v * m[..., None]
    tril = torch.ones(c, c, dtype=dtype, device=device).tril()

    w = (fq @ fk.transpose(-2, -1)) * tril                      # (B, H, N, C, C)
    num = w @ vm
    den = w.sum(-1, keepdim=True)
    vsum = tril @ vm
    n = (m @ tril.T)[..., None]                                 # (B, H|1, N, C, 1)

    kv = fk.transpose(-2, -1) @ vm                              # (B, H, N, F, Dv) per chunk
    kz = fk.sum(-2)                                             # (B, H, N, F)
    vs = vm.sum(-2)                                             # (B, H, N, Dv)
    cnt = m.sum(-1)                                             # (B, H|1, N)
    kv_in = kv.cumsum(2) - kv                                   # exclusive prefix sums
    kz_in = kz.cumsum(2) - kz
    vs_in = vs.cumsum(2) - vs
    cnt_in = cnt.cumsum(2) - cnt
    if sums0 is not None:
        kv_in = kv_in + sums0.kv[:, :, None]
        kz_in = kz_in + sums0.k[:, :, None]
        vs_in = vs_in + sums0.v[:, :, None]
        cnt_in = cnt_in + sums0.n[:, :, None]
    num = num + fq @ kv_in
    den = den + fq @ kz_in[..., None]
    vsum = vsum + vs_in[..., None, :]
    n = n + cnt_in[..., None, None]
    n = n.expand(b, h, nc, c, 1)

    def rows(x):
        return x.reshape(b, h, nc * c, x.shape[-1])[:, :, :t]

    last = Sums(kv_in[:, :, -1] + kv[:, :, -1], kz_in[:, :, -1] + kz[:, :, -1],
                vs_in[:, :, -1] + vs[:, :, -1], (cnt_in[:, :, -1] + cnt[:, :, -1]).expand(b, h))
    return (rows(num), rows(den), rows(vsum), rows(n)), last


def dense(fq, fk, v, visible):
    """The quadratic form: ``W = phi(Q) phi(K)^T`` masked by ``visible`` ``(B, H, Lq, Lk)``
    (bool); used for masks that vary over queries. ``O(Lq Lk)`` memory."""
    vis = visible.to(v.dtype)
    w = (fq @ fk.transpose(-2, -1)) * vis
    return w @ v, w.sum(-1, keepdim=True), vis @ v, vis.sum(-1, keepdim=True)
