"""The streaming path equals the dense reference, outputs and gradients, for every rule."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.attention import streaming
from softmaxkit.attention.rules import rule_for
from tests.conftest import learnable_tensors

D = 5
BLOCKS = (3, 4)  # several query and key tiles even at these small lengths


def _per_head(h, value, gen):
    return (value + 0.3 * torch.randn(h, 1, 1, generator=gen, dtype=torch.float64)).requires_grad_()


def _per_head_values(name, h, gen):
    """Each learnable parameter of ``name``, one value per head near its initial value, learnable."""
    out = {}
    for key, value in learnable_tensors(name).items():
        lead = value.shape  # (4,) for MultiMax's r and t
        noise = 0.1 * torch.randn(*lead, h, 1, 1, generator=gen, dtype=torch.float64)
        spec = sk.registry.get(name).param(key)
        raw = spec.learnable.to_raw(value.reshape(*lead, 1, 1, 1), key) + noise
        out[key] = spec.learnable.from_raw(raw).detach().requires_grad_()
    return out


#: Variants beyond each normalizer's learnable parameters: options that change its rule.
VARIANTS = [
    ("softmax", {"temperature": 0.7}),
    ("adaptive_softmax", {"detach_beta": True}),
    ("sa_softmax", {"normalized": True}),
    ("clipped_softmax", {"gamma": -0.1, "zeta": 1.05}),
    ("sigmoid", {"bias": -1.5}),
    ("entmax", {"alpha": 1.3}),
]


def _configs(h, gen):
    """(name, params) for every streamable built-in normalizer (learnable parameters per head)
    and the variants."""
    configs = []
    for spec in sk.normalizers():
        if not spec.streamable or spec.user:
            continue
        params = _per_head_values(spec.name, h, gen)
        for key in list(params):  # a parameter that does not stream per head (a learnable alpha) keeps its default
            if spec.stream_rule(params) is None:
                trial = {k: v for k, v in params.items() if k != key}
                params = trial if spec.stream_rule(trial) is not None else params
        configs.append((spec.name, params))
    configs += [(name, dict(params)) for name, params in VARIANTS]
    configs.append(("softmax", {"temperature": _per_head(h, 1.0, gen).detach().abs().requires_grad_()}))
    return configs


N_CONFIGS = len(_configs(1, torch.Generator().manual_seed(0)))


def _scenario(kind, gen):
    """q, k, v, is_causal, attn_mask for one masking situation (float64, small, odd lengths)."""
    b, h, hk, lq, lk = 2, 4, 4, 7, 9
    mask, causal = None, False
    if kind == "causal":
        lq = lk = 11
        causal = True
    elif kind == "padding_gqa":
        hk = 2
        mask = torch.rand(b, 1, 1, lk, generator=gen) > 0.3
        mask[1] = False  # the whole second batch sees nothing: zero rows
    elif kind == "causal_padding_gqa":
        hk, causal = 1, True
        mask = torch.rand(b, 1, lq, lk, generator=gen) > 0.25
    elif kind == "decode":
        lq, causal = 1, True
    elif kind == "additive":
        mask = torch.randn(1, h, lq, lk, generator=gen, dtype=torch.float64)
        mask[..., 2, :] = float("-inf")
        mask[..., 0, 3:] = float("-inf")
    elif kind == "causal_more_queries":
        lq, lk, causal = 9, 6, True  # the first 3 queries see no key (end-aligned diagonal)
    q = (2.0 * torch.randn(b, h, lq, D, generator=gen, dtype=torch.float64)).requires_grad_()
    k = torch.randn(b, hk, lk, D, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(b, hk, lk, D, generator=gen, dtype=torch.float64).requires_grad_()
    return q, k, v, causal, mask


SCENARIOS = ["causal", "padding_gqa", "causal_padding_gqa", "decode", "additive", "causal_more_queries"]


def _run(q, k, v, name, causal, mask, params, method):
    out = sk.attention(q, k, v, name, is_causal=causal, attn_mask=mask, method=method, block_size=BLOCKS, **params)
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    tensors = [q, k, v] + [t for t in params.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    return out, torch.autograd.grad((out * weight).sum(), tensors)


# every rule meets three masking situations, rotating so that all six are covered many times
CASES = [(i, SCENARIOS[(i + j) % len(SCENARIOS)]) for i in range(N_CONFIGS) for j in (0, 2, 4)]


@pytest.mark.parametrize("index,scenario", CASES)
def test_streaming_equals_dense_float64(index, scenario):
    gen = torch.Generator().manual_seed(index * 7 + SCENARIOS.index(scenario))
    q, k, v, causal, mask = _scenario(scenario, gen)
    name, params = _configs(q.shape[1], gen)[index]
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    stream, stream_grads = _run(q, k, v, name, causal, mask, params, "streaming")
    assert torch.isfinite(stream).all()
    torch.testing.assert_close(stream, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(stream_grads, dense_grads):
        assert torch.isfinite(gs).all()
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["softpick", "ssmax", "adaptive_softmax", "sigmoid", "stablemax", "sparsemax"])
def test_streaming_equals_dense_float32(name):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 33, 16, generator=gen).requires_grad_() for _ in range(3))
    mask = torch.rand(1, 1, 33, 33, generator=gen) > 0.2
    runs = [_run(q, k, v, name, True, mask, {}, m) for m in ("dense", "streaming")]
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=0, atol=1e-5)
    # gradients: FlashAttention's rule against float64 (3x the dense float32 error, with a floor of
    # a few ulp of the gradient's scale): two float32 summation orders of an ill-conditioned row
    # (softpick's scores near 0) differ by more than a fixed 1e-5 between themselves
    exact = _run(*(t.detach().double().requires_grad_() for t in (q, k, v)), name, True, mask, {}, "dense")[1]
    for gs, gd, ge in zip(runs[1][1], runs[0][1], exact):
        floor = 8 * torch.finfo(torch.float32).eps * float(ge.abs().max())
        assert (gs.double() - ge).abs().max() <= 3 * (gd.double() - ge).abs().max() + floor


def test_configs_cover_every_streamable_normalizer():
    covered = {name for name, _ in _configs(2, torch.Generator().manual_seed(0))}
    assert covered == {spec.name for spec in sk.normalizers() if spec.streamable and not spec.user}


def test_rows_without_keys_are_zero_with_zero_gradient():
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 1:, :2] = True
    for name in ("softmax", "softpick", "sigmoid", "adaptive_softmax", "sa_softmax", "stablemax", "sparsemax"):
        out = sk.attention(q, k, v, name, attn_mask=mask, method="streaming", block_size=2,
                           **({"temperature": 2.0} if name == "softmax" else {}))
        assert torch.equal(out[..., 0, :], torch.zeros_like(out[..., 0, :]))
        (gq,) = torch.autograd.grad(out.sum(), [q])
        assert torch.isfinite(gq).all() and torch.equal(gq[..., 0, :], torch.zeros_like(gq[..., 0, :]))


def test_ties_at_the_maximum_share_its_gradient():
    """All scores equal: softpick's eps e^{m - c} term sends its gradient to every key, as amax does."""
    q = torch.zeros(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 6, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    grads = []
    for method in ("dense", "streaming"):
        out = sk.attention(q, k, v, "softpick", method=method, block_size=2, eps=0.1)
        grads.append(torch.autograd.grad(out.square().sum(), [q, k]))
    for gs, gd in zip(*grads):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-12)


