"""sk.attention: argument checks, the choice of path, and softmax through torch SDPA."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.attention import api, sdpa


def _qkv(b=2, h=4, hk=4, lq=6, lk=6, d=8, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=gen, dtype=dtype),
            torch.randn(b, hk, lk, d, generator=gen, dtype=dtype),
            torch.randn(b, hk, lk, d, generator=gen, dtype=dtype))


def test_plain_softmax_goes_to_sdpa_and_matches_dense(monkeypatch):
    calls = []
    original = sdpa.torch_f.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(sdpa.torch_f, "scaled_dot_product_attention", recording)
    q, k, v = _qkv(hk=2)
    pad = torch.rand(2, 1, 1, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    for causal, mask in ((True, None), (False, pad)):
        out = sk.attention(q, k, v, is_causal=causal, attn_mask=mask)
        ref = sk.attention(q, k, v, is_causal=causal, attn_mask=mask, method="dense")
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert len(calls) == 2 and calls[0]["enable_gqa"]


def test_softmax_with_a_number_temperature_runs_on_sdpa_with_a_scaled_scale(monkeypatch):
    q, k, v = _qkv(lq=130, lk=130, b=1, h=1, hk=1)
    additive = torch.randn(130, 130, dtype=q.dtype, generator=torch.Generator().manual_seed(3))
    for mask, causal in ((None, True), (additive, False)):
        out = sk.attention(q, k, v, temperature=0.5, is_causal=causal, attn_mask=mask, method="sdpa")
        ref = sk.attention(q, k, v, temperature=0.5, is_causal=causal, attn_mask=mask, method="dense")
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_softmax_with_a_tensor_temperature_and_an_additive_mask_avoids_sdpa(monkeypatch):
    """A per-head temperature runs on SDPA with scaled queries (tests/attention/test_sdpa.py), but
    not with an additive mask, which the temperature scales too."""
    monkeypatch.setattr(api, "run_sdpa", lambda *a: pytest.fail("SDPA used for a tensor temperature"))
    monkeypatch.setattr(api, "dense_attention", lambda *a: pytest.fail("dense path for a long input"))
    q, k, v = _qkv(lq=130, lk=130, b=1, h=2, hk=1)
    t = torch.tensor([0.5, 2.0], dtype=q.dtype).reshape(2, 1, 1)
    mask = torch.randn(130, 130, dtype=q.dtype, generator=torch.Generator().manual_seed(2))
    out = sk.attention(q, k, v, temperature=t, attn_mask=mask)
    monkeypatch.undo()
    ref = sk.attention(q, k, v, temperature=t, attn_mask=mask, method="dense")
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_short_inputs_take_the_dense_path_in_auto(monkeypatch):
    monkeypatch.setattr(api, "streaming_attention", lambda *a, **kw: pytest.fail("short input streamed"))
    q, k, v = _qkv(lq=128, lk=128, b=1, h=1, hk=1)
    sk.attention(q, k, v, "softpick", is_causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_score_matrices_with_full_tiles_take_the_fused_row_kernels_in_auto(dtype):
    """Decoding against a long cache (Lq = 1) and many heads of short rows are "small" by
    Lq x Lk, but their tiles are full: auto takes the fused row kernels, which match dense.
    Few scores a tile (one short head, a few tiny heads) and the threshold family keep the
    dense reference."""
    from softmaxkit.attention.api import auto_method

    gen = torch.Generator().manual_seed(3)

    def qkv(b, h, lq, lk, d=16):
        return tuple(torch.randn(b, h, n, d, generator=gen, dtype=dtype) for n in (lq, lk, lk))

    decode, heads = qkv(4, 8, 1, 2048), qkv(8, 4, 128, 128)
    for q, k, v in (decode, heads):
        for name in ("stablemax", "sigmoid", "softpick"):
            assert auto_method(q, k, v, name, is_causal=True) == "fused"
            torch.testing.assert_close(sk.attention(q, k, v, name, is_causal=True),
                                       sk.attention(q, k, v, name, is_causal=True, method="dense"))
        assert auto_method(q, k, v, "sparsemax") == "dense"
    for q, k, v in (qkv(1, 1, 64, 64), qkv(3, 2, 8, 32), qkv(1, 2, 1, 1024)):
        assert auto_method(q, k, v, "stablemax") == "dense"
    q, k, v = decode
    assert auto_method(q, k, v, "ssmax", s=torch.full((1, 1, 1, 2048), 0.4, dtype=dtype)) == "dense"


def test_causal_decoding_query_sees_the_whole_cache():
    q, k, v = _qkv(lq=1, lk=10)
    for name in ("softmax", "softpick"):
        torch.testing.assert_close(sk.attention(q, k, v, name, is_causal=True), sk.attention(q, k, v, name),
                                   rtol=0, atol=1e-12)


def test_causal_with_fewer_queries_is_aligned_to_the_end():
    q, k, v = _qkv(lq=3, lk=7)
    out = sk.attention(q, k, v, "softmax", is_causal=True)
    explicit = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4)
    torch.testing.assert_close(out, sk.attention(q, k, v, attn_mask=explicit, method="dense"), rtol=0, atol=1e-12)


def test_sparse_softmax_takes_the_dense_path(monkeypatch):
    monkeypatch.setattr(api, "streaming_attention", lambda *a, **kw: pytest.fail("sparse_softmax streamed"))
    q, k, v = _qkv()
    out = sk.attention(q, k, v, "sparse_softmax", is_causal=True, k=2)
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    p = sk.normalize(scores, "sparse_softmax", mask=torch.ones(6, 6, dtype=torch.bool).tril(), k=2)
    torch.testing.assert_close(out, p @ v, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="no streaming path"):
        sk.attention(q, k, v, "sparse_softmax", k=2, method="streaming")


def test_parameters_that_vary_per_query_use_the_dense_path():
    q, k, v = _qkv()
    s = torch.rand(1, 1, 6, 1, dtype=torch.float64) + 0.2
    out = sk.attention(q, k, v, "ssmax", s=s)
    torch.testing.assert_close(out, sk.attention(q, k, v, "ssmax", s=s, method="dense"), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="no streaming path"):
        sk.attention(q, k, v, "ssmax", s=s, method="streaming")


@pytest.mark.parametrize("kwargs,error,match", [
    ({"normalizer": "nope"}, ValueError, "registered names"),
    ({"normalizer": "softpick", "temperature": 2.0}, TypeError, "unexpected parameter"),
    ({"normalizer": "softmax", "temperature": -1.0}, ValueError, "temperature"),
    ({"method": "fast"}, ValueError, "method must be one of"),
    ({"block_size": 0}, ValueError, "block_size"),
    ({"attn_mask": torch.ones(3, 5, dtype=torch.bool)}, ValueError, "attn_mask"),
    ({"attn_mask": torch.ones(6, 6, dtype=torch.long)}, TypeError, "attn_mask"),
    ({"is_causal": 1}, TypeError, "is_causal"),
    ({"scale": "big"}, TypeError, "scale"),
    ({"normalizer": "softpick", "method": "sdpa"}, ValueError, "sdpa"),
])
def test_bad_arguments_raise_with_the_argument_named(kwargs, error, match):
    q, k, v = _qkv()
    with pytest.raises(error, match=match):
        sk.attention(q, k, v, **kwargs)


def test_bad_shapes_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        sk.attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="head dimension"):
        sk.attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match=r"\(B, H, L, D\)"):
        sk.attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="share a dtype"):
        sk.attention(q.float(), k, v)


@pytest.mark.parametrize("method", ["auto", "dense", "fused", "streaming"])
@pytest.mark.parametrize("b,lq,lk,hide_all", [(1, 5, 0, False), (0, 5, 7, False), (1, 0, 7, False), (1, 5, 7, True)])
def test_parameters_get_a_zero_gradient_when_no_score_is_visible(method, b, lq, lk, hide_all):
    """Empty dims or every key hidden: output 0, and every input that requires grad, per-head
    parameters included, gets a zero gradient (``autograd.grad`` without ``allow_unused``)."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(b, 2, lq, 4, generator=gen, dtype=torch.float64).requires_grad_()
    k, v = (torch.randn(b, 2, lk, 4, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    s = torch.tensor([0.3, 0.6], dtype=torch.float64).view(2, 1, 1).requires_grad_()
    mask = torch.zeros(1, 1, 1, lk, dtype=torch.bool) if hide_all else None
    out = sk.attention(q, k, v, "ssmax", attn_mask=mask, method=method, s=s)
    assert out.shape == (b, 2, lq, 4) and not out.abs().sum()
    grads = torch.autograd.grad((out * 2).sum(), [q, k, v, s])
    for g, t in zip(grads, (q, k, v, s)):
        assert g.shape == t.shape and not g.abs().sum()


def test_no_keys_at_all_give_zeros_whatever_k():
    """With Lk = 0 every row is empty: sparse_softmax's k (checked against the row length on
    nonempty rows) does not make the dense path refuse what the fused path returns."""
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    k = v = torch.randn(1, 2, 0, 4, dtype=torch.float64)
    for method in ("auto", "dense", "fused"):
        out = sk.attention(q, k, v, "sparse_softmax", method=method, k=2)
        assert torch.equal(out, torch.zeros(1, 2, 3, 4, dtype=torch.float64)), method


@pytest.mark.parametrize("name", ["ssmax", "sparsemax", "softpick", "softmax"])
def test_a_learned_additive_mask_gets_its_gradient(name):
    """A float attn_mask that requires grad (a learned bias) is differentiated on the default
    path, as by dense; the fused and streaming paths, which take it as a constant, refuse it."""
    from softmaxkit.attention.api import auto_method

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 160, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 2, 160, 160, generator=gen, dtype=torch.float64).requires_grad_()
    assert auto_method(q, k, v, name, attn_mask=bias) in ("sdpa", "dense")
    (got,) = torch.autograd.grad(sk.attention(q, k, v, name, attn_mask=bias).sum(), bias)
    (want,) = torch.autograd.grad(sk.attention(q, k, v, name, attn_mask=bias, method="dense").sum(), bias)
    torch.testing.assert_close(got, want)
    assert got.abs().sum() > 0
    for method in ("fused", "streaming"):
        with pytest.raises(ValueError, match="attn_mask requires grad"):
            sk.attention(q, k, v, name, attn_mask=bias, method=method)
    with torch.no_grad():   # no gradient wanted: the constant-mask paths run
        torch.testing.assert_close(sk.attention(q, k, v, name, attn_mask=bias, method="fused"),
                                   sk.attention(q, k, v, name, attn_mask=bias, method="dense"))


@pytest.mark.parametrize("method, block", [("fused", 2), ("streaming", (2, 4))])
@pytest.mark.parametrize("name", ["softpick", "user_exp_gate"])
def test_hidden_scores_that_overflow_a_piece_leave_gradients_finite(name, method, block):
    """A hidden raw score (200: past the causal diagonal and padded) overflows e^{x - 3} (and
    softpick's e^{x - c}) in float32. The paths that evaluate a piece or rule on the whole tile
    must make hidden scores finite first, or inf * 0 turns the row's gradients into NaN."""
    sk.register_normalizer("user_exp_gate", family="elementwise", h=lambda x: torch.exp(x - 3.0),
                           dh=lambda x: torch.exp(x - 3.0))
    try:
        q = torch.ones(1, 1, 4, 1, requires_grad=True)
        k = torch.tensor([-5.0, -4.0, -3.0, 200.0]).view(1, 1, 4, 1).requires_grad_()
        v = torch.linspace(-1, 1, 8).view(1, 1, 4, 2).requires_grad_()
        pad = torch.tensor([True, True, True, False])  # the large key is hidden from every query
        res = []
        for how in ("dense", method):
            out = sk.attention(q, k, v, name, is_causal=True, attn_mask=pad, scale=1.0, method=how, block_size=block)
            res.append((out, torch.autograd.grad(out.sum(), [q, k, v])))
        torch.testing.assert_close(res[1][0], res[0][0])
        for got, want in zip(res[1][1], res[0][1]):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want)
    finally:
        sk.unregister_normalizer("user_exp_gate")


