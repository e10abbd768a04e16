"""The fused attention path equals the dense reference: outputs and gradients (q, k, v and
per-head parameters), for every registered normalizer and a user's own of each family,
under causal masking, padding, additive masks, GQA, decoding, packed sequences and empty
rows; float32 and bfloat16 smoke."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.attention import fused
from softmaxkit.attention.inputs import prepare

D = 5
BLOCK = 3  # several query blocks even at these small lengths


def _tanh_tilt(x, slope=0.7):
    return slope * x + 0.1 * torch.tanh(x)


def _d_tanh_tilt(x, slope=0.7):
    return slope + 0.1 * (1 - torch.tanh(x) ** 2)


def _gate(x, n):
    return torch.sigmoid(x - torch.log(n))


def _d_gate(x, n):
    s = _gate(x, n)
    return s * (1 - s)


def _cube(x):
    return torch.relu(x) ** 3


def _d_cube(x):
    return 3 * torch.relu(x) ** 2


USER = {
    "fused_user_tilt": {"family": "softmax_of", "g": _tanh_tilt, "dg": _d_tanh_tilt},
    "fused_user_cube_l1": {"family": "sum_normalized", "h": _cube, "dh": _d_cube, "eps": 1e-6},
    "fused_user_gate": {"family": "elementwise", "h": _gate, "dh": _d_gate},
    "fused_user_entmax13": {"family": "threshold", "alpha": 1.3},
}


@pytest.fixture(scope="module", autouse=True)
def user_normalizers():
    for name, kw in USER.items():
        sk.register_normalizer(name, **kw)
    yield
    for name in USER:
        sk.unregister_normalizer(name)


def _required(spec) -> dict:
    """Values for parameters the reference refuses to leave at their default (sparse_softmax's
    k), taken from the spec's examples."""
    out = {}
    for name, default in spec.params.items():
        if default is None:
            try:
                spec.fn(torch.zeros(1, 4), dim=-1, mask=None)
            except ValueError:
                out[name] = next(e.params[name] for e in spec.examples if name in e.params)
    return out


def _learnable(spec, h, gen) -> dict:
    """Every learnable parameter as a per-head tensor near its initial value, requiring grad."""
    out = {}
    for p in spec.param_specs:
        if p.learnable is None:
            continue
        init = torch.as_tensor(p.learnable.init, dtype=torch.float64)
        if p.size > 1:
            value = init.view(p.size, 1, 1, 1) + 0.3 * torch.randn(p.size, h, 1, 1, generator=gen, dtype=torch.float64)
        else:
            value = init + 0.1 * torch.randn(h, 1, 1, generator=gen, dtype=torch.float64)
        out[p.name] = value.requires_grad_()
    return out


def _params(name, learnable, h, gen):
    spec = sk.registry.get(name)
    params = _required(spec)
    if learnable:
        params.update(_learnable(spec, h, gen))
    return params


