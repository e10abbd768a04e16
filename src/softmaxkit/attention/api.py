"""``attention(q, k, v, normalizer=...)``: picks torch SDPA, the fused or streaming path, or the dense reference."""

from __future__ import annotations

import functools
import math

import torch

from .. import registry
from .._checks import can_branch_on, check_choice, under_transform
from .._rows import compute_dtype
from ..forms import COUNT
from ..kernels.dispatch import all_finite
from ..registry import NormalizerSpec
from .dense import dense_attention
from .fused import auto_prefers, fused_attention, largest_magnitude, pays_off_when_small, row_kernels_apply
from .inputs import AttentionInputs, hide_keys, per_head, prepare, zero_unseen
from .sdpa import (
    SdpaPlan,
    checks_skipped,
    run_sdpa,
    sdpa_backward_drifts,
    sdpa_mask_clamped,
    sdpa_plan,
    sdpa_safe,
    sdpa_scores_drift,
)
from .streaming import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, streaming_attention

METHODS = ("auto", "sdpa", "fused", "streaming", "dense")
#: ``method="auto"`` takes the dense path when ``Lq * Lk`` is at most this (128 x 128): the
#: score matrix is small and one dense pass beats the streaming loop there (and the fused
#: loop, unless its tiles stay full: :func:`.fused.pays_off_when_small`).
SMALL_SCORES = 128 * 128


def _validate(spec: NormalizerSpec, params: dict, inp: AttentionInputs) -> None:
    b, h, _, lk = inp.shape
    validate_params(spec, params, (b, h, lk), compute_dtype(inp.given_q.dtype), inp.device)


def validate_params(spec: NormalizerSpec, params: dict, shape: tuple[int, int, int], dtype: torch.dtype,
                    device: torch.device) -> None:
    """Let the reference check the parameter values on one row of scores per (batch, head)
    (``shape = (B, H, Lk)``); raises its ``ValueError`` / ``TypeError`` naming the parameter.

    Tensors that vary per query or key are checked by the dense reference that uses them."""
    b, h, lk = shape
    checked = {n: val for n, val in params.items()
               if not isinstance(val, torch.Tensor) or (n != COUNT and per_head(val, b, h, spec.param(n).size))}
    length = lk if lk else 2   # (no key: a row of two checks the values, e.g. sparse_softmax's k)
    key = _validation_key(spec, checked, length, dtype, device)
    if key is not None and _VALIDATED.get(key) is spec:
        return
    dummy = torch.zeros(b, h, 1, length, dtype=dtype, device=device)
    spec.fn(dummy, dim=-1, mask=None, **checked)
    if key is not None:
        if len(_VALIDATED) >= 1024:
            _VALIDATED.clear()
        _VALIDATED[key] = spec


#: Parameter sets (numbers only) the reference has accepted, by normalizer, row length, dtype
#: and device type: a call with the same ones is not checked again (the check runs the
#: reference on a row per head, a fixed cost of about 0.2 ms on every attention call).
_VALIDATED: dict = {}


def _validation_key(spec: NormalizerSpec, checked: dict, length: int, dtype: torch.dtype, device) -> tuple | None:
    if any(isinstance(val, torch.Tensor) for val in checked.values()):
        return None
    # each value with its type: True == 1 and hash(True) == hash(1), so a bool found the entry
    # of an accepted int and was never checked
    typed = tuple(sorted((name, _typed(val)) for name, val in checked.items()))
    key = (id(spec), typed, length, dtype, torch.device(device).type)
    try:
        hash(key)
    except TypeError:   # a parameter given as a list or another unhashable value
        return None
    return key


def _typed(value):
    """``value`` with its type (and the types of a sequence's items) for a cache key."""
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_typed(item) for item in value)
    return type(value), value


