"""The normalizers torch SDPA runs (softmaxkit.attention.sdpa): softmax with a sink through the CPU
flash kernel, and softmax(c x) with c per head and row (SSMax, per-head temperatures)."""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit import registry
from softmaxkit.attention import auto_method, sdpa
from softmaxkit.attention.inputs import prepare

F32 = torch.finfo(torch.float32)


def _qkv(b=2, h=4, hk=4, lq=9, lk=9, d=8, dtype=torch.float64, seed=0, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (spread * torch.randn(b, h, lq, d, generator=gen, dtype=dtype),
            spread * torch.randn(b, hk, lk, d, generator=gen, dtype=dtype),
            torch.randn(b, hk, lk, d, generator=gen, dtype=dtype))


def _run(method, q, k, v, sink, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if isinstance(sink, torch.Tensor):
        sink = sink.detach().clone().requires_grad_()
        leaves.append(sink)
    out = sk.attention(*leaves[:3], "softmax_sink", method=method, sink=sink, **kw)
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), leaves))


def _masks(lq, lk, dtype):
    gen = torch.Generator().manual_seed(5)
    visible = torch.rand(lq, lk, generator=gen) > 0.3
    visible[2] = False                        # a row that sees nothing
    additive = torch.randn(2, 1, lq, lk, generator=gen, dtype=dtype)
    additive[0, 0, 3] = float("-inf")         # nothing visible
    additive[1, 0, 4] = -1e9                  # a padded query under the usual fill
    additive[1, 0, 5] = torch.finfo(dtype).min
    additive[0, 0, 6, :4] = float("-inf")
    return visible, additive


def _scenario(case):
    """``(q, k, v, kwargs)`` of a visibility case, float64."""
    lq, lk, hk, kw = 9, 9, 4, {}
    if case == "causal_gqa":
        hk, kw = 2, {"is_causal": True}
    elif case == "decoding":
        lq, kw = 1, {"is_causal": True}
    elif case == "cross":
        lk = 13
    elif case in ("bool_mask", "additive_mask"):
        visible, additive = _masks(lq, lk, torch.float64)
        kw = {"attn_mask": visible if case == "bool_mask" else additive}
    return (*_qkv(hk=hk, lq=lq, lk=lk), kw)


@pytest.mark.parametrize("case", ["plain", "causal_gqa", "decoding", "bool_mask", "additive_mask", "cross"])
@pytest.mark.parametrize("sink", ["number", "per_head", "per_batch_head"])
def test_sink_on_sdpa_equals_dense_in_float64(case, sink):
    """Outputs and the gradients of q, k, v and the sink equal the dense reference to float64
    rounding, with every visibility the path takes."""
    q, k, v, kw = _scenario(case)
    logit = {"number": -0.7, "per_head": torch.tensor([0.3, -1.0, 2.0, 0.0], dtype=q.dtype).view(4, 1, 1),
             "per_batch_head": torch.randn(2, 4, 1, 1, dtype=q.dtype, generator=torch.Generator().manual_seed(2))}[sink]
    assert auto_method(q, k, v, "softmax_sink", sink=logit, **kw) == "sdpa"
    got, want = _run("sdpa", q, k, v, logit, **kw), _run("dense", q, k, v, logit, **kw)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_rows_that_see_nothing_give_zero_and_zero_gradient():
    q, k, v = _qkv()
    visible = torch.ones(9, 9, dtype=torch.bool)
    visible[4] = False
    out, dq, dk, dv, dsink = _run("sdpa", q, k, v, torch.zeros(4, 1, 1, dtype=q.dtype), attn_mask=visible)
    assert out[:, :, 4].abs().max() == 0 and dq[:, :, 4].abs().max() == 0
    assert torch.isfinite(dsink).all()