SCENARIOS = ["causal", "padding_gqa", "causal_padding_gqa", "decode", "additive", "causal_more_queries", "packed"]


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
    elif kind == "packed":  # three documents packed in one sequence: a block-diagonal document-id mask
        lq = lk = 12
        doc = torch.tensor([0] * 5 + [1] * 4 + [2] * 3)
        mask = (doc[:, None] == doc[None, :]).view(1, 1, lq, lk)
        causal = True
    q = (2.0 * torch.randn(b, h, lq, D, generator=gen, dtype=torch.float64)).requires_grad_()
    k = torch.randn(b, hk, lk, D, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(b, hk, lk, D, generator=gen, dtype=torch.float64).requires_grad_()
    return q, k, v, causal, mask


def _run(q, k, v, name, causal, mask, params, method, block_size=BLOCK):
    """Output and gradients (q, k, v, learnable parameters) of a weighted sum of the output;
    ``block_size`` (fused only): None is the path's own default."""
    out = sk.attention(q, k, v, name, is_causal=causal, attn_mask=mask, method=method,
                       block_size=block_size if method == "fused" else None, **params)
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    tensors = [q, k, v] + [t for t in params.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    return out, torch.autograd.grad((out * weight).sum(), tensors)


def _cases():
    # configs are built lazily (the user normalizers register in a fixture): index into a stable list
    builtin = [s.name for s in sk.normalizers() if not s.user]
    learn = [s.name for s in sk.normalizers() if s.learnable and not s.user]
    configs = [(n, False) for n in builtin + list(USER)] + [(n, True) for n in learn]
    cases = []
    for i, (name, learnable) in enumerate(configs):
        for j in (0, 2, 4, 6) if name in USER else (0, 3):
            cases.append((name, learnable, SCENARIOS[(i + j) % len(SCENARIOS)]))
    return cases


@pytest.mark.parametrize("name,learnable,scenario", _cases())
def test_fused_equals_dense_float64(name, learnable, scenario):
    gen = torch.Generator().manual_seed(len(name) * 31 + SCENARIOS.index(scenario) + learnable)
    q, k, v, causal, mask = _scenario(scenario, gen)
    params = _params(name, learnable, q.shape[1], gen)
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    got, got_grads = _run(q, k, v, name, causal, mask, params, "fused")
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10)
    assert len(got_grads) == len(dense_grads)
    for gs, gd in zip(got_grads, dense_grads):
        assert torch.isfinite(gs).all()
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


def test_every_scenario_and_family_is_covered():
    cases = _cases()
    assert {s for _, _, s in cases} == set(SCENARIOS)
    kinds = {fused.kind_for(sk.registry.get(n), sk.registry.get(n).with_defaults({})) for n, _, _ in cases}
    assert set(fused.KINDS) <= kinds
    assert {n for n, _, _ in cases} >= {s.name for s in sk.normalizers()}


@pytest.mark.parametrize("name", ["ssmax", "sparsemax", "fused_user_cube_l1", "softpick"])
def test_head_groups_and_default_blocks(name, monkeypatch):
    """Tiles of fewer heads than H (a small tile budget) and the default block size agree too."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, causal, mask = _scenario("causal_padding_gqa", gen)
    params = _params(name, True, q.shape[1], gen)
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    monkeypatch.setattr(fused, "TILE_ELEMENTS", 2 * fused.MIN_BLOCK_Q * k.shape[2])
    out, grads = _run(q, k, v, name, causal, mask, params, "fused", block_size=None)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["ssmax", "softpick", "sigmoid", "softmax_sink"])
@pytest.mark.parametrize("per_tile", ["several batch entries", "one batch entry"])
def test_tiles_of_several_batch_entries(name, per_tile, monkeypatch):
    """With short rows the row kernels put several batch entries (every head of each) in one
    tile; with a budget of one entry per tile the results are the same, and both equal dense
    (padding that differs per entry, GQA, per-head parameters and their gradients)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v, causal, mask = _scenario("causal_padding_gqa", gen)
    b, h, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    params = _params(name, True, h, gen)
    inp = prepare(q, k, v, is_causal=causal, attn_mask=mask, scale=None)
    if per_tile == "one batch entry":
        monkeypatch.setattr(fused, "ROW_KERNEL_TILE_ELEMENTS", fused.MIN_BLOCK_Q * h * lk)
    assert fused._geometry(inp, True)[2] == (b if per_tile == "several batch entries" else 1)
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    out, grads = _run(q, k, v, name, causal, mask, params, "fused", block_size=None)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


def test_rows_without_keys_are_zero_with_zero_gradient():
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 1:, :2] = True
    for spec in sk.normalizers():
        params = _required(spec)
        out = sk.attention(q, k, v, spec.name, attn_mask=mask, method="fused", block_size=2, **params)
        assert torch.equal(out[..., 0, :], torch.zeros_like(out[..., 0, :])), spec.name
        gq, gk, gv = torch.autograd.grad(out.sum(), [q, k, v])
        assert torch.isfinite(gq).all() and torch.equal(gq[..., 0, :], torch.zeros_like(gq[..., 0, :])), spec.name
        assert torch.isfinite(gk).all() and torch.isfinite(gv).all()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", ["ssmax", "sigmoid", "relu_l1", "entmax15", "softpick"])
