r"""Triton kernels of fused attention: one template per family, the normalizer's pieces inlined.

Forward (:func:`_fwd`, one program per query block and head): the score tile
``x = q k^T * scale (+ additive mask)``, visibility from causal masking (end-aligned),
a bool or additive mask and document ids, then per family

* ``softmax_of`` (``FAMILY=0``): ``z = g(x)``, online rescaling of ``sum e^{z-m}`` and
  ``sum e^{z-m} v`` (Milakov & Gimelshein 2018, arXiv 1805.02867; FlashAttention-2,
  Dao 2023, arXiv 2307.08691); saves ``m`` and ``log l`` per row apart, and the backward
  forms ``p = e^{(z - m) - log l}``: ``z - m`` is exact, where ``z - (m + log l)`` would
  lose ``log l`` to the rounding of ``m`` on rows of large scores (a ``-1e30`` or
  ``finfo.min`` additive mask: a fully masked row would get weights 1 instead of ``1/n``);
* ``sum_normalized`` (``FAMILY=1``): plain sums of ``h(x)`` and ``h(x) v``; saves the
  denominator ``sum h + eps``;
* signed ``sum_normalized`` (``FAMILY=2``, softpick): ``a = h(x; c)`` with the row shift
  ``c = max(m, 0)`` of the running maximum ``m`` of ``x``; the sums rescale by
  ``e^{c_old - c_new}``; ``den = sum |a| + eps e^{m - c}``; the key attaining ``m`` is
  kept (its index, not its value, which a recomputed tile may round differently), because
  ``m`` enters the denominator; tied maxima send that gradient to the first of them
  (``torch.amax`` splits it between them);
* ``elementwise`` (``FAMILY=3``): ``sum h(x) v``.

The threshold family (:func:`_fwd_threshold`, ``FAMILY=4`` in the backward) finds per
query block ``tau`` with ``sum_j [u z_j - tau]_+^{1/u} = 1`` (``u = alpha - 1``), by
Newton steps over the key tiles, in coordinates shifted by the row maximum ``m`` of ``z``
(``tau' = tau - u m``, so that ``u (z - m) - tau'`` is exact at large scores such as a
``-1e30`` additive mask, where ``u z - tau`` would cancel), kept inside a bisection bracket
``[-1, -n^{-u}]`` and started at its left end (where Newton on this convex decreasing
function does not overshoot), as AdaSplash does with Halley steps (Gonçalves, Treviso &
Martins 2025, arXiv 2502.12082); then ``out = sum p v``, ``S = sum s`` and ``sum s v`` with
``s = p^{2 - alpha}``, for the closed-form backward on the support (Peters, Niculae &
Martins 2019, arXiv 1905.05702).

Backward (:func:`_bwd_kv` over key blocks, :func:`_bwd_q` over query blocks, as
FlashAttention-2): recompute the tile, ``dp = dO v^T``, then :func:`_tile_grads` gives the
weights ``p``, the gradient ``gz`` in the piece's output and ``dx = gz * piece'(x)``;
``dv = p^T dO``, ``dk = scale dx^T q``, ``dq = scale dx k``, and the per-head parameters
get ``sum gz * d piece / d theta`` (one partial sum per query block, reduced in torch).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in float32 (``UPCAST``: operands first cast to float32, for Triton's
    interpreter, whose bfloat16 products are wrong in triton 3.9)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


@triton.jit
def _scores(a, b, scale, add, vis, MASK_KIND: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """The score tile ``a @ b * scale`` (+ the additive mask), 0 at invisible entries."""
    x = _dot(a, b, PREC, UPCAST) * scale
    if MASK_KIND == 2:
        x = x + add
    return tl.where(vis, x, 0.0)


@triton.jit
def _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DOCS: tl.constexpr):
    """Visible entries of the tile (rows ``offs_m``, columns ``offs_n``) and the additive mask."""
    vis = (offs_m[:, None] < Lq) & (offs_n[None, :] < Lk)
    if CAUSAL:
        vis = vis & (offs_n[None, :] <= offs_m[:, None] + (Lk - Lq))
    add = tl.zeros([offs_m.shape[0], offs_n.shape[0]], tl.float32)
    if MASK_KIND != 0:
        ptrs = MASK + b * smb + h * smh + offs_m[:, None] * smm + offs_n[None, :] * smn
        if MASK_KIND == 1:
            vis = vis & (tl.load(ptrs, mask=vis, other=0) != 0)
        else:
            add = tl.load(ptrs, mask=vis, other=0.0).to(tl.float32)
            vis = vis & (add != float("-inf"))
            add = tl.where(vis, add, 0.0)
    if DOCS:
        qd = tl.load(QDOC + b * sdq + offs_m, mask=offs_m < Lq, other=-1)
        kd = tl.load(KDOC + b * sdk + offs_n, mask=offs_n < Lk, other=-2)
        vis = vis & (qd[:, None] == kd[None, :])
    return vis, add


@triton.jit
def _nan_count(x, vis):
    """Visible NaN scores per row. The kernels' maxima drop NaN (``tl.maximum`` and ``tl.max``
    return the other operand, as the hardware's ``max``), so a row holding one is marked
    here and written as NaN at the end, as the dense reference gives it."""
    return tl.sum((vis & (x != x)).to(tl.int32), 1)


@triton.jit
def _row_count(CNT, bh, offs_m, Lq, Lk, HAS_CNT: tl.constexpr, CAUSAL: tl.constexpr):
    """``n`` per query row (at least 1): precomputed, or the closed form without masks."""
    if HAS_CNT:
        n = tl.load(CNT + bh * Lq + offs_m, mask=offs_m < Lq, other=1.0)
    elif CAUSAL:
        n = tl.minimum(tl.maximum(offs_m + (Lk - Lq) + 1, 0), Lk).to(tl.float32)
    else:
        n = tl.zeros([offs_m.shape[0]], tl.float32) + Lk
    return tl.maximum(n, 1.0)


@triton.jit
def _held(z):
    """``z = g(x)`` at a visible score, held at float32's lowest value where ``g`` overflowed to
    ``-inf`` (a ``finfo.min`` mask fill under SSMax's ``s log n`` or a slope above 1): a row all
    of whose scores overflowed gets equal weights on them, as the dense path, not zeros (as
    ``_g_held`` on CPU); and at its largest where ``g`` overflowed to ``+inf`` (MultiMax's
    ``t3 > 0`` on such a fill): those entries share the row's weight, as softmax gives ``+inf``
    entries, not ``inf - inf = NaN``. NaN stays NaN."""
    big = 3.4028234663852886e38
    return tl.where(z == float("-inf"), -big, tl.where(z == float("inf"), big, z))


@triton.jit
def _score_at_peak(x, z, z_max, m_i, x_ref, vis):
    """The score ``x`` where ``z = g(x)`` peaks in the row, updated by one tile (``z_max`` its
    row maxima, ``m_i`` the running ones): the reference of the parameter gradients, whose rows
    take out the piece's derivative there. ``g`` need not be monotone (MultiMax), so the peak of
    ``z`` need not be at the largest score, and the key of the largest weight is the one whose
    term cancels."""
    top = tl.max(tl.where(vis & (z == z_max[:, None]), x, float("-inf")), 1)
    return tl.where(z_max > m_i, top, x_ref)


@triton.jit
def _powers(base, u, ALPHA_KIND: tl.constexpr):
    """``p = base^{1/u}`` and ``s = base^{1/u - 1}`` on the support (``base > 0``), 0 elsewhere."""
    pos = base > 0
    if ALPHA_KIND == 1:  # alpha = 2
        p = base
        s = tl.where(pos, 1.0, 0.0)
    elif ALPHA_KIND == 2:  # alpha = 1.5
        p = base * base
        s = base
    else:
        lb = tl.log2(tl.where(pos, base, 1.0))
        p = tl.where(pos, tl.exp2(lb / u), 0.0)
        s = tl.where(pos, tl.exp2(lb * (1.0 / u - 1.0)), 0.0)
    return p, s


@triton.jit
def _tile_grads(x, vis, cols, n, par, s0, s1, s2, s3, dp, delta, u, FN, DFN,
                FAMILY: tl.constexpr, ALPHA_KIND: tl.constexpr):
    """Weights ``p``, the gradient ``gz`` in the piece's output and ``dx`` on a tile.

    ``s0..s3`` are the saved row statistics (``softmax_of``: ``m``, ``log l``; threshold:
    ``tau - u m``, ``sum s``, ``m`` in ``s3``) and ``delta`` the row term of the backward,
    already broadcast to the tile (rows along either axis)."""
    if FAMILY == 0:
        # an entry whose g was held (see _held) has weight 0 unless its whole row was held, where the
        # dense path (float64 there) gives g'(x) p (dp - D); g' may overflow where p = 0
        p = tl.where(vis, tl.exp((_held(FN(x, n, par)) - s0) - s1), 0.0)
        gz = p * (dp - delta)
        dx = tl.where(p > 0, gz * DFN(x, n, par), 0.0)
    elif FAMILY == 1:
        inv = tl.where(s0 > 0, 1.0 / s0, 0.0)
        f = FN(x, n, par)
        p = tl.where(vis, f * inv, 0.0)
        gz = tl.where(vis, (dp - delta) * inv, 0.0)
        dx = gz * DFN(x, n, par)
    elif FAMILY == 2:
        inv = tl.where(s0 > 0, 1.0 / s0, 0.0)
        a = FN(x, s1, n, par)
        pos = a > 0
        p = tl.where(vis & pos, a * inv, 0.0)
        sign = tl.where(pos, 1.0, tl.where(a < 0, -1.0, 0.0))
        gz = tl.where(vis, (tl.where(pos, dp, 0.0) - sign * delta) * inv, 0.0)
        dx = gz * DFN(x, s1, n, par) + tl.where(vis & (cols == s2), -delta * inv * s3, 0.0)
    elif FAMILY == 3:
        p = tl.where(vis, FN(x, n, par), 0.0)
        gz = tl.where(vis, dp, 0.0)
        dx = gz * DFN(x, n, par)
    else:
        base = tl.where(vis, tl.maximum(u * (_held(FN(x, n, par)) - s3) - s0, 0.0), 0.0)
        p, s = _powers(base, u, ALPHA_KIND)
        gz = s * (dp - delta)
        dx = tl.where(s > 0, gz * DFN(x, n, par), 0.0)   # (as softmax_of: held entries off the support)
    return p, gz, dx


@triton.jit
def _fwd(Q, K, V, O, STATS, PAR, CNT, MASK, QDOC, KDOC,
         smb, smh, smm, smn, sdq, sdk,
         H, G, Lq, Lk, D, DV, NP, scale, eps,
         FN: tl.constexpr, FAMILY: tl.constexpr, HAS_CNT: tl.constexpr, CAUSAL: tl.constexpr,
         MASK_KIND: tl.constexpr, DOCS: tl.constexpr, P_LOWP: tl.constexpr, SKIP: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
         DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // G
    kvh = b * (H // G) + hk
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < Lq
    q = tl.load(Q + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    n = _row_count(CNT, bh, offs_m, Lq, Lk, HAS_CNT, CAUSAL)[:, None]
    par = PAR + bh * NP
    m_i = tl.zeros([BLOCK_M], tl.float32) + float("-inf")
    l_i = tl.zeros([BLOCK_M], tl.float32)
    arg = tl.zeros([BLOCK_M], tl.float32) - 1.0
    x_ref = tl.zeros([BLOCK_M], tl.float32) + float("-inf")
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    nan_seen = tl.zeros([BLOCK_M], tl.int32)
    hi = Lk
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Lk, (pid_m + 1) * BLOCK_M + Lk - Lq), 0)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < Lk
        vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                               CAUSAL, MASK_KIND, DOCS)
        live = True
        if SKIP:  # a tile that masks or document ids hide entirely adds nothing
            live = tl.max(tl.max(vis.to(tl.int32), 1), 0) > 0
        if live:
            kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                         mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0)
            v = tl.load(V + (kvh * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
                        mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
            x = _scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST)
            if FAMILY != 0:   # (exp propagates a NaN score by itself; relu and max drop it)
                nan_seen += _nan_count(x, vis)
                x = tl.where(x == x, x, 0.0)   # the row is NaN; its other steps must not trip on it
            if FAMILY == 0:
                z = tl.where(vis, _held(FN(x, n, par)), float("-inf"))
                z_max = tl.max(z, 1)
                x_ref = _score_at_peak(x, z, z_max, m_i, x_ref, vis)
                m_new = tl.maximum(m_i, z_max)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                w = tl.exp(z - m_safe[:, None])
                rescale = tl.exp(m_i - m_safe)
                l_i = l_i * rescale + tl.sum(w, 1)
                acc = acc * rescale[:, None]
                m_i = m_new
            elif FAMILY == 2:
                xm = tl.where(vis, x, float("-inf"))
                tmax = tl.max(xm, 1)
                targ = (start_n + tl.argmax(xm, 1)).to(tl.float32)
                arg = tl.where(tmax > m_i, targ, arg)
                m_new = tl.maximum(m_i, tmax)
                c_old = tl.maximum(m_i, 0.0)
                c_new = tl.maximum(m_new, 0.0)
                rescale = tl.exp(c_old - c_new)
                a = tl.where(vis, FN(x, c_new[:, None], n, par), 0.0)
                l_i = l_i * rescale + tl.sum(tl.abs(a), 1)
                acc = acc * rescale[:, None]
                w = tl.maximum(a, 0.0)
                m_i = m_new
            else:
                w = tl.where(vis, FN(x, n, par), 0.0)
                if FAMILY == 1:
                    l_i = l_i + tl.sum(w, 1)
            if P_LOWP:
                acc += _dot(w.to(v.dtype), v, DOT_PREC, UPCAST)
            else:
                acc += _dot(w, v.to(tl.float32), DOT_PREC, UPCAST)
    st = STATS + (bh * Lq + offs_m) * 4
    if FAMILY == 0:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        # m and log l apart (see the module docstring); a row without weight: m = inf, p = 0
        tl.store(st, tl.where(l_i > 0, m_i, float("inf")), mask=row_ok)
        tl.store(st + 1, tl.log(tl.where(l_i > 0, l_i, 1.0)), mask=row_ok)
        tl.store(st + 2, tl.where(x_ref > float("-inf"), x_ref, 0.0), mask=row_ok)
    elif FAMILY == 1:
        den = l_i + eps
        out = acc / tl.where(den > 0, den, 1.0)[:, None]
        tl.store(st, den, mask=row_ok)
    elif FAMILY == 2:
        c = tl.maximum(m_i, 0.0)
        extra = tl.where(m_i > float("-inf"), eps * tl.exp(m_i - c), 0.0)
        den = l_i + extra
        out = acc / tl.where(den > 0, den, 1.0)[:, None]
        tl.store(st, den, mask=row_ok)
        tl.store(st + 1, c, mask=row_ok)
        tl.store(st + 2, arg, mask=row_ok)
        tl.store(st + 3, extra, mask=row_ok)
    else:
        out = acc
    out = tl.where(nan_seen[:, None] > 0, float("nan"), out)
    tl.store(O + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _fwd_threshold(Q, K, V, O, STATS, SV, PAR, CNT, MASK, QDOC, KDOC,
                   smb, smh, smm, smn, sdq, sdk,
                   H, G, Lq, Lk, D, DV, NP, scale, u, tol,
                   FN: tl.constexpr, ALPHA_KIND: tl.constexpr, MAX_ITER: tl.constexpr, HAS_CNT: tl.constexpr,
                   CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DOCS: tl.constexpr, P_LOWP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = b * (H // G) + h // G
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < Lq
    q = tl.load(Q + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    n1 = _row_count(CNT, bh, offs_m, Lq, Lk, HAS_CNT, CAUSAL)
    n = n1[:, None]
    par = PAR + bh * NP
    hi_n = Lk
    if CAUSAL:
        hi_n = tl.maximum(tl.minimum(Lk, (pid_m + 1) * BLOCK_M + Lk - Lq), 0)
    # the row maximum of z = g(x) over visible keys (and the score there, the parameter gradient's reference)
    m_i = tl.zeros([BLOCK_M], tl.float32) + float("-inf")
    x_ref = tl.zeros([BLOCK_M], tl.float32) + float("-inf")
    seen = tl.zeros([BLOCK_M], tl.float32)   # visible keys: the bracket's end (n may be the user's)
    nan_seen = tl.zeros([BLOCK_M], tl.int32)
    for start_n in range(0, hi_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                     mask=(offs_n[None, :] < Lk) & (offs_d[:, None] < D), other=0.0)
        vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                               CAUSAL, MASK_KIND, DOCS)
        x = _scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST)
        nan_seen += _nan_count(x, vis)
        x = tl.where(x == x, x, 0.0)
        z = tl.where(vis, _held(FN(x, n, par)), float("-inf"))
        z_max = tl.max(z, 1)
        x_ref = _score_at_peak(x, z, z_max, m_i, x_ref, vis)
        m_i = tl.maximum(m_i, z_max)
        seen += tl.sum(vis.to(tl.float32), 1)
    empty = m_i == float("-inf")
    m_s = tl.where(empty, 0.0, m_i)
    # tau shifted by u m (see the module docstring): base = u (z - m) - tau, exact at large scores
    lo = tl.zeros([BLOCK_M], tl.float32) - 1.0
    hi = -tl.exp2(-u * tl.log2(tl.maximum(seen, 1.0)))
    tau = lo
    it = tl.zeros((), tl.int32)
    go = it < MAX_ITER
    while go:
        fsum = tl.zeros([BLOCK_M], tl.float32)
        ssum = tl.zeros([BLOCK_M], tl.float32)
        for start_n in range(0, hi_n, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                         mask=(offs_n[None, :] < Lk) & (offs_d[:, None] < D), other=0.0)
            vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                                   CAUSAL, MASK_KIND, DOCS)
            x = _scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST)
            x = tl.where(x == x, x, 0.0)
            base = tl.where(vis, tl.maximum(u * (_held(FN(x, n, par)) - m_s[:, None]) - tau[:, None], 0.0), 0.0)
            p, s = _powers(base, u, ALPHA_KIND)
            fsum += tl.sum(p, 1)
            ssum += tl.sum(s, 1)
        f = fsum - 1.0
        lo = tl.where(f >= 0, tau, lo)
        hi = tl.where(f < 0, tau, hi)
        newton = tau + u * f / tl.where(ssum > 0, ssum, 1.0)
        ok = (ssum > 0) & (newton >= lo) & (newton <= hi)
        new_tau = tl.where(ok, newton, 0.5 * (lo + hi))
        step = tl.where(empty | (offs_m >= Lq), 0.0, tl.abs(new_tau - tau) - tol * (1.0 + tl.abs(tau)))
        tau = new_tau
        it += 1
        go = (tl.max(step, 0) > 0) & (it < MAX_ITER)
    tau = tl.where(empty, float("inf"), tau)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    acc_s = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    s_tot = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, hi_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < Lk
        kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                     mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        v = tl.load(V + (kvh * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
                    mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                               CAUSAL, MASK_KIND, DOCS)
        x = _scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST)
        x = tl.where(x == x, x, 0.0)
        base = tl.where(vis, tl.maximum(u * (_held(FN(x, n, par)) - m_s[:, None]) - tau[:, None], 0.0), 0.0)
        if tl.max(tl.max(base, 1), 0) > 0:  # a key tile outside every row's support adds nothing
            p, s = _powers(base, u, ALPHA_KIND)
            s_tot += tl.sum(s, 1)
            if P_LOWP:
                acc += _dot(p.to(v.dtype), v, DOT_PREC, UPCAST)
            else:
                acc += _dot(p, v.to(tl.float32), DOT_PREC, UPCAST)
            acc_s += _dot(s, v.to(tl.float32), DOT_PREC, UPCAST)
    st = STATS + (bh * Lq + offs_m) * 4
    tl.store(st, tau, mask=row_ok)
    tl.store(st + 1, s_tot, mask=row_ok)
    tl.store(st + 2, tl.where(x_ref > float("-inf"), x_ref, 0.0), mask=row_ok)
    tl.store(st + 3, m_s, mask=row_ok)
    out_mask = row_ok[:, None] & (offs_dv[None, :] < DV)
    acc = tl.where(nan_seen[:, None] > 0, float("nan"), acc)
    tl.store(O + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :], acc.to(O.dtype.element_ty), mask=out_mask)
    tl.store(SV + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :], acc_s, mask=out_mask)


@triton.jit
def _bwd_kv(Q, K, V, DO, STATS, DELTA, PAR, CNT, MASK, QDOC, KDOC, DK, DV_OUT,
            smb, smh, smm, smn, sdq, sdk,
            H, G, Lq, Lk, D, DV, NP, scale, u,
            FN: tl.constexpr, DFN: tl.constexpr, FAMILY: tl.constexpr, ALPHA_KIND: tl.constexpr, HAS_CNT: tl.constexpr,
            CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DOCS: tl.constexpr, P_LOWP: tl.constexpr,
            SKIP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_DV: tl.constexpr,
            DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``dk``, ``dv`` of one key block for one query head (GQA groups are summed in torch)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = b * (H // G) + h // G
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < Lk
    kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                 mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0)
    v = tl.load(V + (kvh * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
                mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    par = PAR + bh * NP
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    lo = 0
    if CAUSAL:
        lo = (tl.maximum(pid_n * BLOCK_N - (Lk - Lq), 0) // BLOCK_M) * BLOCK_M
    for start_m in range(lo, Lq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Lq
        vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                               CAUSAL, MASK_KIND, DOCS)
        live = True
        if SKIP:
            live = tl.max(tl.max(vis.to(tl.int32), 1), 0) > 0
        if live:
            q = tl.load(Q + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :],
                        mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
            do = tl.load(DO + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :],
                         mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
            st = STATS + (bh * Lq + offs_m) * 4
            s0 = tl.load(st, mask=row_ok, other=0.0)[None, :]
            s1 = tl.load(st + 1, mask=row_ok, other=0.0)[None, :]
            s2 = tl.load(st + 2, mask=row_ok, other=0.0)[None, :]
            s3 = tl.load(st + 3, mask=row_ok, other=0.0)[None, :]
            delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)[None, :]
            n = _row_count(CNT, bh, offs_m, Lq, Lk, HAS_CNT, CAUSAL)[None, :]
            vis_t = tl.trans(vis)
            # q k^T with k^T loaded as the forward loads it, then transposed: k q^T (or q times
            # a transposed view of k, which a BLAS may sum in another order: Triton's interpreter
            # on OpenBLAS's AVX-512 kernels) rounds scores differently, and a piece with a steep
            # g (MultiMax's quadratic term at large scores) turns that into weights that differ
            # from the forward's
            x = tl.trans(_scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST))
            dp = _dot(v, tl.trans(do), DOT_PREC, UPCAST).to(tl.float32)
            p, gz, dx = _tile_grads(x, vis_t, offs_n[:, None], n, par, s0, s1, s2, s3, dp, delta, u, FN, DFN,
                                    FAMILY, ALPHA_KIND)
            if P_LOWP:
                dv += _dot(p.to(do.dtype), do, DOT_PREC, UPCAST)
                dk += _dot(dx.to(q.dtype), q, DOT_PREC, UPCAST)
            else:
                dv += _dot(p, do.to(tl.float32), DOT_PREC, UPCAST)
                dk += _dot(dx, q.to(tl.float32), DOT_PREC, UPCAST)
    mask_k = col_ok[:, None] & (offs_d[None, :] < D)
    tl.store(DK + (bh * Lk + offs_n[:, None]) * D + offs_d[None, :], dk * scale, mask=mask_k)
    tl.store(DV_OUT + (bh * Lk + offs_n[:, None]) * DV + offs_dv[None, :], dv,
             mask=col_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _bwd_q(Q, K, V, DO, STATS, DELTA, PAR, CNT, MASK, QDOC, KDOC, DQ, DPAR,
           smb, smh, smm, smn, sdq, sdk,
           H, G, Lq, Lk, D, DV, NP: tl.constexpr, scale, u, eps,
           FN: tl.constexpr, DFN: tl.constexpr, DPFN: tl.constexpr, FAMILY: tl.constexpr,
           ALPHA_KIND: tl.constexpr, HAS_CNT: tl.constexpr,
           CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DOCS: tl.constexpr, P_LOWP: tl.constexpr,
           PGRAD: tl.constexpr, ROW_DELTA: tl.constexpr, SKIP: tl.constexpr,
           BLOCK_P: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
           DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``dq`` of one query block, and its partial sums of the parameter gradients (``ROW_DELTA``:
    first ``delta = sum_j p_j dp_j``, written for :func:`_bwd_kv`, which then runs after it)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = b * (H // G) + h // G
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < Lq
    q = tl.load(Q + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    st = STATS + (bh * Lq + offs_m) * 4
    s0 = tl.load(st, mask=row_ok, other=0.0)[:, None]
    s1 = tl.load(st + 1, mask=row_ok, other=0.0)[:, None]
    s2 = tl.load(st + 2, mask=row_ok, other=0.0)[:, None]
    s3 = tl.load(st + 3, mask=row_ok, other=0.0)[:, None]
    n = _row_count(CNT, bh, offs_m, Lq, Lk, HAS_CNT, CAUSAL)[:, None]
    par = PAR + bh * NP
    offs_p = tl.arange(0, BLOCK_P)
    dpar = tl.zeros([BLOCK_P], tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = Lk
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Lk, (pid_m + 1) * BLOCK_M + Lk - Lq), 0)
    if ROW_DELTA:
        # sum_normalized: the denominator and delta = sum_j p_j dp_j again from the scores as
        # this backward recomputes them, so that 1 - sum_j p_j = eps / den holds for them: a row
        # with little mass (den close to eps) cancels dp_j - delta, and a denominator from the
        # forward's scores (rounded differently) would leave an error of order ulp / eps
        den_b = tl.zeros([BLOCK_M], tl.float32)
        acc_delta = tl.zeros([BLOCK_M], tl.float32)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            col_ok = offs_n < Lk
            vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                                   CAUSAL, MASK_KIND, DOCS)
            live = True
            if SKIP:
                live = tl.max(tl.max(vis.to(tl.int32), 1), 0) > 0
            if live:
                kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                             mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0)
                vt = tl.load(V + (kvh * Lk + offs_n[None, :]) * DV + offs_dv[:, None],
                             mask=col_ok[None, :] & (offs_dv[:, None] < DV), other=0.0)
                x = _scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST)
                dp = _dot(do, vt, DOT_PREC, UPCAST).to(tl.float32)
                if FAMILY == 1:
                    w = tl.where(vis, FN(x, n, par), 0.0)
                    den_b += tl.sum(w, 1)
                else:
                    a = tl.where(vis, FN(x, s1, n, par), 0.0)
                    w = tl.maximum(a, 0.0)
                    den_b += tl.sum(tl.abs(a), 1)
                acc_delta += tl.sum(w * dp, 1)
        if FAMILY == 1:
            den_b += eps
        else:
            den_b += s3.reshape([BLOCK_M])
        delta1 = acc_delta / tl.where(den_b > 0, den_b, 1.0)
        tl.store(DELTA + bh * Lq + offs_m, delta1, mask=row_ok)
        tl.store(st, den_b, mask=row_ok)
        delta = delta1[:, None]
        s0 = den_b[:, None]
    else:
        delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)[:, None]
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < Lk
        vis, add = _visibility(offs_m, offs_n, Lq, Lk, b, h, MASK, smb, smh, smm, smn, QDOC, KDOC, sdq, sdk,
                               CAUSAL, MASK_KIND, DOCS)
        live = True
        if SKIP:
            live = tl.max(tl.max(vis.to(tl.int32), 1), 0) > 0
        if live:
            kt = tl.load(K + (kvh * Lk + offs_n[None, :]) * D + offs_d[:, None],
                         mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0)
            vt = tl.load(V + (kvh * Lk + offs_n[None, :]) * DV + offs_dv[:, None],
                         mask=col_ok[None, :] & (offs_dv[:, None] < DV), other=0.0)
            x = _scores(q, kt, scale, add, vis, MASK_KIND, DOT_PREC, UPCAST)   # as the forward's
            dp = _dot(do, vt, DOT_PREC, UPCAST).to(tl.float32)
            p, gz, dx = _tile_grads(x, vis, offs_n[None, :], n, par, s0, s1, s2, s3, dp, delta, u, FN, DFN,
                                    FAMILY, ALPHA_KIND)
            k = tl.trans(kt)
            if P_LOWP:
                dq += _dot(dx.to(k.dtype), k, DOT_PREC, UPCAST)
            else:
                dq += _dot(dx, k.to(tl.float32), DOT_PREC, UPCAST)
            if PGRAD:
                for kk in tl.static_range(NP):
                    dpiece = DPFN(x, n, par, kk)
                    if (FAMILY == 0) or (FAMILY == 4):
                        # rows sum to one, so sum_j gz_j = 0 and a per-row constant can be taken
                        # out: the piece's derivative at the score where z peaks (the largest weight),
                        # against cancellation
                        dpiece = dpiece - DPFN(s2 + tl.zeros(x.shape, tl.float32), n, par, kk)
                    # keys without weight (gz = 0) out by a select: at a finfo.min fill the piece's
                    # derivative overflows, and 0 * inf = NaN
                    term = tl.sum(tl.sum(tl.where(vis & (gz != 0.0), gz * dpiece, 0.0), 1), 0)
                    dpar += tl.where(offs_p == kk, term, 0.0)
    tl.store(DQ + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :], dq * scale,
             mask=row_ok[:, None] & (offs_d[None, :] < D))
    if PGRAD:
        tl.store(DPAR + (pid_m * tl.num_programs(1) + bh) * NP + offs_p, dpar, mask=offs_p < NP)
