"""sk.linear_attention: every method equals its own quadratic form (float64, 1e-10),
gradients included; masks, GQA, dtypes, hostile and empty inputs, bad input."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.linear import draw_projection

from ._quadratic import attention as quadratic

KERNELISED = ["linear", "performer", "cosformer", "inline", "mala"]


def _params(method, d, dtype=torch.float64):
    if method == "performer":
        return {"projection": draw_projection(12, d, generator=torch.Generator().manual_seed(3), dtype=dtype)}
    return {}


def _qkv(b=2, h=4, hk=2, lq=37, lk=37, d=8, dv=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hk, lk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hk, lk, dv, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("method", KERNELISED)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_quadratic_form(method, causal, masked):
    q, k, v = _qkv()
    params = _params(method, q.shape[-1])
    key_mask = None
    if masked:
        key_mask = torch.rand(2, 1, 1, 37, generator=torch.Generator().manual_seed(1)) > 0.3
        key_mask[1, ..., :5] = False  # the first queries of batch 1 see nothing when causal
    out = sk.linear_attention(q, k, v, method, is_causal=causal, attn_mask=key_mask, chunk_size=8, **params)
    ref = quadratic(method, q, k, v, causal, key_mask, **params)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", KERNELISED)
@pytest.mark.parametrize("lq,lk", [(5, 23), (23, 5), (1, 17)])
def test_causal_is_end_aligned_for_unequal_lengths(method, lq, lk):
    q, k, v = _qkv(lq=lq, lk=lk)
    params = _params(method, q.shape[-1])
    if method == "cosformer":
        params = {"max_len": 30}
    out = sk.linear_attention(q, k, v, method, is_causal=True, chunk_size=4, **params)
    torch.testing.assert_close(out, quadratic(method, q, k, v, True, **params), rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", KERNELISED)
def test_query_varying_mask_uses_the_quadratic_form(method):
    q, k, v = _qkv(lq=9, lk=11)
    params = _params(method, q.shape[-1])
    mask = torch.rand(2, 4, 9, 11, generator=torch.Generator().manual_seed(2)) > 0.4
    out = sk.linear_attention(q, k, v, method, attn_mask=mask, **params)
    torch.testing.assert_close(out, quadratic(method, q, k, v, False, mask, **params), rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", KERNELISED)
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(method, causal):
    q, k, v = _qkv(b=1, h=2, hk=1, lq=7, lk=7, d=3, dv=2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    params = _params(method, 3)
    mask = torch.tensor([True, True, False, True, True, True, True])[None, None, None]
    torch.autograd.gradcheck(
        lambda a, b_, c: sk.linear_attention(a, b_, c, method, is_causal=causal, attn_mask=mask, chunk_size=3,
                                             **params), (q, k, v))


@pytest.mark.parametrize("method", KERNELISED + ["soft"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_computes_in_float32(method, dtype):
    q, k, v = _qkv(lq=16, lk=16, dtype=torch.float32)
    params = {"rank": 4} if method == "soft" else _params(method, 8, torch.float32)
    out = sk.linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), method, **params)
    ref = sk.linear_attention(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), method, **params)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("method", KERNELISED)
@pytest.mark.parametrize("causal", [False, True])
def test_hostile_inputs_stay_finite(method, causal):
    q, k, v = _qkv(lq=20, lk=20, dtype=torch.float32)
    q[0, 0, 3] = 1e4
    k[0, 0, 5] = -1e4
    k[1, 1, 7] = 1e4
    params = _params(method, 8, torch.float32)
    out = sk.linear_attention(q, k, v, method, is_causal=causal, **params)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("method", KERNELISED + ["soft"])
def test_all_masked_rows_are_zero_and_empty_dims(method):
    q, k, v = _qkv(lq=6, lk=6)
    params = {"rank": 2} if method == "soft" else _params(method, 8)
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    mask[0] = True
    out = sk.linear_attention(q, k, v, method, attn_mask=mask, **params)
    assert torch.isfinite(out).all() and (out[1] == 0).all() and (out[0] != 0).any()
    empty = sk.linear_attention(q[:, :, :0], k, v, method, **({} if method == "soft" else params))
    assert empty.shape == (2, 4, 0, 5)


def test_chunk_size_does_not_change_the_result():
    q, k, v = _qkv(lq=50, lk=50)
    outs = [sk.linear_attention(q, k, v, "mala", is_causal=True, chunk_size=c) for c in (1, 7, 64, 200)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=0, atol=1e-12)


def test_performer_generator_reproducible_and_redrawn():
    q, k, v = _qkv(dtype=torch.float32)
    a = sk.linear_attention(q, k, v, "performer", generator=torch.Generator().manual_seed(5))
    b = sk.linear_attention(q, k, v, "performer", generator=torch.Generator().manual_seed(5))
    c = sk.linear_attention(q, k, v, "performer", generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.allclose(a, c)


@pytest.mark.parametrize("bad,match", [
    ({"method": "nope"}, "unknown linear attention method 'nope'; accepted: linear, performer"),
    ({"method": "soft", "is_causal": True}, "no causal form"),
    ({"method": "soft", "rank": 40}, "rank=40 must be at most the sequence length"),
    ({"method": "soft", "rank": 0}, "rank must be a positive int"),
    ({"method": "performer", "nb_features": 0}, "nb_features must be a positive int"),
    ({"method": "inline", "kernel": "tanh"}, "kernel must be one of identity, relu, leakyrelu, exp"),
    ({"method": "cosformer", "max_len": 10}, "beyond max_len=10"),
    ({"method": "linear", "chunk_size": 0}, "chunk_size must be a positive int"),
    ({"method": "linear", "eps": -1.0}, "eps must be a finite number > 0"),
    ({"method": "linear", "eps": float("inf")}, "eps must be a finite number > 0"),
    ({"method": "performer", "scale": -1.0}, "performer needs scale >= 0"),
    ({"method": "performer", "projection": torch.randn(0, 8, dtype=torch.float64)}, "nb_features >= 1"),
    ({"method": "performer", "projection": torch.full((16, 8), float("nan"), dtype=torch.float64)},
     "projection must be finite"),
])
def test_bad_input_value_error(bad, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        sk.linear_attention(q, k, v, **bad)


def test_bad_input_type_error():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="unexpected parameter"):
        sk.linear_attention(q, k, v, "linear", rank=3)
    with pytest.raises(TypeError, match="bool attn_mask"):
        sk.linear_attention(q, k, v, "linear", attn_mask=torch.zeros(37, 37))
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        sk.linear_attention(q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1), "linear")


def test_soft_rejects_query_varying_masks():
    q, k, v = _qkv(lq=8, lk=8)
    with pytest.raises(ValueError, match="key-padding"):
        sk.linear_attention(q, k, v, "soft", rank=2, attn_mask=torch.ones(8, 8, dtype=torch.bool).tril())


def test_softmaxkit_list_prints_the_linear_methods(capsys):
    from softmaxkit.cli import main

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("method "))
    rows = lines[header + 2: header + 2 + len(sk.linear.methods())]
    assert [row.split()[0] for row in rows] == [m.name for m in sk.linear.methods()]
    assert rows[-1].split()[0] == "soft" and "  no  " in rows[-1]   # SOFT: not causal, no decoding


@pytest.mark.parametrize("method", KERNELISED)
def test_attention_weights_are_the_quadratic_forms(method):
    from softmaxkit.linear import attention_weights

    from ._quadratic import weights

    q, k, _ = _qkv(lq=9, lk=9)
    params = _params(method, 8)
    got = attention_weights(q, k, method, is_causal=True, **params)
    torch.testing.assert_close(got, weights(method, q, k, True, **params), rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", KERNELISED)
@pytest.mark.parametrize("causal", [False, True])
def test_vmap_over_the_key_mask_equals_a_loop(method, causal):
    """The zero output of a query that sees no key branched on the mask's values: ``vmap`` over
    the mask raised (data-dependent control flow)."""
    q, k, v = _qkv(b=2, h=2, hk=1, lq=6, lk=6, d=3, dv=2)
    params = _params(method, 3)
    masks = torch.rand(3, 2, 1, 1, 6, generator=torch.Generator().manual_seed(4)) > 0.4
    masks[0, 1] = False   # a batch whose queries see no key

    def attend(mask):
        return sk.linear_attention(q, k, v, method, is_causal=causal, attn_mask=mask, chunk_size=4, **params)

    torch.testing.assert_close(torch.func.vmap(attend)(masks), torch.stack([attend(m) for m in masks]),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", KERNELISED + ["soft"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "keys", "queries"])
def test_meta_tensors_give_the_output_shape(method, causal, mask):
    """Shape inference on the meta device: the zero output of a query without keys, performer's
    finite-projection check, cosformer's position check and SOFT's convergence test read values."""
    if method == "soft" and (causal or mask == "queries"):
        pytest.skip("SOFT is not causal and takes key-padding masks only")
    q, k, v = (t.to("meta") for t in _qkv(b=2, h=4, hk=2, lq=5, lk=7, d=3, dv=2))
    params = {"rank": 2} if method == "soft" else {n: p.to("meta") for n, p in _params(method, 3).items()}
    shape = {None: None, "keys": (2, 1, 1, 7), "queries": (2, 4, 5, 7)}[mask]
    attn_mask = None if shape is None else torch.ones(shape, dtype=torch.bool, device="meta")
    out = sk.linear_attention(q, k, v, method, is_causal=causal, attn_mask=attn_mask, **params)
    assert out.device.type == "meta" and out.shape == (2, 4, 5, 2) and out.dtype == torch.float64


@pytest.mark.parametrize("method", KERNELISED)
def test_decoding_on_meta_tensors_gives_the_output_shape(method):
    q, k, v = (t.to("meta") for t in _qkv(b=2, h=4, hk=2, lq=5, lk=5, d=3, dv=2))
    params = {"max_len": 8} if method == "cosformer" else {n: p.to("meta") for n, p in _params(method, 3).items()}
    state = sk.linear.LinearAttentionState(method, **params)
    state.step(q[:, :, :3], k[:, :, :3], v[:, :, :3], key_mask=torch.ones(2, 3, dtype=torch.bool, device="meta"))
    out = state.step(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:])
    assert out.device.type == "meta" and out.shape == (2, 4, 2, 2)