def test_low_precision_smoke(name, dtype, tol):
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    mask = torch.rand(1, 1, 40, 40, generator=gen) > 0.2
    outs = []
    for method in ("dense", "fused"):
        out = sk.attention(q, k, v, name, is_causal=True, attn_mask=mask, method=method)
        assert out.dtype == dtype
        outs.append((out.float(),) + tuple(g.float() for g in torch.autograd.grad(out.float().sum(), (q, k, v))))
    for a, b in zip(*outs):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_auto_takes_fused_on_cpu(monkeypatch):
    calls = []
    real = fused.fused_attention

    def spy(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    from softmaxkit.attention import api

    monkeypatch.setattr(api, "fused_attention", spy)
    q = k = v = torch.randn(1, 2, 200, 8)
    sk.attention(q, k, v, "sigmoid", is_causal=True)
    sk.attention(q, k, v, "softmax", is_causal=True)  # softmax(a x): SDPA
    sk.attention(q[..., :8, :], k[..., :8, :], v[..., :8, :], "sigmoid")  # tiny: dense
    assert calls == ["sigmoid"]


def test_module_and_fused_gradients_reach_the_normalizer():
    """sk.nn.Attention goes through method='auto', hence the fused path; its learnable
    per-head parameters get the gradient the dense path gives."""
    torch.manual_seed(0)
    layer = sk.nn.Attention(16, 2, normalizer="ssmax", is_causal=True).double()
    x = torch.randn(1, 140, 16, dtype=torch.float64)
    out = layer(x)
    grads = torch.autograd.grad(out.sum(), list(layer.normalizer.parameters()))
    q = layer._split(layer.q_proj(x), 2)
    kk = layer._split(layer.k_proj(x), 2)
    vv = layer._split(layer.v_proj(x), 2)
    params = {**layer.normalizer.fixed, **layer.normalizer.learned_values()}
    ref = sk.attention(q, kk, vv, "ssmax", is_causal=True, method="dense", **params)
    ref = layer.out_proj(ref.transpose(1, 2).reshape(1, 140, 16))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    ref_grads = torch.autograd.grad(ref.sum(), list(layer.normalizer.parameters()))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_bad_parameters_for_fused_are_refused():
    q = k = v = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match="method"):
        sk.attention(q, k, v, "sigmoid", method="fused", bias=torch.zeros(1, 2, 6, 6))


@pytest.mark.parametrize("name,params", [("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3})])
def test_threshold_rows_on_the_numba_kernels(name, params):
    """The threshold of each row is solved by the numba row kernels on rows with -inf at hidden
    keys (causal, padding, fully hidden rows); the result equals the dense reference."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, causal, mask = _scenario("causal_padding_gqa", gen)
    mask[0, 0, 4] = False
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    with sk.use_backend("numba"):
        got, got_grads = _run(q, k, v, name, causal, mask, params, "fused")
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(got_grads, dense_grads):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_fused_inference_compiles_in_one_graph():
    """torch.compile traces the fused path of every closed-form family into one graph in
    inference (fullgraph=True fails on any graph break); the threshold family solves its rows
    by fixed-step bisection there. Training is not traced: the backward of the
    autograd.Function runs eagerly (a graph break)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    kinds = {}
    for spec in sk.normalizers():
        kind = fused.kind_for(spec, spec.with_defaults({}))
        linear = getattr(spec.form, "linear_factor", None) is not None  # softmax(a x): auto runs SDPA
        if kind != "rows" and kind not in kinds and not linear:
            kinds[kind] = spec.name
    assert len(kinds) == 4
    for name in kinds.values():
        torch._dynamo.reset()

        def fn(q, k, v, name=name):
            return sk.attention(q, k, v, name, is_causal=True, method="fused", block_size=4)

        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=1e-6)


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_traceable_threshold_solver_matches_the_reference(alpha):
    gen = torch.Generator().manual_seed(4)
    z = 3 * torch.randn(6, 40, generator=gen, dtype=torch.float64)
    z[0, 5:] = float("-inf")
    z[1] = float("-inf")  # nothing visible
    got = fused.entmax_by_bisection(z, alpha)
    want = sk.entmax(z, mask=z > float("-inf"), alpha=alpha)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


RULES = ["sa_softmax", "softmax_sink", "softpick"]


def _spy_tiles(monkeypatch):
    used = []
    real = fused._tile_pieces
    monkeypatch.setattr(fused, "_tile_pieces", lambda *a: used.append(real(*a)) or used[-1])
    return used


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name,learnable", [(n, False) for n in RULES] + [("softmax_sink", True)])
def test_rule_normalizers_take_the_row_kernels_and_equal_dense(name, learnable, scenario, monkeypatch):
    """The normalizers with their own stream rule whose numba pieces compute them (SA-Softmax,
    softmax with a sink, softpick) run the row kernels on the fused path, in every masking
    situation, and equal the dense reference in float64 (outputs, q/k/v and sink gradients)."""
    gen = torch.Generator().manual_seed(len(name) * 13 + SCENARIOS.index(scenario) + learnable)
    q, k, v, causal, mask = _scenario(scenario, gen)
    params = _params(name, learnable, q.shape[1], gen)
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    used = _spy_tiles(monkeypatch)
    got, got_grads = _run(q, k, v, name, causal, mask, params, "fused")
    assert used and all(u is not None for u in used)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10)
    assert len(got_grads) == len(dense_grads) == 3 + learnable
    for gs, gd in zip(got_grads, dense_grads):
        assert torch.isfinite(gs).all()
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", RULES)
def test_rule_normalizers_under_hostile_scores(name):
    """Scores of +-1e4 (and a sink of -1e4): no overflow, the dense values to float64 rounding of
    scores that large (an ulp of 1e4 is 2e-12, which e^x turns into a relative error; the scores
    are rounded in a different order than the dense path's), relative to the largest value."""
    gen = torch.Generator().manual_seed(8)
    q, k, v, causal, mask = _scenario("causal_padding_gqa", gen)
    with torch.no_grad():
        q.mul_(4e3)
    params = {"sink": torch.tensor([-1e4, 0.0, 1e4, 5.0], dtype=torch.float64).view(4, 1, 1).requires_grad_()} \
        if name == "softmax_sink" else {}
    scores = (q @ k.repeat_interleave(4, 1).transpose(-1, -2)) / D ** 0.5
    assert scores.abs().max() > 1e4
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    got, got_grads = _run(q, k, v, name, causal, mask, params, "fused")
    for a, b in zip((got,) + got_grads, (dense,) + dense_grads):
        assert torch.isfinite(a).all()
        scale = max(1.0, float(b.detach().abs().max()))
        torch.testing.assert_close(a / scale, b / scale, rtol=0, atol=1e-10)


def test_softpick_tied_maxima_share_the_gradient():
    """Equal keys give tied row maxima: the gradient of the eps e^m term is shared between them
    as the reference's torch.amax shares it."""
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 6, D, generator=gen, dtype=torch.float64).requires_grad_()
    k = torch.randn(1, 2, 8, D, generator=gen, dtype=torch.float64)
    k[..., 5, :] = k[..., 2, :] = 3 * q[..., 0:1, :].detach().mean(-2)
    k[..., 1, :] = -k[..., 2, :]  # a row with no positive score but a tie at its maximum
    k = k.requires_grad_()
    v = torch.randn(1, 2, 8, D, generator=gen, dtype=torch.float64).requires_grad_()
    params = {"eps": 0.5}  # a large eps makes the maximum's term visible in the gradient
    dense, dense_grads = _run(q, k, v, "softpick", False, None, params, "dense")
    got, got_grads = _run(q, k, v, "softpick", False, None, params, "fused")
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-12)
    for gs, gd in zip(got_grads, dense_grads):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", RULES)
