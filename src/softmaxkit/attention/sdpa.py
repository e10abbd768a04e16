r"""The normalizers torch's scaled dot-product attention can run, and how.

* ``softmax(a x)`` for a number ``a`` (softmax with a number temperature): SDPA itself, with
  its scale times ``a``, on every device.
* ``softmax(c x)`` with ``c = g'`` per head and row (a ``SoftmaxOf`` form with ``linear=True``:
  SSMax's ``s log n``, ``n`` the row's visible keys; a per-head temperature's ``1 / T``): SDPA
  on the queries times ``c``, so that autograd carries the parameters' gradients. Not with an
  additive mask, which ``c`` would have to scale too.
* Softmax with a sink, ``p_j = e^{a x_j} / (e^{s} + \sum_k e^{a x_k})`` (a normalizer whose
  numba pieces declare a ``sink`` logit and whose map is linear; gpt-oss, OpenAI 2025, arXiv
  2508.10925), on the CPU: torch's flash kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu``) returns the plain softmax output
  ``o`` and its log-normaliser ``lse = \log \sum_k e^{a x_k}``. With
  ``T = \operatorname{logaddexp}(lse, s)``, the log of the sink's denominator,

  .. math:: \mathrm{out} = o\, e^{lse - T},

  and the flash backward, given ``T`` in place of ``lse`` and ``out`` as the output, rebuilds
  the sink's weights ``p_j = e^{a x_j - T}`` and forms ``dS = p (dP - \mathrm{rowsum}(dO \circ
  out))``, which is the sink's own gradient (the sink carries no value, so ``dv = p^T dO``). The
  sink's gradient is ``-\sum_i p_{sink,i}\, dO_i \cdot out_i``, ``p_{sink} = e^{s - T}``. So the
  sink costs SDPA's time plus two passes over ``(Lq,)`` rows, where the fused path's tiles
  cost 1.3-1.5x SDPA (L=4096, causal, 2 threads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as torch_f

from .. import forms
from .._rows import compute_dtype
from ..forms import SoftmaxOf
from ..kernels.dispatch import all_finite
from ..registry import NormalizerSpec
from .fused import numba_pieces
from .inputs import AttentionInputs, per_head
from .streaming import double_backward_error


@dataclass(frozen=True)
class SdpaPlan:
    """``softmax(factor c x)`` over the visible scores, ``c`` the ``row_scale`` (a tensor
    broadcastable to ``(B, H, Lq, 1)``, by which the queries are multiplied) or 1, with one more
    logit ``sink`` in the denominator when it is not None (a number or a per-head tensor
    broadcastable to ``(B, H, 1, 1)``)."""

    factor: float
    sink: Any = None
    row_scale: torch.Tensor | None = None


def sdpa_plan(spec: NormalizerSpec, params: dict, inp: AttentionInputs) -> SdpaPlan | None:
    """How SDPA runs ``spec`` with ``params`` (as given; defaults are filled in here), or None
    when it cannot: a causal mask that SDPA would align differently (``Lq != Lk``, ``Lq > 1``) or
    combine with ``attn_mask``, or a normalizer that is not one of the module docstring's."""
    _, _, lq, lk = inp.shape
    if inp.is_causal and (inp.has_user_mask or (lq != lk and lq != 1)):
        return None
    merged = spec.with_defaults(params)
    form = spec.form
    if isinstance(form, SoftmaxOf) and spec.stream is None and form.passes == 1:
        factor = form.linear_factor(merged) if form.linear_factor is not None else None
        if factor is not None:
            return SdpaPlan(float(factor))
        if form.linear:
            return _row_scale_plan(form, merged, inp)
    return _sink_plan(spec, merged, inp)


def sdpa_safe(inp: AttentionInputs) -> bool:
    """Whether ``method="auto"`` may take SDPA for these inputs: finite queries (the flash kernel's
    maximum skips a NaN score, so a NaN query's row comes out 0 where the reference has NaN;
    infinite or overflowing scores come out NaN, which :func:`.api.attention` checks after the
    call). A traced call is not checked, nor one on an accelerator (the check would synchronise
    it with the host on every call)."""
    return checks_skipped(inp) or all_finite(inp.given_q)