def test_tiles_never_exceed_the_block(monkeypatch):
    shapes = []
    original = streaming._scores

    def recording(qs, k, t):
        x = original(qs, k, t)
        shapes.append(tuple(x.shape[-2:]))
        return x

    monkeypatch.setattr(streaming, "_scores", recording)
    q, k, v = (torch.randn(1, 2, 50, 8, requires_grad=True) for _ in range(3))
    out = sk.attention(q, k, v, "softpick", is_causal=True, block_size=(8, 16), method="streaming")
    out.sum().backward()
    assert shapes and max(s[0] for s in shapes) <= 8 and max(s[1] for s in shapes) <= 16


def test_float16_is_computed_in_float32():
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float16) for _ in range(3))
    out = sk.attention(q, k, v, "sigmoid", is_causal=True, block_size=4)
    ref = sk.attention(q.float(), k.float(), v.float(), "sigmoid", is_causal=True, method="dense")
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-3)


def test_every_streamable_normalizer_has_a_rule():
    for spec in sk.normalizers():
        assert (rule_for(spec.name, dict(spec.params)) is None) == (not spec.streamable), spec.name
    assert rule_for("entmax", {"alpha": torch.tensor(1.5)}) is None  # learnable alpha: dense
    assert rule_for("entmax", {"alpha": 2.5}) is None


def _qkv(seed=0, lq=5, lk=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (lq, lk, lk)]