def test_rule_normalizers_float32_and_below(name, dtype, monkeypatch):
    """float32 and bfloat16 (computed in float32) run the row kernels, near dense."""
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    mask = torch.rand(1, 1, 40, 40, generator=gen) > 0.2
    used = _spy_tiles(monkeypatch)
    outs = []
    for method in ("dense", "fused"):
        out = sk.attention(q, k, v, name, is_causal=True, attn_mask=mask, method=method)
        outs.append((out.float(),) + tuple(g.float() for g in torch.autograd.grad(out.float().sum(), (q, k, v))))
    assert used and all(u is not None for u in used)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    for a, b in zip(*outs):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_rule_normalizers_auto_route():
    """method="auto" on the CPU sends them to the fused path in float32/float64 (softmax with a sink
    to SDPA, where the fused path is its fallback); SA-Softmax's normalized variant (no numba
    pieces for it) keeps the streaming path."""
    from softmaxkit.attention.api import auto_method

    q = k = v = torch.randn(1, 2, 200, 8)
    assert auto_method(q, k, v, "softmax_sink", is_causal=True) == "sdpa"
    v = torch.randn(1, 2, 200, 4)   # a value head size of its own: not SDPA's to take with a sink
    for name in RULES:
        assert auto_method(q, k, v, name, is_causal=True) == "fused", name
        assert auto_method(q.double(), k.double(), v.double(), name) == "fused", name
        assert auto_method(q.bfloat16(), k.bfloat16(), v.bfloat16(), name) == "fused", name  # float32 inside
        nan_q = q.clone()
        nan_q[0, 0, 0, 0] = float("nan")   # the dense reference defines a NaN score's row
        assert auto_method(nan_q, k, v, name, is_causal=True) == "dense", name
    assert auto_method(q, k, v, "sa_softmax", normalized=True) == "streaming"
    spec = sk.registry.get("sa_softmax")
    assert fused.kind_for(spec, spec.with_defaults({}), kernels=True) == "softmax_of"
    assert fused.kind_for(spec, spec.with_defaults({"normalized": True}), kernels=True) == "rows"
    assert fused.kind_for(spec, spec.with_defaults({})) == "rows"