def test_float32_error_stays_within_the_dense_float32_error():
    """FlashAttention's rule against a float64 reference: at most 2x (outputs) and 3x (gradients)
    the error of the dense path in the same precision, at large scores too."""
    q, k, v = _qkv(lq=64, lk=64, d=16, spread=3.0)
    sink = torch.tensor([0.3, -1.0, 4.0, 0.0], dtype=q.dtype).view(4, 1, 1)
    exact = _run("dense", q, k, v, sink, is_causal=True)
    lo = [t.float() for t in (q, k, v, sink)]
    fast, dense = _run("sdpa", *lo, is_causal=True), _run("dense", *lo, is_causal=True)
    for i, (a, b, ref) in enumerate(zip(fast, dense, exact)):
        err_fast, err_dense = (a.double() - ref).abs().max(), (b.double() - ref).abs().max()
        # the floor: a few ulp of the largest entry (the sink's gradient sums every row's term,
        # each through SDPA's float32 logsumexp, about 10 here: an ulp of 1e-6 in its exponent)
        floor = 8 * torch.finfo(torch.float32).eps * float(ref.abs().max())
        assert err_fast <= (2 if i == 0 else 3) * err_dense + floor, (i, err_fast, err_dense, floor)


def test_gradcheck():
    q, k, v = (t.requires_grad_() for t in _qkv(b=1, h=2, hk=1, lq=4, lk=5, d=3))
    sink = torch.tensor([0.2, -0.5], dtype=q.dtype).view(2, 1, 1).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: sk.attention(q, k, v, "softmax_sink", method="sdpa", sink=s), (q, k, v, sink))


@pytest.mark.parametrize("edge", ["empty_queries", "empty_keys", "head_dims", "low_sink", "per_query_sink",
                                  "learned_bias", "causal_with_mask"])
def test_sink_leaves_sdpa_where_the_flash_kernel_cannot_run_it(edge):
    """The flash kernel crashes on empty inputs and needs one head size; a sink as low as a row of
    fills would cancel in ``o e^{lse - T}``; a per-query sink and a learned bias are not its to
    take. ``auto`` runs another path there, equal to the dense reference, and ``method="sdpa"``
    says why it cannot."""
    q, k, v = _qkv(dtype=torch.float32)
    kw, logit = {}, 0.5
    if edge == "empty_queries":
        q = q[:, :, :0]
    elif edge == "empty_keys":
        k, v = k[:, :, :0], v[:, :, :0]
    elif edge == "head_dims":
        v = torch.randn(2, 4, 9, 5)
    elif edge == "low_sink":
        kw, logit = {"attn_mask": _masks(9, 9, torch.float32)[1]}, -1e9
    elif edge == "per_query_sink":
        logit = torch.randn(1, 1, 9, 1)
    elif edge == "learned_bias":
        kw = {"attn_mask": torch.zeros(9, 9, requires_grad=True)}
    elif edge == "causal_with_mask":
        kw = {"attn_mask": torch.ones(9, 9, dtype=torch.bool), "is_causal": True}
    assert auto_method(q, k, v, "softmax_sink", sink=logit, **kw) != "sdpa"
    with pytest.raises(ValueError, match="method='sdpa'"):
        sk.attention(q, k, v, "softmax_sink", method="sdpa", sink=logit, **kw)
    got = sk.attention(q, k, v, "softmax_sink", sink=logit, **kw)
    want = sk.attention(q, k, v, "softmax_sink", sink=logit, method="dense", **kw)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("name", ["softmax", "softmax_sink", "ssmax"])
@pytest.mark.parametrize("edge", ["nan_query", "inf_query", "inf_key", "overflowing_products"])
def test_auto_gives_the_references_rows_where_sdpa_would_not(name, edge):
    """The flash kernel's maximum skips a NaN score (a NaN query's row came out 0 where the
    reference's is NaN), and infinite or overflowing scores come out NaN where the reference has
    a finite row: ``auto`` checks the queries before and the output after SDPA, and runs another
    path there."""
    q, k, v = _qkv(dtype=torch.float32)
    if edge == "nan_query":
        q[0, 1, 2, 3] = float("nan")
    elif edge == "inf_query":
        q[1, 2, 4, 0] = float("inf")
    elif edge == "inf_key":
        k[1, 0, 4, 0] = float("inf")
    else:
        q, k = q * 1e19, k * 1e19
    got = sk.attention(q, k, v, name)
    want = sk.attention(q, k, v, name, method="dense")
    torch.testing.assert_close(got, want, equal_nan=True)