@pytest.mark.parametrize("name", ["softmax", "softpick", "sa_softmax", "sparsemax"])
def test_first_order_gradcheck_holds_and_double_backward_raises(name):
    """Streaming gradients pass gradcheck; asking for a graph of them (double backward)
    raises a clear error instead of returning wrong second derivatives; the dense path
    passes gradgradcheck."""
    params = {"temperature": 2.0} if name == "softmax" else {}

    def attend(method):
        return lambda q, k, v: sk.attention(q, k, v, name, method=method, block_size=(2, 3), **params)

    qkv = _qkv()
    assert torch.autograd.gradcheck(attend("streaming"), qkv)
    out = attend("streaming")(*qkv)
    with pytest.raises(RuntimeError, match=r"double backward is not supported by the streaming path; "
                                           r"use method='dense'"):
        torch.autograd.grad(out.square().sum(), qkv, create_graph=True)
    # a plain backward of the same graph still works afterwards
    grads = torch.autograd.grad(out.square().sum(), qkv)
    dense = torch.autograd.grad(attend("dense")(*qkv).square().sum(), qkv)
    for g, d in zip(grads, dense):
        torch.testing.assert_close(g, d)
    if name != "sparsemax":   # sparsemax has kinks: second derivatives are checked where smooth
        assert torch.autograd.gradgradcheck(attend("dense"), qkv)


def test_double_backward_raises_for_tensor_parameters_and_auto():
    q, k, v = _qkv(1, lq=200, lk=130)
    s = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    zeros = torch.zeros(200, 130, dtype=q.dtype)          # an additive mask keeps ssmax off SDPA
    out = sk.attention(q, k, v, "ssmax", s=s, attn_mask=zeros)   # auto: fused at 200 x 130 on CPU
    (gs,) = torch.autograd.grad(out.sum(), [s], retain_graph=True)
    assert torch.isfinite(gs)
    with pytest.raises(RuntimeError, match="use method='dense'"):
        torch.autograd.grad(out.sum(), [s], create_graph=True)
    for method in ("streaming", "fused"):
        out = sk.attention(q, k, v, "ssmax", s=s, method=method)
        with pytest.raises(RuntimeError, match=f"not supported by the {method} path; use method='dense'"):
            torch.autograd.grad(out.sum(), [s], create_graph=True)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_still_works(reentrant):
    """Checkpointing recomputes inside backward but asks for no graph of the gradient:
    the double-backward guard must not fire."""
    from torch.utils.checkpoint import checkpoint

    q, k, v = _qkv(2, lq=9, lk=11)

    def attend(q, k, v):
        return sk.attention(q, k, v, "softpick", method="streaming", block_size=4)

    checkpoint(attend, q, k, v, use_reentrant=reentrant).square().sum().backward()
    got = [t.grad for t in (q, k, v)]
    expected = torch.autograd.grad(attend(q, k, v).square().sum(), (q, k, v))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name,params", [("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3})])
def test_threshold_rule_is_exact_in_float32_at_scores_near_1e4(name, params):
    """The bracketed threshold is only known to about eps |tau| (float32 scores near 1e4: the
    weights summed to 1 +- 3e-4); a Newton step from it makes the output match the dense
    reference computed in float64 from the same inputs, and the gradients too."""
    gen = torch.Generator().manual_seed(3)
    q = (3000 * torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64)).float()
    k, v = (torch.randn(1, 2, 7, 8, generator=gen, dtype=torch.float64).float() for _ in range(2))
    res = []
    for t, method in ((torch.float64, "dense"), (torch.float32, "streaming")):
        leaves = [x.to(t).requires_grad_() for x in (q, k, v)]
        out = sk.attention(*leaves, name, is_causal=True, method=method, block_size=(2, 3), **params)
        weight = torch.linspace(-1, 2, out.numel(), dtype=t).reshape(out.shape)
        res.append([out] + list(torch.autograd.grad((out * weight).sum(), leaves)))
    for got, want in zip(res[1], res[0]):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * max(1.0, want.abs().max().item()))


def test_sink_gradient_is_not_a_cancelling_sum():
    """The sink's gradient is ``-out p_sink`` per query. Taken through ``z = x - s`` it was
    ``-sum_j dz_j``, terms that cancel down to the small sink weight: in float32 over 3000 keys
    (sink weight near 1e-4) its relative error was 2e-2."""
    gen = torch.Generator().manual_seed(3)
    q = 3 * torch.randn(1, 2, 2, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 3000, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64).view(2, 1, 1)
    grads = []
    for t, method in ((torch.float64, "dense"), (torch.float32, "streaming")):
        s = sink.to(t).requires_grad_()
        out = sk.attention(q.to(t), k.to(t), v.to(t), "softmax_sink", method=method, sink=s)
        weight = torch.linspace(-1, 2, out.numel(), dtype=t).reshape(out.shape)
        grads.append(torch.autograd.grad((out * weight).sum(), s)[0])
    torch.testing.assert_close(grads[1].double(), grads[0], rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "as_entmax", "sa_softmax", "adaptive_softmax", "stablemax", "multimax"])