def test_sa_softmax_normalized_keeps_the_reference_rows(monkeypatch):
    gen = torch.Generator().manual_seed(11)
    q, k, v, causal, mask = _scenario("causal_padding_gqa", gen)
    params = {"normalized": True}
    dense, dense_grads = _run(q, k, v, "sa_softmax", causal, mask, params, "dense")
    used = _spy_tiles(monkeypatch)
    got, got_grads = _run(q, k, v, "sa_softmax", causal, mask, params, "fused")
    assert used and all(u is None for u in used)
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(got_grads, dense_grads):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_number_temperature_scales_the_additive_mask_too(causal):
    """softmax with a number temperature T folds 1/T into the query scale; the additive mask is
    inside the normalizer's argument, so it is divided by T as well: softmax((q k^T s + a) / T)."""
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 2, n, 4, generator=gen, dtype=torch.float64).requires_grad_() for n in (5, 7, 7))
    mask = torch.randn(1, 2, 5, 7, generator=gen, dtype=torch.float64)
    mask[..., 1, 2] = float("-inf")
    outs = []
    for method in ("dense", "fused"):
        out = sk.attention(q, k, v, temperature=0.3, attn_mask=mask, is_causal=causal, method=method)
        outs.append((out, torch.autograd.grad((out * out).sum(), [q, k, v])))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=1e-12)
    for got, want in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("lq,lk", [(6, 6), (9, 5), (1, 6)])
def test_rows_mode_on_causal_tiles_narrower_than_k(lq, lk):
    """sparse_softmax's k is checked against the key length; a causal block's tile stops at its
    last visible key and can be narrower than k (block_q 2: tiles of 1 or 2 keys), where the
    rows keep every visible key, as the dense path does."""
    gen = torch.Generator().manual_seed(17)
    q = torch.randn(1, 2, lq, 4, generator=gen, dtype=torch.float64).requires_grad_()
    k, v = (torch.randn(1, 2, lk, 4, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    res = []
    for method in ("dense", "fused"):
        out = sk.attention(q, k, v, "sparse_softmax", is_causal=True, method=method, block_size=2, k=4)
        res.append((out, torch.autograd.grad((out * out).sum(), [q, k, v])))
    torch.testing.assert_close(res[1][0], res[0][0], rtol=0, atol=1e-12)
    for got, want in zip(res[1][1], res[0][1]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_sink_gradient_comes_from_the_sink_logit(causal):
    """The sink's gradient is ``-p_sink dd`` per query. Taken by autograd through ``g = x - s`` it
    was ``-sum dS``, terms that cancel down to the small sink weight: float32 over 3000 keys
    (sink weight near 1e-4) left relative errors of 1e-2 to 6e-2 on the row kernels."""
    gen = torch.Generator().manual_seed(3)
    q = 3 * torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 3000, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(1, 1, 3, 3000, dtype=torch.bool)
    mask[..., 2, :] = False  # a row that sees nothing: no contribution
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64).view(2, 1, 1)
    res = []
    for t, method in ((torch.float64, "dense"), (torch.float32, "fused")):
        leaves = [x.to(t).requires_grad_() for x in (q, k, v, sink)]
        out = sk.attention(*leaves[:3], "softmax_sink", is_causal=causal, attn_mask=mask, method=method,
                           sink=leaves[3])
        weight = torch.linspace(-1, 2, out.numel(), dtype=t).reshape(out.shape)
        res.append(torch.autograd.grad((out * weight).sum(), leaves))
    torch.testing.assert_close(res[1][3].double(), res[0][3], rtol=1e-5, atol=0)
    for got, want in zip(res[1][:3], res[0][:3]):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("scale", [1.0, 4.0])
@pytest.mark.parametrize("name", ["relu_l1", "softplus_l1", "stablemax", "multimax", "ssmax", "sigmoid",
                                  "softpick", "sa_softmax", "softmax_sink"])
def test_float32_error_within_flash_attentions_rule_of_dense(name, scale):
    """FlashAttention's rule on the CPU row kernels: float32 error against float64 at most 2x
    (output) and 3x (gradients) the dense float32 path's (errors under 1e-6 pass). Causal rows
    with their mass on one key (relu_l1) cancelled in dp - rowsum(dO * O) before the row
    kernels formed it from the row itself."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(1, 2, 300, 64, generator=gen) * (scale if i < 3 else 1.0) for i in range(4))
    # MultiMax at its defaults is softmax: a learned modulator runs its own pieces
    params = {"r": (-0.5, 0.3, -1.0, 1.5), "t": (0.2, -0.1, 0.05, 0.1)} if name == "multimax" else {}

    def run(method, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, normalizer=name, is_causal=True, method=method, **params)
        return [out.double()] + [g.double() for g in torch.autograd.grad(out, leaves, go.to(dtype))]

    exact, dense, fused = run("dense", torch.float64), run("dense", torch.float32), run("fused", torch.float32)
    for what, limit, a, b, c in zip(("out", "dq", "dk", "dv"), (2, 3, 3, 3), fused, dense, exact):
        err, base = (a - c).abs().max().item(), (b - c).abs().max().item()
        assert err <= max(limit * base, 1e-6), (what, err, base)


def test_multimax_with_a_finfo_min_mask_fill():
    """The Hugging Face mask habit (additive finfo.min) on MultiMax with t = 0 given as a tensor (so
    that the row kernels run the modulator, not plain softmax): the numba piece's (t c) c term,
    reassociated by fastmath into t (c c), overflowed to NaN and made every row wrong by O(1)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 160, 16, generator=gen) for _ in range(3))
    fill = torch.finfo(torch.float32).min
    mask = torch.zeros(1, 1, 160, 160)
    mask[..., ::3] = fill
    t = torch.zeros(4)
    got = sk.attention(q, k, v, "multimax", attn_mask=mask, method="fused", t=t)
    want = sk.attention(q, k, v, "multimax", attn_mask=mask, method="dense", t=t)
    torch.testing.assert_close(got, want)