def _ssmax_or_temperature(name, dtype, heads=4, batch=2):
    gen = torch.Generator().manual_seed(4)
    if name == "ssmax":
        return {"s": 0.2 + torch.rand(batch, heads, 1, 1, generator=gen, dtype=dtype)}
    return {"temperature": 0.3 + torch.rand(heads, 1, 1, generator=gen, dtype=dtype)}


@pytest.mark.parametrize("case", ["causal_gqa", "decoding", "bool_mask", "cross", "given_n"])
@pytest.mark.parametrize("name", ["ssmax", "softmax"])
def test_per_row_factor_on_sdpa_equals_dense_in_float64(name, case):
    """``softmax(c x)`` with ``c`` per head and row (SSMax's ``s log n``, ``n`` the visible keys
    of the row; a per-head temperature's ``1 / T``) runs on SDPA with the queries times ``c``:
    outputs and the gradients of q, k, v and the parameters equal the dense reference."""
    q, k, v, kw = _scenario(case)
    params = _ssmax_or_temperature(name, q.dtype)
    if case == "given_n":
        params = {"s": params["s"], "n": 100.0} if name == "ssmax" else params
    assert auto_method(q, k, v, name, **kw, **params) == "sdpa"
    leaves = {n: t for n, t in params.items() if isinstance(t, torch.Tensor)}

    def run(method):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v, *leaves.values())]
        given = dict(params, **dict(zip(leaves, inputs[3:])))
        out = sk.attention(*inputs[:3], name, method=method, **kw, **given)
        weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
        return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), inputs))

    for a, b in zip(run("sdpa"), run("dense")):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_per_row_factor_with_an_additive_mask_takes_another_path():
    """An additive mask would need the factor applied to it per row (an Lq x Lk tensor)."""
    q, k, v = _qkv()
    mask = torch.randn(9, 9, dtype=q.dtype)
    assert auto_method(q, k, v, "ssmax", attn_mask=mask) != "sdpa"
    with pytest.raises(ValueError, match="method='sdpa'"):
        sk.attention(q, k, v, "ssmax", attn_mask=mask, method="sdpa")
    torch.testing.assert_close(sk.attention(q, k, v, "ssmax", attn_mask=mask),
                               sk.attention(q, k, v, "ssmax", attn_mask=mask, method="dense"))


def test_half_precision_inputs():
    q, k, v = _qkv(dtype=torch.float32)
    for dtype in (torch.float16, torch.bfloat16):
        lo = [t.to(dtype) for t in (q, k, v)]
        got = sk.attention(*lo, "softmax_sink", is_causal=True, sink=0.3)
        assert got.dtype == dtype and auto_method(*lo, "softmax_sink", is_causal=True, sink=0.3) == "sdpa"
        want = sk.attention(q, k, v, "softmax_sink", is_causal=True, sink=0.3, method="dense")
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=0)