@pytest.mark.parametrize("case", ["one visible key", "a whole row filled"])
def test_finfo_min_mask_fill_is_finite_and_matches_dense(name, case):
    """The Hugging Face mask habit (an additive finfo.min fill) in float32, on the paths
    that stream: as_entmax's scale turned the fill into -inf (0 * -inf in the support
    sums: NaN), sparsemax's threshold bracket midpoint (lo + hi) / 2 overflowed on a row
    of fills (and the fused kernels' unshifted thresholds lost the support there: zero
    gradients), and SA-Softmax's x e^{x-c} term put fill * gradient (inf) times 0 into its
    backward; adaptive_softmax's entropy sum of x e^{x-c} overflowed on a row of fills and its
    sharpened scores beta x did; stablemax's weights s(x) = 1 / (1 - x) were subnormal there
    (dense path, the auto path at small lengths), and 1 / their sum overflowed into NaN;
    MultiMax's (t u) u term passed gradient * u (inf) times t = 0 into its backward."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=gen) for _ in range(3))
    keep = torch.ones(1, 1, 12, 12, dtype=torch.bool)
    if case == "one visible key":
        keep[..., 1:] = False
    else:
        keep[..., 3, :] = False
    if name == "sa_softmax" and case != "one visible key":
        pytest.skip("SA-Softmax multiplies by the score: a row of finfo.min fills overflows by definition")
    mask = torch.zeros(1, 1, 12, 12).masked_fill(~keep, torch.finfo(torch.float32).min)
    results = {}
    for method in ("streaming", "fused", "fused, numba kernels", "dense"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        # the numba backend takes the kernels at any size (auto leaves tiles this small to torch)
        with sk.use_backend("numba" if "numba" in method else "auto"):
            out = sk.attention(*leaves, normalizer=name, attn_mask=mask, is_causal=True, method=method.split(",")[0])
            results[method] = [out] + list(torch.autograd.grad(out.sum(), leaves))
        assert all(bool(torch.isfinite(t).all()) for t in results[method]), method
    for method in ("streaming", "fused", "fused, numba kernels"):
        # (on a row of fills as_entmax's scaled scores saturate at the dtype's range, where
        # their gradient is 0: only its output follows the dense path's there)
        compared = 1 if case != "one visible key" and name == "as_entmax" else 4
        for got, want in zip(results[method][:compared], results["dense"]):
            torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("dtype,fill", [(torch.float32, -1e9), (torch.float64, -1e150), (torch.float64, "min")])
@pytest.mark.parametrize("name,params", [("entmax", {"alpha": 1.1}), ("entmax", {"alpha": 1.3}),
                                         ("as_entmax", {"alpha": 1.3})])
def test_threshold_rule_gradient_is_finite_next_to_hidden_keys_when_visible_scores_are_huge(name, params, dtype, fill):
    """A row whose visible scores are all huge and negative (a mask fill), beside hidden keys
    (causal, ``-inf`` or bool mask): relative to that row's maximum a hidden entry's ``u z - tau``
    is huge, its ``1/u``-th power (alpha = 1.1: the 10th) overflowed, and the backward of the
    zeroing of hidden entries, 0 times an infinite derivative, made dq and dk NaN."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, lq, 5, generator=gen, dtype=torch.float64).to(dtype) for lq in (4, 6, 6))
    value = torch.finfo(dtype).min if fill == "min" else fill
    mask = torch.zeros(1, 1, 4, 6, dtype=dtype)
    mask[..., 0, :] = value
    mask[..., 1, 1] = float("-inf")
    mask[..., 2, :2] = value
    results = []
    for method in ("dense", "streaming"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, name, is_causal=True, attn_mask=mask, method=method, block_size=(2, 4), **params)
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        results.append([out] + list(torch.autograd.grad((out * weight).sum(), leaves)))
    assert all(bool(torch.isfinite(t).all()) for t in results[1])
    # (as_entmax's scaled finfo.min fills saturate at the dtype's range, where their gradient is
    # 0: only its output follows the dense path's there)
    compared = 1 if name == "as_entmax" and fill == "min" else 4
    for got, want in zip(results[1][:compared], results[0]):
        torch.testing.assert_close(got, want, atol=1e-5 if dtype == torch.float32 else 1e-10, rtol=1e-4)