def checks_skipped(inp: AttentionInputs) -> bool:
    """Whether :func:`sdpa_safe` and the NaN check after SDPA are skipped (traced, or not CPU)."""
    return torch.compiler.is_compiling() or inp.device.type != "cpu"


def _per_head(value: Any, inp: AttentionInputs) -> bool:
    b, h, _, _ = inp.shape
    return not isinstance(value, torch.Tensor) or per_head(value, b, h)


def _row_scale_plan(form: SoftmaxOf, params: dict, inp: AttentionInputs) -> SdpaPlan | None:
    """``g(x) = c x`` with ``c = g'`` a function of per-head parameters and the row's visible
    count (SSMax's ``s log n``, a per-head temperature's ``1 / T``): the queries times ``c``. An
    additive mask would need scaling per row too (an ``Lq x Lk`` tensor); it takes another path."""
    if inp.additive_mask is not None or not all(_per_head(val, inp) for val in params.values()):
        return None
    _, _, lq, lk = inp.shape
    count = inp.visible_count(0, lq, max(lk, 1)) if forms.form_uses_count(form) else None
    unit = torch.ones_like(count) if count is not None else inp.q.new_ones(1, 1, lq, 1)
    return SdpaPlan(1.0, row_scale=forms.call(form.dg, unit, params, count))


def _sink_plan(spec: NormalizerSpec, params: dict, inp: AttentionInputs) -> SdpaPlan | None:
    q, k, v = inp.q, inp.k, inp.v
    if torch.compiler.is_compiling():
        return None   # its checks read data (finite scores) and the numba pieces: a traced call streams
    if q.device.type != "cpu" or min(q.numel(), k.numel()) == 0 or q.shape[-1] != v.shape[-1]:
        return None   # the CPU flash kernel needs one head size and crashes on empty inputs
    if inp.additive_mask is not None and inp.additive_mask.requires_grad and torch.is_grad_enabled():
        return None   # a learned bias: its gradient is not computed here
    pieces = numba_pieces(spec, params)
    if pieces is None or pieces.sink_logit is None or pieces.factor is not None:
        return None
    form = pieces.form
    if not isinstance(form, SoftmaxOf) or form.linear_factor is None:
        return None
    factor, sink = form.linear_factor(params), pieces.sink_logit(params)
    if factor is None:
        return None
    lowest = sink.min().item() if isinstance(sink, torch.Tensor) and sink.numel() else sink
    limit = _drift_limit(inp, factor)
    if isinstance(lowest, (int, float)) and lowest < limit and inp.additive_mask is not None \
            and _low_rows(inp.additive_mask, limit):
        return None   # a row of fills as low as the sink: out = o e^{lse - T} would cancel there
    return SdpaPlan(float(factor), sink) if _per_head(sink, inp) else None