@pytest.mark.parametrize("name,params", [("softmax_sink", {}), ("softmax", {}), ("ssmax", {}),
                                         ("softmax", {"temperature": torch.tensor([0.5, 2.0, 1.0, 1.5]).view(4, 1, 1)})])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_double_backward_is_a_clear_error(name, params, dtype):
    """torch's CPU flash kernel has no double backward: every SDPA path says so in the package's
    words (torch's error named ``_scaled_dot_product_flash_attention_for_cpu_backward``)."""
    q, k, v = (t.to(dtype).requires_grad_() for t in _qkv())
    out = sk.attention(q, k, v, name, method="sdpa", **params)
    with pytest.raises(RuntimeError, match="double backward is not supported by the sdpa path"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_double_backward_with_a_learned_mask_on_sdpa():
    """With a mask that requires grad torch runs its math backend, whose double backward works:
    it is left to run, and equals the dense path's."""
    q, k, v = (t.requires_grad_() for t in _qkv())
    mask = torch.randn(9, 9, dtype=q.dtype, requires_grad=True)
    grads = []
    for method in ("sdpa", "dense"):
        out = sk.attention(q, k, v, "softmax", attn_mask=mask, method=method)
        (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        grads.append(torch.autograd.grad((dq * dq).sum(), (q, k, mask)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_the_fused_path_keeps_its_sink_when_the_map_is_linear():
    """The sink's numba form declares ``g(x) = x`` linear (so that SDPA can run it); the fused
    path must still run the sink's pieces, not fold the map into the query scale and drop the
    sink."""
    q, k, v = _qkv()
    for causal in (False, True):
        torch.testing.assert_close(sk.attention(q, k, v, "softmax_sink", is_causal=causal, method="fused"),
                                   sk.attention(q, k, v, "softmax_sink", is_causal=causal, method="dense"))


def test_plan_reads_the_pieces_not_the_name():
    q, k, v = _qkv()
    inp = prepare(q, k, v, is_causal=False, attn_mask=None, scale=None)
    plan = sdpa.sdpa_plan(registry.get("softmax_sink"), {"sink": 1.5}, inp)
    assert plan is not None and plan.factor == 1.0 and plan.sink == 1.5
    assert sdpa.sdpa_plan(registry.get("softmax"), {"temperature": 0.5}, inp) == sdpa.SdpaPlan(2.0)
    assert sdpa.sdpa_plan(registry.get("multimax"), {}, inp) == sdpa.SdpaPlan(1.0)   # t = 0: softmax
    assert sdpa.sdpa_plan(registry.get("multimax"), {"t": (0.0, 0.0, 0.1, 0.0)}, inp) is None
    row = sdpa.sdpa_plan(registry.get("ssmax"), {"s": 0.5}, inp)
    torch.testing.assert_close(row.row_scale.reshape(-1), torch.full((9,), 0.5 * math.log(9), dtype=q.dtype))


@pytest.mark.parametrize("case", ["causal_gqa", "decoding", "bool_mask", "additive_mask", "cross"])
def test_multimax_without_modulation_is_softmax_on_sdpa(case):
    """MultiMax with every ``t`` the number 0 (its functional default) is plain softmax, exactly:
    SDPA runs it (``"auto"`` takes another path for the gradient of a row of finfo.min fills:
    :func:`~softmaxkit.attention.sdpa.sdpa_backward_drifts`), and outputs and q, k, v gradients
    equal the dense reference's."""
    q, k, v, kw = _scenario(case)
    assert auto_method(q, k, v, "multimax", **kw) == "sdpa"

    def run(method):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*inputs, "multimax", method=method, r=(0.5, -0.5, 1.0, 2.0), **kw)
        weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
        return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), inputs))

    for a, b in zip(run("auto"), run("dense")):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("params", [{"t": (0.0, 0.1, 0.0, 0.0)}, {"t": torch.zeros(4)},
                                    {"r": torch.zeros(4)}], ids=["modulated", "tensor_t", "tensor_r"])
def test_multimax_with_modulation_or_tensor_parameters_stays_off_sdpa(params):
    """A nonzero ``t`` modulates the scores; a tensor ``r`` or ``t`` may be learned (its gradient
    is wanted even where ``t = 0``): both take the fused path, which equals dense."""
    q, k, v = _qkv()
    assert auto_method(q, k, v, "multimax", is_causal=True, **params) != "sdpa"
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    tensors = {n: t.clone().requires_grad_() for n, t in params.items() if isinstance(t, torch.Tensor)}
    given = dict(params, **tensors)
    grads = {}
    for method in ("auto", "dense"):
        out = sk.attention(*leaves, "multimax", is_causal=True, method=method, **given)
        grads[method] = [out] + list(torch.autograd.grad(out.sum(), leaves + list(tensors.values())))
    for a, b in zip(grads["auto"], grads["dense"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_sink_on_views_whose_last_axis_is_strided(which):
    """torch's CPU flash kernel, called directly, reads rows as contiguous: a view whose last axis
    has another stride (a transpose made contiguous and transposed back) read other memory."""
    q, k, v = _qkv()
    strided = {name: t.transpose(-1, -2).contiguous().transpose(-1, -2) if name == which else t
               for name, t in zip("qkv", (q, k, v))}
    assert strided[which].stride(-1) != 1
    for a, b in zip(_run("sdpa", *strided.values(), 0.5), _run("dense", q, k, v, 0.5)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "ssmax"])
def test_per_row_factor_in_a_wider_dtype_than_the_inputs(name, dtype):
    """A float64 per-head parameter (``torch.tensor`` of a numpy array) with float32 or bfloat16
    inputs: the queries keep their dtype (SDPA wants one dtype for q, k and v), as on the other paths."""
    q, k, v = (t.to(dtype) for t in _qkv())
    param = torch.tensor([0.5, 2.0, 1.0, 1.5], dtype=torch.float64).view(4, 1, 1)
    params = {"temperature": param} if name == "softmax" else {"s": param}
    got = sk.attention(q, k, v, name, method="sdpa", **params)
    want = sk.attention(q, k, v, name, method="dense", **params)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, **({} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}))