def _blocks(block_size) -> tuple[int, int]:
    if block_size is None:
        return DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K
    if isinstance(block_size, bool) or not isinstance(block_size, (int, tuple, list)):
        raise TypeError(f"block_size must be a positive int or a pair (block_q, block_k), got {block_size!r}")
    pair = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    if len(pair) != 2 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in pair):
        raise ValueError(f"block_size must be a positive int or a pair (block_q, block_k), got {block_size!r}")
    return pair


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, /, normalizer: str = "softmax",
              is_causal: bool = False, attn_mask: torch.Tensor | None = None, scale: float | None = None,
              *, method: str = "auto", block_size=None, **params) -> torch.Tensor:
    r"""Attention ``normalize(q k^T * scale + attn_mask) v`` with any registered normalizer.

    .. math::
        \mathrm{out}_i = \sum_j p_{ij} v_j,\quad
        p_{i\cdot} = \mathrm{normalize}\big(q_i k_\cdot^\top \cdot \mathrm{scale} + a_{i\cdot};\
        \text{visible keys}\big)

    Shapes as in ``torch.nn.functional.scaled_dot_product_attention``: ``q`` is
    ``(B, H, Lq, D)``, ``k`` and ``v`` are ``(B, Hkv, Lk, D)`` and ``(B, Hkv, Lk, Dv)`` with
    ``Hkv`` dividing ``H`` (grouped-query attention). A normalizer that is ``softmax(c x)``
    for ``c`` a number (softmax with a number temperature) or per head and row (ssmax, a
    per-head temperature: queries times ``c``) goes to torch SDPA, and on the CPU so does
    softmax with a sink (torch's flash kernel and its logsumexp: :mod:`.sdpa`). On the CPU
    the others take the fused path (``method="fused"``): blocks of queries against their
    whole visible rows, never the ``Lq x Lk`` matrix, with the closed-form backward of the
    normalizer's family; every streamable normalizer can also run over key blocks
    (``method="streaming"``, the GPU default). Parameters that vary per query or key use the
    dense reference, as does ``method="auto"`` for short inputs (``Lq * Lk <= 128 * 128``),
    where it is faster, unless the CPU row kernels still fill their tiles there (decoding
    against a long cache, many heads of 128 queries).

    Visibility: ``attn_mask`` is bool (True = visible) or float (added to the scores;
    ``-inf`` hides a key; ``+inf`` gives that key its row's whole weight, shared equally
    between such keys, and runs every method on the dense path), broadcastable to
    ``(B, H, Lq, Lk)``; ``is_causal`` lets query
    ``i`` see keys ``j <= i + Lk - Lq`` (aligned to the end of the keys, so one decoding
    query sees the whole cache); both may be combined. The normalizer sees only visible
    keys (``n`` in ssmax and sigmoid counts them); a query with no visible key outputs 0.
    A float ``attn_mask`` that requires grad (a learned bias) is differentiated: ``"auto"``
    then runs SDPA or the dense path, and ``"fused"`` / ``"streaming"`` (which take the mask
    as a constant) refuse it.

    Args:
        normalizer: a registered name (``softmaxkit list``).
        scale: multiplies ``q k^T``; default ``1 / sqrt(D)``.
        method: ``"auto"`` (see :func:`auto_method`), ``"sdpa"`` (``softmax(c x)`` normalizers,
            ``c`` a number or per head and row, and softmax with a sink on the CPU: :mod:`.sdpa`;
            where torch's kernel would get rows wrong, e.g. the gradient of a query whose every
            key a finite fill hides, or NaN from infinite scores, it runs what ``"auto"`` would),
            ``"fused"`` (CPU: query blocks against whole visible rows with the closed-form
            backward of the normalizer's family, :mod:`.fused`; CUDA: the Triton kernels of
            :mod:`softmaxkit.attention.fused_triton` for normalizers that declare Triton pieces,
            which ``"auto"`` takes there too), ``"streaming"`` or ``"dense"``. The streaming path
            has first derivatives only: a double backward (``create_graph=True``) through it
            raises ``RuntimeError``; use ``"dense"``. Under ``torch.func`` transforms (``grad``,
            ``vmap``, ``jvp``, ``jacrev``...) and forward-mode AD every method runs ``"dense"``.
            Under ``torch.compile`` (``fullgraph=True`` too) ``"fused"`` with a gradient and
            ``"streaming"`` for the threshold normalizers (sparsemax, entmax) run ``"dense"``
            (dynamo cannot trace their backward); ``"streaming"`` for the others is traced
            tile by tile and differentiated as written.
        block_size: ``block`` or ``(block_q, block_k)`` for the streaming path (the fused
            path takes ``block_q`` query rows per tile).
        **params: the normalizer's parameters (``q``, ``k``, ``v`` are positional-only, so
            ``k=8`` is sparse_softmax's ``k``); tensors broadcastable to ``(B, H, 1, 1)``
            (``(4, B, H, 1, 1)`` for MultiMax ``r``, ``t``) are per-head and learnable.

    Example:
        >>> q = k = v = torch.randn(1, 4, 128, 32)
        >>> out = attention(q, k, v, "softpick", is_causal=True)
    """
    spec = registry.get(normalizer)
    merged = spec.with_defaults(params)
    check_choice(method, "method", METHODS)
    block_q, block_k = _blocks(block_size)
    inp = prepare(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)
    clean = zero_unseen(q, k, v, attn_mask)
    seen = keys = None
    if clean is not None:
        q, keys, seen = clean
        inp = prepare(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)

    def hidden_keys_zeroed():
        """Zero the keys and values the mask hides from every query (garbage there reaches
        every row as 0 * NaN): before any path but SDPA given harmless ones."""
        nonlocal k, v, inp, keys
        if keys is not None:
            k, v = hide_keys(k, v, keys)
            inp = prepare(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)
            keys = None
    if is_causal and inp.offset < 0:   # the first Lq - Lk queries see no key
        causal_seen = (torch.arange(inp.shape[2], device=q.device) >= -inp.offset).reshape(1, 1, -1, 1)
        seen = causal_seen if seen is None else seen & causal_seen
    held = functools.partial(_constant_unseen_rows, seen=seen)
    if not torch.compiler.is_compiling():  # a reference on a dummy row may branch on data (sparsemax)
        _validate(spec, params, inp)
    # under torch.func / forward AD every method is the dense reference: the other paths are
    # autograd Functions and kernels reading data (torch's CPU flash kernel has no jvp)
    if _gives_a_key_everything(attn_mask) or under_transform():
        hidden_keys_zeroed()
        return held(dense_attention(inp, normalizer, params))
    learnable_mask = _learnable_mask(attn_mask)
    plan = sdpa_plan(spec, params, inp) if method in ("auto", "sdpa") else None
    if method == "auto":
        method = _auto(spec, params, merged, inp, plan)
        if learnable_mask and method not in ("sdpa", "dense"):
            method = "dense"
    elif learnable_mask and method in ("fused", "streaming"):
        raise ValueError(f"method={method!r} treats attn_mask as a constant, but attn_mask requires grad (a "
                         "learned additive bias); use method='auto' or 'dense', which differentiate it")
    if keys is not None and (method != "sdpa" or plan is None or not _hidden_keys_harmless(inp, plan)):
        hidden_keys_zeroed()
    if method == "sdpa":
        if plan is None:
            raise ValueError("method='sdpa' needs a normalizer that is softmax(c x) for c a number, or per head "
                             "and row (softmax with a temperature, ssmax; no additive attn_mask then), or on "
                             "the CPU softmax with a sink (per-head sink, one head size for q and v), and no "
                             "causal mask combined with attn_mask or with Lq != Lk (Lq > 1)")
        # (an explicit "sdpa" too: torch's kernel would give these rows wrong values or gradients)
        if sdpa_mask_clamped(attn_mask, q.dtype, plan):
            hidden_keys_zeroed()
            method = _auto(spec, params, merged, inp, None)
        elif sdpa_backward_drifts(attn_mask, inp, plan):
            hidden_keys_zeroed()
            if plan.sink is None and plan.row_scale is None:
                return held(dense_attention(inp, normalizer, params))
            method = _auto(spec, params, merged, inp, None)
        elif sdpa_scores_drift(inp, plan):
            hidden_keys_zeroed()
            method = _auto(spec, params, merged, inp, None)
        else:
            out = run_sdpa(plan, inp, q, k, v)
            if checks_skipped(inp) or all_finite(out):
                return held(out)
            # infinite or overflowing scores, which SDPA makes NaN; the other paths give the reference's rows
            # (an infinite value, whose output is infinite, takes them too: rare, and they agree there)
            hidden_keys_zeroed()
            method = "dense" if learnable_mask else _auto(spec, params, merged, inp, None)
    if method == "fused" and _triton_device(q):
        from .fused_triton import fused_attention as triton_attention

        reason = _triton_reason(spec, params, inp)
        if reason is not None:
            raise ValueError(f"method='fused' cannot run normalizer {normalizer!r} here: {reason}")
        return held(triton_attention(q, k, v, normalizer, is_causal=is_causal, attn_mask=attn_mask, scale=scale,
                                     **params))
    if method in ("fused", "streaming") and _holds_non_finite(inp):
        return held(dense_attention(inp, normalizer, params))
    per_head = _params_per_head(spec, merged, inp)
    if method == "fused" and torch.compiler.is_compiling() and _records_gradient(q, k, v, params):
        # dynamo cannot trace the fused backward's autograd.grad
        return held(dense_attention(inp, normalizer, params))
    if method == "fused":
        if not per_head:
            raise ValueError(f"method='fused' needs numbers or per-head tensors (broadcastable to (B, H, 1, 1)) "
                             f"as parameters of {normalizer!r}; use method='auto' or 'dense'")
        return held(fused_attention(spec, inp, merged, None if block_size is None else block_q))
    rule = spec.stream_rule(merged)
    if method == "streaming":
        if rule is None or not per_head:
            raise ValueError(f"normalizer {normalizer!r} with these parameters has no streaming path; "
                             "use method='auto' or 'dense'")
        if torch.compiler.is_compiling() and hasattr(rule, "search"):
            # traced, the streaming forward is differentiated as written (see streaming_attention),
            # and a searched threshold carries no gradient there
            return held(dense_attention(inp, normalizer, params))
        return held(streaming_attention(rule, inp, merged, block_q, block_k))
    return held(dense_attention(inp, normalizer, params))