def run_sdpa(plan: SdpaPlan, inp: AttentionInputs, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> torch.Tensor:
    """:func:`_run_sdpa`, whose gradient, where torch's CPU flash kernel computes it (no double
    backward), raises the package's clear error when a graph of it is requested."""
    out = _run_sdpa(plan, inp, q, k, v)
    if plan.sink is None and not torch.compiler.is_compiling() and _flash_backward(out):
        out = _FirstDerivativeOnly.apply(out)
    return out


def _flash_backward(out: torch.Tensor) -> bool:
    """Whether ``out``'s gradient comes from torch's CPU flash kernel (directly, or through a
    dtype cast); torch runs its math backend, which has a double backward, for a learned mask."""
    fn = out.grad_fn
    for _ in range(2):
        if fn is None:
            return False
        if "FlashAttentionForCpu" in type(fn).__name__:
            return True
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return False


class _FirstDerivativeOnly(torch.autograd.Function):
    """The identity; its backward refuses ``create_graph=True`` with :func:`double_backward_error`
    (torch's own error names ``_scaled_dot_product_flash_attention_for_cpu_backward``)."""

    @staticmethod
    def forward(ctx, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            raise RuntimeError(double_backward_error("sdpa"))
        return grad


def _run_sdpa(plan: SdpaPlan, inp: AttentionInputs, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> torch.Tensor:
    """Attention by SDPA under ``plan`` (``q``, ``k``, ``v``: the caller's tensors; the sink runs
    on ``inp``'s, in the compute dtype)."""
    _, _, lq, _ = inp.shape
    causal = inp.is_causal and lq > 1
    mask = compact(inp.bool_mask if inp.bool_mask is not None else inp.additive_mask)
    if plan.row_scale is not None:
        out = torch_f.scaled_dot_product_attention(
            inp.q * plan.row_scale.to(inp.q.dtype), inp.k, inp.v, attn_mask=mask, scale=inp.scale, is_causal=causal,
            enable_gqa=inp.kv_groups > 1)
        return out.to(inp.out_dtype)
    if plan.sink is None:
        if mask is not None and mask.is_floating_point():
            mask = sdpa_additive(mask, plan.factor, q.dtype)
        return torch_f.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=inp.scale * plan.factor, is_causal=causal,
            enable_gqa=inp.kv_groups > 1)
    # the flash kernel, called directly, reads each row of q, k and v as contiguous (torch's public
    # SDPA makes them so; a view with another last-axis stride read other memory)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (inp.q, inp.k, inp.v))
    if mask is not None:
        mask = (sdpa_additive(mask, plan.factor, q.dtype) if mask.is_floating_point()
                else torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf")))
    wide = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype   # the logsumexp's dtype
    sink = plan.sink.to(wide) if isinstance(plan.sink, torch.Tensor) else torch.tensor(float(plan.sink), dtype=wide)
    out = _SinkFlash.apply(q, k, v, sink, mask, inp.scale * plan.factor, causal)
    return out.to(inp.out_dtype)


class _SinkFlash(torch.autograd.Function):
    """Softmax with a sink by torch's CPU flash kernel (module docstring); first derivatives
    in ``q``, ``k``, ``v`` and the sink."""

    @staticmethod
    def forward(ctx, q, k, v, sink, mask, scale, causal):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        total = torch.logaddexp(lse.unsqueeze(-1), sink)      # (B, H, Lq, 1)
        out = out * torch.exp(lse.unsqueeze(-1) - total).to(out.dtype)
        ctx.save_for_backward(q, k, v, sink, mask, out, total)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():   # create_graph=True: the flash backward builds no graph
            raise RuntimeError(double_backward_error("sdpa"))
        q, k, v, sink, mask, out, total = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, total.squeeze(-1).contiguous(), 0.0, ctx.causal, attn_mask=mask, scale=ctx.scale)
        dsink = None
        if ctx.needs_input_grad[3]:
            flow = (grad.to(total.dtype) * out.to(total.dtype)).sum(-1, keepdim=True)
            dsink = (-torch.exp(sink - total) * flow).sum_to_size(sink.shape)
        return dq, dk, dv, dsink, None, None, None


def compact(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` without its broadcast dimensions (size 1 where the stride is 0): SDPA turns a
    bool mask into an additive one, and scales or casts a float one, at the shape it is given:
    an ``Lq x Lk`` mask expanded to ``(B, H, Lq, Lk)`` cost B H times the memory and the time
    (forward and backward 1.4x SDPA's own at 4 x 8 x 1024 x 64 on the CPU)."""
    if mask is None:
        return None
    for dim, (size, stride) in enumerate(zip(mask.shape, mask.stride())):
        if stride == 0 and size > 1:
            mask = mask.narrow(dim, 0, 1)
    return mask


def sdpa_additive(mask: torch.Tensor, factor: float, dtype: torch.dtype) -> torch.Tensor:
    """``factor * mask`` in ``dtype`` for SDPA. A finite entry that ``factor > 1`` or the cast to
    a narrower ``dtype`` overflows (a finfo.min or -1e9 fill) becomes the lowest number of
    ``dtype``, not ``-inf``: a
    very negative score is visible, as on the dense and fused paths (a row of them gets uniform
    weights there, where ``-inf`` would hide the row and output 0)."""
    low = torch.finfo(dtype).min
    if factor <= 1.0 and low <= torch.finfo(mask.dtype).min:
        return mask.to(dtype) * factor if factor != 1.0 else mask.to(dtype)
    # (also a narrower dtype: a float32 -1e9 or finfo.min fill cast to float16 / bfloat16)
    scaled = (mask * factor if factor != 1.0 else mask).clamp_min(max(low, torch.finfo(mask.dtype).min))
    return torch.where(mask == float("-inf"), mask, scaled).to(dtype)


def sdpa_mask_clamped(attn_mask, dtype: torch.dtype, plan: SdpaPlan) -> bool:
    """Whether :func:`sdpa_additive` would clamp a finite entry of a float ``attn_mask`` to the
    lowest number of a narrower input ``dtype`` (a float32 ``-1e9`` or finfo.min fill with float16
    or bfloat16 inputs). SDPA then still keeps the scores beside it, where the dense path adds
    the fill in float32 and rounds them away (a padded query's output differed);
    ``"auto"`` takes another path then."""
    if attn_mask is None or not attn_mask.is_floating_point() or torch.compiler.is_compiling():
        return False
    low = torch.finfo(dtype).min
    if low <= torch.finfo(attn_mask.dtype).min or attn_mask.numel() == 0:
        return False
    mask = attn_mask.detach()
    return bool(((mask * max(plan.factor, 1.0) < low) & (mask > float("-inf"))).any())


def _low_rows(mask: torch.Tensor, limit: float) -> bool:
    """Whether a row of the float ``mask`` has every entry below ``limit`` but not all ``-inf``."""
    top = mask.detach().amax(-1)
    return bool(((top > float("-inf")) & (top < limit)).any())


def _drift_limit(inp: AttentionInputs, factor: float) -> float:
    """Scores below this (in the compute dtype) leave the logsumexp of their row rounded by
    more than 1% in the exponent: ``-0.01 / eps`` (-8.4e4 in float32)."""
    return -0.01 / torch.finfo(compute_dtype(inp.out_dtype)).eps / factor


def sdpa_scores_drift(inp: AttentionInputs, plan: SdpaPlan) -> bool:
    """Whether SDPA's gradient may be off for the scores themselves, when gradients are wanted
    on the CPU: torch's CPU flash-attention backward rebuilds the weights from a logsumexp
    rounded at the scores' magnitude, as it does for a low mask fill (one key 1e3 times the
    others and ``scale=1e3``, scores near 1e7: ``dq`` 0.66 and ``dv`` 0.28 off in float32, at
    ``scale=1e5`` 1e26-1e29, where dense and fused are exact). A score is at most the largest
    query norm times the largest key norm times ``|scale|`` (and the plan's factor and row
    scale); calls whose bound reaches :func:`_drift_limit` leave SDPA. Two norms of
    ``(Lq + Lk) D`` entries; not on the GPU, where reading the bound would cost a
    synchronisation per call."""
    q, k = inp.given_q, inp.given_k
    if not q.is_cpu or torch.compiler.is_compiling() or not q.numel() or not k.numel():
        return False
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (q, k, inp.given_v)):
        return False
    dtype = compute_dtype(inp.out_dtype)
    with torch.no_grad():
        bound = (float(torch.linalg.vector_norm(q.detach(), dim=-1, dtype=dtype).amax())
                 * float(torch.linalg.vector_norm(k.detach(), dim=-1, dtype=dtype).amax()) * abs(inp.scale))
        if plan.row_scale is not None:
            bound *= float(plan.row_scale.detach().abs().amax())
    return not bound < -_drift_limit(inp, plan.factor)   # (NaN or inf inputs: not SDPA either)


def sdpa_backward_drifts(attn_mask, inp: AttentionInputs, plan: SdpaPlan) -> bool:
    """Whether SDPA's gradient would be off here: a float ``attn_mask`` with a row whose every
    entry is far below 0 (a padded query under a finfo.min or -1e9 fill), when gradients are
    wanted. Torch's CPU flash-attention backward rebuilds such a row's weights from a
    logsumexp rounded at the fill's magnitude (torch 2.13: a row of finfo.min gets
    ``Lk`` times the gradient of the math backend); ``"auto"`` takes the dense path then.
    Rows are flagged when their largest mask entry is below :func:`_drift_limit`. With a
    sink the weights are relative to ``logaddexp(lse, s)``, which such a fill cannot round
    unless the sink is as low, and :func:`sdpa_plan` declines that case."""
    if plan.sink is not None or inp.additive_mask is None or torch.compiler.is_compiling():
        return False
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (inp.given_q, inp.given_k, inp.given_v)):
        return False
    return attn_mask.shape[-1] > 0 and _low_rows(attn_mask, _drift_limit(inp, plan.factor))