@pytest.mark.parametrize("dtype,fill", [(torch.float16, -1e9), (torch.bfloat16, torch.finfo(torch.float32).min),
                                        (torch.float16, torch.finfo(torch.float32).min)])
def test_a_float32_fill_past_the_range_of_half_inputs(dtype, fill):
    """A float32 mask fill that float16 / bfloat16 cannot hold: cast as it was, it became -inf on
    SDPA, and a padded query (every key filled) output 0 where the other paths give the mean of
    v (uniform weights). ``auto`` takes another path; ``sdpa`` keeps the fill at the dtype's
    lowest number, so the row stays visible."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16, generator=gen).to(dtype) for _ in range(3))
    mask = torch.zeros(1, 1, 6, 6)
    mask[..., 3:] = fill
    mask[..., 5, :] = fill
    with torch.no_grad():
        dense = sk.attention(q, k, v, attn_mask=mask, method="dense")
        auto = sk.attention(q, k, v, attn_mask=mask)
        sdpa = sk.attention(q, k, v, attn_mask=mask, method="sdpa")
    assert auto_method(q, k, v, attn_mask=mask) != "sdpa"
    torch.testing.assert_close(auto.float(), dense.float(), atol=2e-2, rtol=0)
    torch.testing.assert_close(dense[..., 5, :].float(), v.float().mean(-2), atol=2e-2, rtol=0)
    assert sdpa[..., 5, :].abs().sum() > 0
    torch.testing.assert_close(sdpa[..., :5, :].float(), dense[..., :5, :].float(), atol=2e-2, rtol=0)


def test_auto_method_names_the_path_attention_runs_for_a_padded_query_with_gradients():
    """A float mask with a padded query (-1e9 fill) and gradients wanted: attention() leaves
    SDPA (its backward drifts there), and auto_method says so."""
    q, k, v = (torch.randn(1, 2, 6, 16) for _ in range(3))
    q.requires_grad_()
    mask = torch.zeros(1, 1, 6, 6)
    mask[:, :, 5, :] = -1e9
    assert auto_method(q, k, v, attn_mask=mask) == "dense"
    with torch.no_grad():
        assert auto_method(q, k, v, attn_mask=mask) == "sdpa"


def test_sdpa_gets_the_mask_unexpanded_and_the_callers_tensors():
    """2026-12-04: the mask reached SDPA expanded to (B, H, Lq, Lk), which SDPA turned into an
    additive mask of that size (forward + backward 1.4x SDPA's own on the CPU); and float16 /
    bfloat16 inputs were converted to float32 before SDPA, which takes the caller's tensors
    (300 us of a 480 us forward on an H200)."""
    from softmaxkit.attention import inputs, sdpa

    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    assert sdpa.compact(mask.expand(2, 3, 6, 6)).shape == (1, 1, 6, 6)
    assert sdpa.compact(torch.ones(2, 1, 6, 6, dtype=torch.bool).expand(2, 3, 6, 6)).shape == (2, 1, 6, 6)
    assert sdpa.compact(None) is None
    made = []
    original = inputs.AttentionInputs._all_heads

    def spy(self, t):
        made.append(t.shape)
        return original(self, t)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(3))
    for kw in ({"is_causal": True}, {"attn_mask": mask}):
        expected = sk.attention(q.float(), k.float(), v.float(), "softmax", method="dense", **kw)
        assert auto_method(q, k, v, "softmax", **kw) == "sdpa"
        try:
            inputs.AttentionInputs._all_heads = spy
            out = sk.attention(q, k, v, "softmax", **kw)
        finally:
            inputs.AttentionInputs._all_heads = original
        assert not made
        torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_all_finite_reads_nan_and_infinities(dtype):
    from softmaxkit.kernels.dispatch import all_finite

    x = torch.randn(3, 50).to(dtype)
    assert all_finite(x) and all_finite(x.t()) and all_finite(x[:0])
    for bad in (float("nan"), float("inf"), float("-inf")):
        y = x.clone()
        y[2, 7] = bad
        assert not all_finite(y) and not all_finite(y.t()) and not all_finite(y[2:, 7:8])


def test_seen_keys_and_queries_equal_any_over_the_visible_entries():
    """The mask's reductions by ``amax`` (2026-12-04; ``any`` over a bool copy took 1 ms of a
    1024 x 1024 float mask) equal ``any`` of the visible entries: NaN counts as visible,
    ``-inf`` and False as hidden, empty axes give nothing seen; and a padding mask that leaves
    every query a key returns ``q`` itself (no copy)."""
    from softmaxkit.attention.inputs import _seen_keys_and_queries, hide_keys, zero_unseen

    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 3, 5, 7, generator=g)
    base[0, 0, 1] = float("-inf")
    base[1, 2, :, 4] = float("-inf")
    base[0, 1, 2, 3] = float("nan")
    base[1, 1, 3] = float("nan")
    masks = [base, base > 0, base.half(), (base > 0)[:1, :1].expand(2, 3, 5, 7), base[:, :, :0], base[..., :0],
             torch.ones(1, 1, 5, 7, dtype=torch.bool)]
    for mask in masks:
        seen = mask if mask.dtype == torch.bool else mask != float("-inf")
        keys, queries = _seen_keys_and_queries(mask)
        assert torch.equal(keys, seen.any(-2)) and torch.equal(queries, seen.any(-1, keepdim=True))
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    padding = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    padding[1, ..., 3:] = False
    q2, keys, seen = zero_unseen(q, k, v, padding)
    assert q2 is q and seen is None and keys.shape == (2, 1, 5, 1) and keys[1, 0, 3:].eq(False).all()
    k2, v2 = hide_keys(k, v, keys)
    assert k2[1, :, 3:].eq(0).all() and v2[1, :, 3:].eq(0).all() and torch.equal(k2[0], k[0])


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), 1e30, -3e38])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_key_padding_on_sdpa_keeps_garbage_in_hidden_slots_out(garbage, dtype):
    """SDPA takes the hidden keys and values as they are only when they cannot reach the result
    (2026-12-04: zeroing them copied k and v, 2 ms of 15): a NaN, an infinity or a finite value
    whose score overflows in a hidden slot still gives the dense reference's output and
    gradients, on every row."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    padding = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    padding[1, ..., 4:] = False
    for target in ("k", "v", "none"):
        kk, vv = k.clone(), v.clone()
        if target == "k":
            kk[1, :, 4:] = garbage
        elif target == "v":
            vv[1, :, 4:] = garbage
        leaves = [t.to(dtype).requires_grad_() for t in (q, kk, vv)]
        out = sk.attention(*leaves, "softmax", attn_mask=padding)
        grads = torch.autograd.grad(out.float().sum(), leaves)
        clean = [t.to(dtype).double().requires_grad_() for t in (q, k, v)]
        expected = sk.attention(*clean, "softmax", attn_mask=padding, method="dense")
        expected_grads = torch.autograd.grad(expected.sum(), clean)
        tol = {torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}, torch.float32: {"atol": 1e-5, "rtol": 1e-4},
               torch.float64: {}}[dtype]
        torch.testing.assert_close(out.double(), expected, **tol)
        for got, want in zip(grads, expected_grads):
            want = want.clone()
            assert torch.isfinite(got).all()
            if target != "none":   # (the hidden slots' gradients are 0 where they are zeroed)
                got = got.double().clone()
                got[1, :, 4:] = 0
                want[1, :, 4:] = 0
            torch.testing.assert_close(got.double(), want, **tol)