def _hidden_keys_harmless(inp: AttentionInputs, plan: SdpaPlan) -> bool:
    """Whether SDPA may take the keys and values a mask hides as they are (CPU, not traced,
    ``softmax(c x)`` without a sink or a per-row scale): no score can overflow, ``|q|max |k|max
    D scale c`` below a quarter of ``finfo.max`` (a finite garbage key of 1e30 makes
    ``inf + -inf``), and ``|v|max Dv`` at most ``sqrt(finfo.max)`` (a hidden value's weight is
    exactly 0, but the backward's ``dO v^T`` at a garbage value of -3e38 overflowed, and
    ``0 * inf`` is NaN; past that bound only an incoming gradient of ``sqrt(finfo.max)`` could).
    Zeroing them instead copies k and v (2 ms of a 15 ms forward at 2 x 8 x 1024 x 64)."""
    if plan.sink is not None or plan.row_scale is not None or checks_skipped(inp):
        return False
    q, k, v = inp.given_q, inp.given_k, inp.given_v
    top = torch.finfo(q.dtype).max
    if not largest_magnitude(v) * v.shape[-1] <= math.sqrt(top):   # (NaN: not harmless)
        return False
    return largest_magnitude(q) * largest_magnitude(k) * q.shape[-1] * abs(inp.scale * plan.factor) < top / 4