def test_parameter_checks_hold_on_every_call():
    """Accepted number parameters are remembered per normalizer, row length and dtype, so a call
    with the same ones skips the check; bad values and a k beyond a shorter row still raise."""
    q, k, v = _qkv(lq=4, lk=6)
    for _ in range(2):
        sk.attention(q, k, v, "ssmax", s=0.5)
        with pytest.raises(ValueError, match="s"):
            sk.attention(q, k, v, "ssmax", s=float("nan"))
    sk.attention(q, k, v, "sparse_softmax", k=5)
    short = _qkv(lq=4, lk=3)
    with pytest.raises(ValueError, match="k"):
        sk.attention(*short, "sparse_softmax", k=5)
    sk.attention(q.float(), k.float(), v.float(), "sparse_softmax", k=5)


@pytest.mark.parametrize("normalizer, params", [("softmax", {}), ("softmax", {"temperature": 0.5}), ("ssmax", {}),
                                                ("softmax_sink", {})])
def test_scores_that_round_the_logsumexp_leave_sdpa_when_gradients_are_wanted(normalizer, params):
    """One key 1e3 times the others and ``scale=1e3`` (scores near 1e7): torch's CPU flash
    backward rebuilds the weights from a logsumexp rounded at that magnitude, and ``auto`` on
    SDPA gave ``dq`` 0.66 and ``dv`` 0.28 off in float32 where dense and fused are exact (found
    by a differential fuzz of the methods, 2026-12-04). Such calls leave SDPA; ordinary scores
    and calls without a gradient stay on it."""
    from softmaxkit.attention.api import auto_method

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 160, 32, generator=g, dtype=torch.float64) for _ in range(3))
    k[:, :, 7] *= 1e3
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    assert auto_method(*leaves, normalizer, scale=1e3, **params) != "sdpa"
    assert auto_method(*(t.float() for t in (q, k, v)), normalizer, scale=1e3, **params) == "sdpa"
    assert auto_method(*leaves, normalizer, **params) == "sdpa"   # scale 1 / sqrt(32): scores near 1e3

    def grads(tensors, method):
        out = sk.attention(*tensors, normalizer, scale=1e3, method=method, **params)
        return torch.autograd.grad(out, tensors, torch.ones_like(out))

    exact = grads([t.requires_grad_() for t in (q, k, v)], "dense")
    # FlashAttention's rule: at most 3x the error of dense float32 against float64 (SDPA: 1e3x)
    for got, dense, want in zip(grads(leaves, "auto"), grads(leaves, "dense"), exact):
        assert (got.double() - want).abs().max() <= 3 * (dense.double() - want).abs().max() + 1e-5


@pytest.mark.parametrize("method", ["auto", "sdpa", "dense", "streaming", "fused"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float64])
def test_a_mask_without_data_is_named(method, dtype):
    """Hostile sweep 2026-12-05: an attn_mask left on the meta device beside CPU q, k, v raised
    torch's NotImplementedError "Cannot copy out of meta tensor; no data!" on every method."""
    q, k, v = _qkv(b=1, h=2, hk=2, lq=4, lk=6)
    mask = torch.ones(4, 6, dtype=dtype, device="meta")
    with pytest.raises(ValueError, match="attn_mask is a meta tensor without data"):
        sk.attention(q, k, v, attn_mask=mask, method=method)
    with pytest.raises(ValueError, match="temperature is a meta tensor without data"):
        sk.attention(q, k, v, temperature=torch.ones(2, 1, 1, dtype=q.dtype, device="meta"), method=method)