# one normalizer per row kernel: elementwise, sum-normalized, signed, softmax_of (with and
# without a sink), factor, weighted, threshold
@pytest.mark.parametrize("name", ["sigmoid", "softplus_l1", "softpick", "ssmax", "softmax_sink", "sa_softmax",
                                  "stablemax", "sparsemax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_nan_score_reaches_the_same_entries_as_dense(name, dtype):
    """A NaN score (here the last visible key of one query, and every later query's) gives a
    NaN output where the dense reference has one, and leaves the other rows exact, outputs and
    the gradients of the other head: the row kernels' fast-math (nnan) must not turn it into a
    number or an empty row. (Where a NaN lands in the gradients of its own head follows from
    how each path multiplies zeros by it, as in any two torch implementations, and is not
    compared.)"""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g, dtype=dtype) for _ in range(3))
    k[0, 0, 5, 3] = float("nan")
    dout = torch.randn(q.shape, generator=g, dtype=dtype)
    results = []
    for method in ("fused", "dense"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, name, is_causal=True, method=method)
        results.append((out.detach(), torch.autograd.grad(out, leaves[0], dout)[0]))
    (out, dq), (want, want_dq) = results
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    assert torch.equal(out.isnan(), want.isnan())
    assert out[0, 0, 5:].isnan().all() and not out[0, 0, :5].isnan().any() and not out[0, 1].isnan().any()
    torch.testing.assert_close(out.nan_to_num(), want.nan_to_num(), rtol=tol, atol=tol)
    torch.testing.assert_close(dq[0, 1], want_dq[0, 1], rtol=tol, atol=tol)


def test_the_row_kernels_check_for_nan_only_where_a_score_may_be_nan():
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(2, 2, 16, 8, generator=g) for _ in range(3))

    def may_be_nan(q=q, k=k, mask=None, scale=None):
        return fused.scores_may_be_nan(prepare(q, k, v, is_causal=False, attn_mask=mask, scale=scale))

    assert not may_be_nan()
    assert not may_be_nan(mask=torch.zeros(16, 16).masked_fill(torch.eye(16, dtype=torch.bool), float("-inf")))
    for bad in (float("nan"), float("inf")):
        q_bad = q.clone()
        q_bad[1, 0, 3, 2] = bad
        assert may_be_nan(q=q_bad)
        assert may_be_nan(k=q_bad)
    assert may_be_nan(q=q * 1e19, k=k * 1e19)   # products beyond float32's range
    assert may_be_nan(mask=torch.zeros(16, 16).index_fill(0, torch.tensor([4]), float("nan")))
    assert not may_be_nan(q=q * 1e17, k=k * 1e17, scale=1e-30)   # the scale keeps the products finite