def _constant_unseen_rows(out: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
    """``out`` with no gradient through its query rows that see no key (``seen`` False: their
    output is the constant 0): an infinite or NaN incoming gradient there reached every key's
    gradient on the SDPA, fused and streaming paths (``0 * inf`` in their backwards), where the
    dense reference passes nothing."""
    if seen is None or not out.requires_grad:
        return out
    return torch.where(seen, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _records_gradient(*tensors_and_params) -> bool:
    """Whether autograd records a gradient for any of the tensors (``dict``s: their values)."""
    if not torch.is_grad_enabled():
        return False
    flat = [x for t in tensors_and_params for x in (t.values() if isinstance(t, dict) else (t,))]
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)


def _holds_non_finite(inp: AttentionInputs) -> bool:
    """Whether ``q`` or ``k`` holds an infinite or NaN entry (CPU, not traced): the dense
    reference defines those rows (an infinite score's limit, NaN rows), where the fused and
    streaming paths gave NaN rows or NaN gradients for many normalizers (an infinite query
    entry: ``+inf`` and ``-inf`` scores in one row). One ``aminmax`` pass over each."""
    if checks_skipped(inp):
        return False
    return not (math.isfinite(largest_magnitude(inp.q)) and math.isfinite(largest_magnitude(inp.k)))


def _triton_device(t: torch.Tensor) -> bool:
    """Whether ``t`` lives where the fused path means the Triton kernels (CUDA)."""
    return t.is_cuda


def _triton_reason(spec: NormalizerSpec, params: dict, inp: AttentionInputs) -> str | None:
    """Why the Triton kernels cannot run these inputs (``None``: they can)."""
    from .fused_triton import fallback_reason

    return fallback_reason(spec, params, inp.q, inp.k, inp.v)


def _gives_a_key_everything(attn_mask) -> bool:
    """Whether a float ``attn_mask`` adds ``+inf`` somewhere: that key takes its row's whole weight
    (the limit of the definition, equal weights between such keys), which the dense reference
    computes; the fused, streaming and SDPA paths form ``inf - inf`` there (NaN rows)."""
    # amax: one reduction, no bool copy of the mask (2.4 ms at 4096 x 4096, isposinf().any() 17 ms)
    return (isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point() and attn_mask.numel() > 0
            and can_branch_on(attn_mask) and bool(attn_mask.detach().amax() == float("inf")))


def _learnable_mask(attn_mask) -> bool:
    """Whether ``attn_mask`` is an additive mask that needs a gradient (the fused and streaming
    paths, CPU and Triton, take the mask as a constant; dense and SDPA differentiate it)."""
    return (isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point() and attn_mask.requires_grad
            and torch.is_grad_enabled())


def _params_per_head(spec: NormalizerSpec, merged: dict, inp: AttentionInputs) -> bool:
    b, h, _, _ = inp.shape
    return all(per_head(val, b, h, spec.param(n).size) for n, val in merged.items() if isinstance(val, torch.Tensor))


def _auto(spec: NormalizerSpec, params: dict, merged: dict, inp: AttentionInputs, plan: SdpaPlan | None) -> str:
    """The method ``"auto"`` runs: SDPA where ``plan`` (:func:`.sdpa.sdpa_plan`) says it runs the
    normalizer (``softmax(c x)``; on the CPU, softmax with a sink) and the queries are finite
    (:func:`.sdpa.sdpa_safe`); the dense reference for small
    inputs (``Lq * Lk <= SMALL_SCORES``, unless the CPU row kernels pay off there:
    :func:`.fused.pays_off_when_small`) and for parameters that vary per query or key; on
    CUDA the Triton kernels (``"fused"``) wherever they run (:func:`.fused_triton.fallback_reason`),
    at every length; on the CPU the fused path (the four forms, and normalizers that cannot stream: see
    :func:`.fused.auto_prefers`); otherwise streaming when the normalizer streams, else dense.
    The choice follows ``softmaxkit bench attention`` (fastest exact path per normalizer)."""
    if plan is not None and sdpa_safe(inp):
        return "sdpa"
    _, _, lq, lk = inp.shape
    if not _params_per_head(spec, merged, inp):
        return "dense"
    if _triton_device(inp.given_q) and _triton_reason(spec, params, inp) is None:
        return "fused"
    if lq * lk <= SMALL_SCORES and not (inp.device.type == "cpu" and pays_off_when_small(spec, merged, inp)):
        return "dense"
    streams = spec.stream_rule(merged) is not None
    if inp.device.type == "cpu" and auto_prefers(spec, merged, streams, row_kernels_apply(inp)):
        return "fused"
    return "streaming" if streams else "dense"


def auto_method(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, /, normalizer: str = "softmax",
                is_causal: bool = False, attn_mask: torch.Tensor | None = None, scale: float | None = None,
                **params) -> str:
    """The method (``"sdpa"``, ``"fused"``, ``"streaming"`` or ``"dense"``) that
    ``attention(..., method="auto")`` runs for these inputs (same arguments, nothing computed)."""
    spec = registry.get(normalizer)
    merged = spec.with_defaults(params)
    inp = prepare(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)
    if _gives_a_key_everything(attn_mask) or under_transform():
        return "dense"
    plan = sdpa_plan(spec, params, inp)
    method = _auto(spec, params, merged, inp, plan)
    if method == "sdpa" and plan is not None:   # as attention() leaves SDPA after planning it
        if sdpa_mask_clamped(attn_mask, q.dtype, plan):
            method = _auto(spec, params, merged, inp, None)
        elif sdpa_backward_drifts(attn_mask, inp, plan):
            method = "dense" if plan.sink is None and plan.row_scale is None else _auto(spec, params, merged, inp, None)
        elif sdpa_scores_drift(inp, plan):
            method = _auto(spec, params, merged, inp, None)
    if method in ("fused", "streaming") and _holds_non_finite(inp):
        return "dense"
    return "dense" if _learnable_mask(attn_mask) and method not in ("sdpa", "dense") else method