def test_threshold_rule_gradient_of_a_score_exactly_at_the_threshold():
    """Sparsemax of scores (2, 1, 0): the threshold is 1, so the second weight is exactly 0 and,
    as on the dense and fused paths, outside the support: the row's one supported weight is 1
    and every gradient in k is 0. The streaming backward passed the clamp's gradient at 0 there
    (and its support sums came from an unrefined threshold): dk was (-1, 1, 0)."""
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    k = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64).reshape(1, 1, 3, 1).requires_grad_()
    v = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64).reshape(1, 1, 3, 1)
    for name, params in (("sparsemax", {}), ("entmax", {"alpha": 2.0})):
        k.grad = None
        out = sk.attention(q, k, v, name, scale=1.0, method="streaming", **params)
        out.sum().backward()
        assert out.item() == 0.0
        torch.testing.assert_close(k.grad.flatten(), torch.zeros(3, dtype=torch.float64), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,params", [("sparsemax", {}), ("entmax", {"alpha": 2.0}), ("entmax15", {})])
def test_threshold_rule_matches_dense_on_integer_scores_with_ties(name, params, dtype):
    """Integer scores put entries exactly at the threshold in many rows (sparsemax's support is
    decided by equalities there); the dense path leaves them out (``p > 0``), and the streaming
    one must take the same support in its forward sums and its backward (errors of 21 on
    gradients of size 14 before)."""
    gen = torch.Generator().manual_seed(11)
    q, k = (torch.randint(-2, 3, (2, 2, n, 3), generator=gen).to(dtype) for n in (9, 11))
    v = torch.randn(2, 2, 11, 4, generator=gen, dtype=torch.float64).to(dtype)
    results = []
    for method in ("dense", "streaming"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, name, is_causal=True, scale=1.0, method=method, block_size=(4, 3), **params)
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        results.append([out] + list(torch.autograd.grad((out * weight).sum(), leaves)))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-5 if dtype == torch.float32 else 1e-10, rtol=1e-5)


@pytest.mark.parametrize("name,param,value", [("ssmax", "s", 0.8), ("softmax", "temperature", 0.4)])
@pytest.mark.parametrize("dtype,fill", [(torch.float32, torch.finfo(torch.bfloat16).min),
                                        (torch.float64, torch.finfo(torch.float32).min)])
def test_learnable_slope_gradient_on_a_query_row_a_fill_hides_whole(name, param, value, dtype, fill):
    """A query row whose every key carries a huge additive fill (a padding query under a
    Hugging Face mask made for bfloat16, computed in float32; or a float32 mask on float64
    inputs) with a learnable slope (ssmax's ``s log n``, a temperature): the slope's gradient
    was taken relative to ``c / a``, which is not the row's score where ``a x`` overflowed (held
    at finfo.min) or rounds: ``s``'s gradient 5.6e28 (float32) or 3e6 (float64), dense 0."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 2, 4, generator=gen, dtype=dtype).requires_grad_()
    k = torch.randn(1, 1, 17, 4, generator=gen, dtype=dtype).requires_grad_()
    v = torch.randn(1, 1, 17, 2, generator=gen, dtype=dtype).requires_grad_()
    mask = torch.zeros(2, 17, dtype=dtype)
    mask[1] = fill
    mask[0, :5] = fill
    grads = []
    for method in ("dense", "streaming"):
        p = torch.full((1, 1, 1, 1), value, dtype=dtype, requires_grad=True)
        out = sk.attention(q, k, v, name, attn_mask=mask, method=method, block_size=(2, 8), **{param: p})
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        grads.append(torch.autograd.grad((out * weight).sum(), [q, k, v, p]))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_multimax_terms_that_overflow_with_opposite_signs_on_a_fill():
    """MultiMax in float32 on a finfo.min fill with a negative slope term and a positive
    quadratic one: ``x + t1 relu(r1 - x)`` overflows to -inf and ``t3 relu(r3 - x)^2`` to +inf,
    so ``g`` was NaN and the streaming output NaN; the dense path (which computes such rows in
    float64) and the fused kernels give the fill's key its row's weight (``g`` is +3.9e76)."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 1, 2, 4, generator=gen)
    k = torch.randn(1, 1, 3, 4, generator=gen)
    v = torch.randn(1, 1, 3, 2, generator=gen)
    mask = torch.zeros(2, 3)
    mask[0, 1] = torch.finfo(torch.float32).min
    mask[1] = torch.finfo(torch.float32).min
    params = {"r": (-0.99, -0.5, 0.81, -0.76), "t": (-0.5, -0.44, 0.33, -0.06)}
    want = sk.attention(q, k, v, "multimax", attn_mask=mask, method="dense", **params)
    got = sk.attention(q, k, v, "multimax", attn_mask=mask, method="streaming", block_size=(1, 2), **params)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)
