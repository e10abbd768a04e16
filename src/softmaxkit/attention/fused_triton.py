r"""Fused Triton attention for every normalizer that declares Triton pieces, forward and backward.

.. math:: \mathrm{out}_i = \sum_j p_{ij} v_j,\quad
          p_{i\cdot} = \mathrm{normalize}\big(q_i k_\cdot^\top \mathrm{scale} + a_{i\cdot};\ \text{visible}\big)

One kernel template per family of :mod:`softmaxkit.forms` (``softmax_of``,
``sum_normalized`` with softpick's signed variant, ``elementwise``, ``threshold``), with
the normalizer's pieces (``NormalizerSpec.triton``, declared in its own module) inlined;
see :mod:`softmaxkit.kernels.gpu._attention_kernels` for the algorithms (FlashAttention-2, Dao 2023, arXiv
2307.08691; AdaSplash, Gonçalves, Treviso & Martins 2025, arXiv 2502.12082, for the
threshold search). Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``
(the tests). :func:`fallback_reason` says why a call cannot take this path; the caller
then uses the streaming or dense path.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Mapping
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .. import registry
from ..forms import COUNT, SoftmaxOf, SumNormalized, Threshold
from ..kernels.dispatch import ENTMAX_MIN_ALPHA
from .inputs import per_head

FAMILY_CODES = {"softmax_of": 0, "sum_normalized": 1, "elementwise": 3, "threshold": 4}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
#: Newton/bisection passes at most, and the step below which the threshold search stops.
MAX_ITER = 30
TOL = 2.0 ** -22


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreting() -> bool:
    import triton

    return bool(triton.knobs.runtime.interpret)


def pieces_of(spec: registry.NormalizerSpec):
    """The normalizer's :class:`~softmaxkit.kernels.gpu.pieces.TritonPieces` (built once per spec), or ``None``."""
    if spec.triton is None:
        return None
    return _build_pieces(spec.triton)


@functools.cache
def _build_pieces(factory):
    return factory()


#: The smallest alpha the threshold kernel takes, as for the CPU entmax kernels: its weights are
#: ``base^{1/(alpha - 1)}``, which multiplies float32's rounding of ``base`` by ``1 / (alpha - 1)``
#: (at alpha = 1.01 the forward error was 5x the dense path's, which solves in float64); below,
#: the streaming or dense path runs.
MIN_ALPHA = ENTMAX_MIN_ALPHA


def _alpha(form: Threshold, params: Mapping[str, Any]) -> float | None:
    alpha = form.alpha(params)
    if isinstance(alpha, torch.Tensor) or isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        return None
    return float(alpha) if MIN_ALPHA <= alpha <= 2.0 else None


def fallback_reason(spec: registry.NormalizerSpec, params: Mapping[str, Any], q: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why these inputs cannot run the fused Triton kernels (``None``: they can)."""
    if not triton_available():
        return "triton is not installed (pip install softmaxkit[gpu])"
    if not q.is_cuda and not _interpreting():
        return "the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
    form = spec.form
    if spec.triton is None or form is None:
        return f"normalizer {spec.name!r} declares no Triton pieces (NormalizerSpec.triton)"
    if isinstance(form, SoftmaxOf) and form.passes != 1:
        return f"normalizer {spec.name!r} is a {form.passes}-pass softmax_of"
    if spec.stream is not None and not (isinstance(form, SumNormalized) and form.signed):
        return f"normalizer {spec.name!r} streams through its own rule"
    merged = spec.with_defaults(params)
    if isinstance(form, Threshold) and _alpha(form, merged) is None:
        return f"the threshold kernel needs a number alpha with {MIN_ALPHA} <= alpha <= 2"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} (the kernels take float16, bfloat16, float32)"
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return f"head dimension above {MAX_HEAD_DIM}"
    b, h = q.shape[0], q.shape[1]
    pieces = pieces_of(spec)
    values = list(pieces.values(merged))
    for value in values + ([merged[COUNT]] if merged.get(COUNT) is not None else []):
        if isinstance(value, torch.Tensor) and not per_head(value, b, h):
            return "a tensor parameter that varies per query or key"
    if isinstance(form, SumNormalized) and form.signed and any(
            isinstance(val, torch.Tensor) and val.requires_grad for val in values):
        return "learnable parameters of a signed sum_normalized form"
    eps = merged.get("eps") if isinstance(form, SumNormalized) else None
    if isinstance(eps, torch.Tensor) and (eps.numel() != 1 or eps.requires_grad):
        return "the kernels take the sum_normalized eps as a number (not a per-head or learnable tensor)"
    count = merged.get(COUNT)
    if isinstance(count, torch.Tensor) and count.requires_grad:
        return f"a count {COUNT!r} that requires grad (the kernels take it as a constant)"
    return None


# ----------------------------------------------------------------------------------------
# visibility helpers (torch, O(L) or one pass over a mask the caller already holds)
# ----------------------------------------------------------------------------------------

def document_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """Document id of each position of a packed sequence from cumulative lengths ``[0, l1, l1 + l2, ...]``."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != length or bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to the sequence length {length}, got {cu_seqlens.tolist()}")
    pos = torch.arange(length, device=cu_seqlens.device)
    return (torch.searchsorted(cu_seqlens[1:].to(pos.dtype), pos, right=True)).to(torch.int32)


def _check_ids(ids: object, name: str) -> None:
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        kind = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"{name} must be an integer tensor, got {kind}")


def _visible_counts(b, h, lq, lk, is_causal, mask, qdoc, kdoc, device, chunk=1024) -> torch.Tensor:
    """Visible keys per query row, ``(B*H, Lq)`` float32, in chunks of query rows."""
    out = torch.empty(b, h, lq, dtype=torch.float32, device=device)
    cols = torch.arange(lk, device=device)
    for r0 in range(0, lq, chunk):
        r1 = min(r0 + chunk, lq)
        vis = torch.ones(1, 1, r1 - r0, lk, dtype=torch.bool, device=device)
        if is_causal:
            rows = torch.arange(r0, r1, device=device)
            vis = vis & (cols[None, :] <= rows[:, None] + (lk - lq))
        if mask is not None:
            part = mask[..., r0:r1, :]
            vis = vis & (part if part.dtype == torch.bool else part != float("-inf"))
        if qdoc is not None:
            vis = vis & (qdoc[:, None, r0:r1, None] == kdoc[:, None, None, :])
        out[:, :, r0:r1] = vis.sum(-1).to(torch.float32).expand(b, h, r1 - r0)
    return out.reshape(b * h, lq)


def _blocks(lq: int, d: int, interpret: bool, threshold: bool, wide: bool = False) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the forward (``wide``: 4-byte inputs,
    whose tiles take twice the shared memory: at most 64 query rows above ``D = 64``)."""
    if interpret:
        return 16, 16, 1, 1
    if d <= 64:
        bm, bn, warps, stages = 128, 64, 4, 3
    elif d <= 128:
        bm, bn, warps, stages = 128, 64, 8, 2
    else:
        bm, bn, warps, stages = 64, 32, 8, 1
    if threshold or (wide and d > 64):
        bm = min(bm, 64)
    return min(bm, max(16, 1 << max(lq - 1, 0).bit_length())), bn, warps, stages


class _Config(types.SimpleNamespace):
    """Everything the kernels take besides the tensors that receive gradients."""


def _launch_args(c: _Config):
    return {"smb": c.sm[0], "smh": c.sm[1], "smm": c.sm[2], "smn": c.sm[3], "sdq": c.sdq, "sdk": c.sdk,
            "H": c.h, "G": c.groups, "Lq": c.lq, "Lk": c.lk, "D": c.d, "DV": c.dv}


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, par, c: _Config):
        from ..kernels.gpu import _attention_kernels as kern

        b, h, lq, lk, dv = c.b, c.h, c.lq, c.lk, c.dv
        # float16 / bfloat16 with a gradient to come: the kernel writes a float32 output, from which
        # the backward's delta = rowsum(dO * O) is taken (from the rounded output, dq and dk at
        # large scores were up to 1000x the dense path's error); the caller gets it rounded
        wide = c.family in (0, 1, 2) and any(ctx.needs_input_grad[:4])
        out = torch.empty(b, h, lq, dv, dtype=torch.float32 if wide else q.dtype, device=q.device)
        stats = torch.zeros(b * h, lq, 4, dtype=torch.float32, device=q.device)
        bm, bn, warps, stages = c.fwd_blocks
        grid = (triton_cdiv(lq, bm), b * h)
        common = dict(**_launch_args(c), FN=c.pieces.fn, HAS_CNT=c.cnt is not None, CAUSAL=c.causal,
                      MASK_KIND=c.mask_kind, DOCS=c.qdoc is not None, P_LOWP=c.p_lowp, BLOCK_M=bm, BLOCK_N=bn,
                      BLOCK_D=c.block_d, BLOCK_DV=c.block_dv, DOT_PREC=c.dot_prec, UPCAST=c.upcast, num_warps=warps,
                      num_stages=stages)
        sv = torch.zeros(b, h, lq, dv, dtype=torch.float32, device=q.device) if c.family == 4 else None
        if lq and lk:
            if c.family == 4:
                kern._fwd_threshold[grid](q, k, v, out, stats, sv, par, c.cnt_arg, c.mask_arg, c.qdoc_arg,
                                          c.kdoc_arg, NP=c.np, scale=c.scale, u=c.u, tol=TOL,
                                          ALPHA_KIND=c.alpha_kind, MAX_ITER=MAX_ITER, **common)
            else:
                kern._fwd[grid](q, k, v, out, stats, par, c.cnt_arg, c.mask_arg, c.qdoc_arg, c.kdoc_arg,
                                NP=c.np, scale=c.scale, eps=c.eps, FAMILY=c.family, SKIP=c.skip, **common)
        else:
            out.zero_()
        ctx.c = c
        ctx.save_for_backward(q, k, v, par, out if c.family in (0, 1, 2) else None, stats, sv)
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable  # a double backward (create_graph=True) raises instead of giving no gradient
    def backward(ctx, dout):
        from ..kernels.gpu import _attention_kernels as kern

        q, k, v, par, out, stats, sv = ctx.saved_tensors
        c = ctx.c
        b, h, lq, lk, d, dv = c.b, c.h, c.lq, c.lk, c.d, c.dv
        dout = dout.contiguous()
        if c.family == 4:
            s_tot = stats[..., 1].reshape(b, h, lq)
            delta = (dout.float() * sv).sum(-1) / torch.where(s_tot > 0, s_tot, torch.ones_like(s_tot))
        elif c.family == 3:
            delta = torch.zeros(b, h, lq, dtype=torch.float32, device=q.device)
        else:
            delta = (dout.float() * out.float()).sum(-1)
        delta = delta.contiguous()
        dq = torch.zeros(b, h, lq, d, dtype=torch.float32, device=q.device)
        dk = torch.zeros(b, h, lk, d, dtype=torch.float32, device=q.device)
        dvv = torch.zeros(b, h, lk, dv, dtype=torch.float32, device=q.device)
        bm, bn, warps, stages = c.bwd_blocks
        pgrad = bool(ctx.needs_input_grad[3]) and c.np > 0 and c.pieces.dpar is not None
        m_blocks = triton_cdiv(lq, bm)
        dpar = torch.zeros(m_blocks, b * h, max(c.np, 1), dtype=torch.float32, device=q.device)
        if lq and lk:
            common = dict(**_launch_args(c), scale=c.scale, u=c.u, FN=c.pieces.fn, DFN=c.pieces.dfn,
                          FAMILY=c.family, ALPHA_KIND=c.alpha_kind, HAS_CNT=c.cnt is not None, CAUSAL=c.causal,
                          MASK_KIND=c.mask_kind, DOCS=c.qdoc is not None, P_LOWP=c.p_lowp, SKIP=c.skip, BLOCK_M=bm,
                          BLOCK_N=bn, BLOCK_D=c.block_d, BLOCK_DV=c.block_dv, DOT_PREC=c.dot_prec, UPCAST=c.upcast,
                          num_warps=warps, num_stages=stages)
            args = (q, k, v, dout, stats, delta, par, c.cnt_arg, c.mask_arg, c.qdoc_arg, c.kdoc_arg)
            # sum_normalized rows: delta from the keys (see _bwd_q), so dq runs first
            kern._bwd_q[(m_blocks, b * h)](*args, dq, dpar, NP=c.np, DPFN=c.pieces.dpar or c.pieces.dfn,
                                           eps=c.eps, PGRAD=pgrad, ROW_DELTA=c.family in (1, 2),
                                           BLOCK_P=c.block_p, **common)
            kern._bwd_kv[(triton_cdiv(lk, bn), b * h)](*args, dk, dvv, NP=c.np, **common)
        hk = c.hk
        dk = dk.view(b, hk, c.groups, lk, d).sum(2)
        dvv = dvv.view(b, hk, c.groups, lk, dv).sum(2)
        dpar_out = dpar.sum(0)[:, :c.np].to(par.dtype) if pgrad else None
        return dq.to(q.dtype), dk.to(k.dtype), dvv.to(v.dtype), dpar_out, None


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pack(values, b: int, h: int, device) -> torch.Tensor:
    cols = []
    for value in values:
        if isinstance(value, torch.Tensor):
            cols.append(torch.broadcast_to(value.to(device=device, dtype=torch.float32), (b, h, 1, 1)).reshape(b * h))
        else:
            cols.append(torch.full((b * h,), float(value), dtype=torch.float32, device=device))
    if not cols:
        return torch.zeros(b * h, 1, dtype=torch.float32, device=device)
    return torch.stack(cols, -1).contiguous()


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normalizer: str = "softmax",
                    is_causal: bool = False, attn_mask: torch.Tensor | None = None, scale: float | None = None,
                    *, document_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
                    cu_seqlens: torch.Tensor | None = None, low_precision_products: bool | None = None,
                    **params) -> torch.Tensor:
    r"""Attention ``normalize(q k^T * scale + attn_mask) v`` by the fused Triton kernels.

    Same conventions as :func:`softmaxkit.attention` (shapes ``(B, H, L, D)``, GQA with
    ``Hkv | H``, bool or additive ``attn_mask``, end-aligned ``is_causal``, a query with
    no visible key gives 0). Packed variable-length sequences: ``document_ids`` (``(B, L)``
    ints, or a pair for queries and keys: a query sees only keys of its document) or
    ``cu_seqlens`` (cumulative lengths ``[0, l1, l1 + l2, ...]`` over the packed axis,
    ``Lq == Lk``). Differentiable in ``q``, ``k``, ``v`` and per-head tensor parameters.
    ``low_precision_products``: multiply the weights by the values in the input dtype
    (FlashAttention's choice, the default for float16/bfloat16); ``False`` keeps them in
    float32. ``ValueError`` with the reason when the inputs cannot take this path
    (:func:`fallback_reason`).

    FlashAttention-2: Dao (2023), arXiv 2307.08691; the threshold family after AdaSplash,
    Gonçalves, Treviso & Martins (2025), arXiv 2502.12082.
    """
    from .._checks import check_bool, check_finite, check_floating
    from .._rows import compute_dtype
    from .api import validate_params
    from .inputs import check_mask

    spec = registry.get(normalizer)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_floating(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must be a tensor of shape (B, H, L, D), got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, h, lq, d = q.shape
    _, hk, lk, _ = k.shape
    heads_fit = h % hk == 0 if hk else h == 0
    if tuple(k.shape[:3]) != tuple(v.shape[:3]) or k.shape[0] != b or k.shape[-1] != d or not heads_fit:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    check_bool(is_causal, "is_causal")
    if scale is not None:
        check_finite(scale, "scale", allow_tensor=False)
    if low_precision_products is not None:
        check_bool(low_precision_products, "low_precision_products")
    reason = fallback_reason(spec, params, q, k, v)
    if reason is not None:
        raise ValueError(f"the fused Triton path cannot run this call: {reason}")
    if not torch.compiler.is_compiling():  # as sk.attention: the reference checks the parameter values
        validate_params(spec, params, (b, h, lk), compute_dtype(q.dtype), q.device)
    merged = spec.with_defaults(params)
    pieces = pieces_of(spec)
    form = spec.form
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    bool_mask, additive = check_mask(attn_mask, (b, h, lq, lk), q=q)
    if additive is not None and additive.numel() and bool(additive.detach().amax() == float("inf")):
        raise ValueError("attn_mask holds +inf (its key takes the row's whole weight, the limit of the "
                         "definition), which the kernels cannot form; sk.attention computes such masks densely")
    if additive is not None and additive.requires_grad and torch.is_grad_enabled():
        raise ValueError("attn_mask requires grad (a learned additive bias), but the Triton kernels take it as a "
                         "constant; use sk.attention(method='auto' or 'dense'), which differentiate it")
    mask = bool_mask if bool_mask is not None else additive
    qdoc = kdoc = None
    if cu_seqlens is not None and document_ids is not None:
        raise ValueError("give cu_seqlens or document_ids, not both")
    if cu_seqlens is not None:
        _check_ids(cu_seqlens, "cu_seqlens")
        if lq != lk:
            raise ValueError("cu_seqlens needs Lq == Lk (one packed axis)")
        ids = document_ids_from_cu_seqlens(cu_seqlens.to(q.device), lk)
        qdoc = kdoc = ids.expand(b, lk)
    elif document_ids is not None:
        qdoc, kdoc = document_ids if isinstance(document_ids, tuple) else (document_ids, document_ids)
        _check_ids(qdoc, "document_ids")
        _check_ids(kdoc, "document_ids")
        if (qdoc.dim() > 2 or kdoc.dim() > 2 or qdoc.shape[-1] != lq or kdoc.shape[-1] != lk
                or qdoc.numel() not in (lq, b * lq) or kdoc.numel() not in (lk, b * lk)):
            raise ValueError(f"document_ids must have shape (B, Lq) and (B, Lk) (or (Lq,), (Lk,)), got "
                             f"{tuple(qdoc.shape)}, {tuple(kdoc.shape)}")
        # the kernels read a row of ids at stride 1
        qdoc = qdoc.to(q.device, torch.int32).contiguous().expand(b, lq)
        kdoc = kdoc.to(q.device, torch.int32).contiguous().expand(b, lk)
    assert form is not None  # fallback_reason returned None
    family = 2 if isinstance(form, SumNormalized) and form.signed else FAMILY_CODES[form.family]
    needs_n = pieces.uses_n or family == 4
    cnt = None
    if merged.get(COUNT) is not None:
        cnt = torch.broadcast_to(torch.as_tensor(merged[COUNT], dtype=torch.float32, device=q.device),
                                 (b, h, 1, 1)).expand(b, h, lq, 1).reshape(b * h, lq).contiguous()
    elif needs_n and (mask is not None or qdoc is not None):
        cnt = _visible_counts(b, h, lq, lk, is_causal, mask, qdoc, kdoc, q.device)
    if mask is not None and mask.device != q.device:
        mask = mask.to(q.device)
    interp = _interpreting()
    u, alpha_kind = 0.0, 0
    if isinstance(form, Threshold):
        alpha = _alpha(form, merged)
        assert alpha is not None  # fallback_reason checked it
        u = alpha - 1.0
        alpha_kind = 1 if alpha == 2.0 else 2 if alpha == 1.5 else 0
    low = q.dtype != torch.float32 if low_precision_products is None else bool(low_precision_products)
    values = list(pieces.values(merged))
    par = _pack(values, b, h, q.device)
    dummy = torch.zeros(1, dtype=torch.float32, device=q.device)
    idummy = torch.zeros(1, dtype=torch.int32, device=q.device)
    fwd = _blocks(lq, max(d, v.shape[-1]), interp, family == 4, wide=q.dtype == torch.float32)
    bwd = (16, 16, 1, 1) if interp else (64, 64, 4 if max(d, v.shape[-1]) <= 64 else 8, 1)
    eps = merged.get("eps", 0.0) if isinstance(form, SumNormalized) else 0.0
    c = _Config(
        b=b, h=h, hk=hk, lq=lq, lk=lk, d=d, dv=v.shape[-1], groups=h // hk if hk else 1, scale=float(scale),
        eps=float(eps or 0.0),
        pieces=pieces, family=family, u=u, alpha_kind=alpha_kind, causal=bool(is_causal),
        mask_kind=0 if mask is None else 1 if mask.dtype == torch.bool else 2,
        sm=tuple(mask.stride()) if mask is not None else (0, 0, 0, 0),
        mask_arg=mask if mask is not None else dummy, qdoc=qdoc, kdoc=kdoc,
        qdoc_arg=qdoc if qdoc is not None else idummy, kdoc_arg=kdoc if kdoc is not None else idummy,
        sdq=qdoc.stride(0) if qdoc is not None else 0, sdk=kdoc.stride(0) if kdoc is not None else 0,
        cnt=cnt, cnt_arg=cnt if cnt is not None else dummy, np=len(values),
        block_p=max(1, 1 << max(len(values) - 1, 0).bit_length()),
        block_d=max(16, 1 << max(d - 1, 0).bit_length()), block_dv=max(16, 1 << max(v.shape[-1] - 1, 0).bit_length()),
        dot_prec="ieee" if q.dtype == torch.float32 else "tf32", p_lowp=low,
        upcast=interp and q.dtype == torch.bfloat16, skip=mask is not None or qdoc is not None, fwd_blocks=fwd,
        bwd_blocks=(min(bwd[0], fwd[0]), bwd[1], bwd[2], bwd[3]))
    return _FusedAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), par, c)
