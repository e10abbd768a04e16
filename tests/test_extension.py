"""A user's own normalizer, registered from a script, works everywhere a built-in one does:
the reference, dense and streaming attention (outputs and gradients), the modules, the
Hugging Face names; registering a taken name or an unknown family is refused."""

import pytest
import torch

import softmaxkit as sk


def cube(x):
    return torch.relu(x) ** 3


def dcube(x):
    return 3 * torch.relu(x) ** 2


def tilt(x, slope=0.7):
    """softmax_of piece with a parameter of its own."""
    return slope * x + 0.1 * torch.tanh(x)


def dtilt(x, slope=0.7):
    return slope + 0.1 * (1 - torch.tanh(x) ** 2)


def gate(x, n):
    """elementwise piece that uses the row count."""
    return torch.sigmoid(x - torch.log(n))


def dgate(x, n):
    s = gate(x, n)
    return s * (1 - s)


FAMILIES = {
    "user_relu3_l1": dict(family="sum_normalized", h=cube, dh=dcube, eps=1e-6),
    "user_tilt": dict(family="softmax_of", g=tilt, dg=dtilt),
    "user_gate": dict(family="elementwise", h=gate, dh=dgate),
    "user_entmax13": dict(family="threshold", alpha=1.3),
}


@pytest.fixture(params=list(FAMILIES))
def registered(request):
    name = request.param
    sk.register_normalizer(name, **FAMILIES[name])
    yield name
    sk.unregister_normalizer(name)


def test_reference_follows_the_form(registered):
    x = torch.randn(8, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p = sk.normalize(x, registered)
    spec = sk.registry.get(registered)
    if registered == "user_relu3_l1":
        torch.testing.assert_close(p, cube(x) / (cube(x).sum(-1, keepdim=True) + 1e-6))
    elif registered == "user_tilt":
        torch.testing.assert_close(p, torch.softmax(tilt(x), -1))
    elif registered == "user_gate":
        torch.testing.assert_close(p, gate(x, torch.tensor(50.0, dtype=torch.float64)))
    else:
        import entmax

        torch.testing.assert_close(p, entmax.entmax_bisect(x, alpha=1.3, dim=-1), atol=1e-9, rtol=0)
    assert spec.user and spec.streamable


@pytest.mark.parametrize("causal", [True, False])
def test_streaming_attention_equals_dense_with_gradients(registered, causal):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 37, 8, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    mask = torch.rand(2, 1, 1, 37, generator=gen) > 0.2
    runs = []
    for method in ("dense", "streaming"):
        out = sk.attention(q, k, v, registered, is_causal=causal, attn_mask=mask, method=method, block_size=(8, 16))
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
                                    .sum(), (q, k, v))
        runs.append((out, grads))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=0, atol=1e-10)
    for gs, gd in zip(runs[1][1], runs[0][1]):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


def test_the_issue_example_runs_as_written():
    sk.register_normalizer("relu3_l1", family="sum_normalized", h=cube, dh=dcube, eps=1e-6)
    try:
        p = sk.normalize(torch.randn(8, 50), "relu3_l1")
        assert p.shape == (8, 50)
        q = torch.randn(2, 4, 300, 32)
        o = sk.attention(q, q, q, "relu3_l1", is_causal=True, method="streaming")
        d = sk.attention(q, q, q, "relu3_l1", is_causal=True, method="dense")
        torch.testing.assert_close(o, d, rtol=1e-5, atol=1e-6)
        layer = sk.nn.Attention(128, heads=4, normalizer="relu3_l1")
        y = layer(torch.randn(2, 10, 128))
        y.sum().backward()
        assert y.shape == (2, 10, 128)
        assert sk.nn.Normalizer("relu3_l1")(torch.randn(3, 5)).shape == (3, 5)
        assert "relu3_l1" in [row[0] for row in sk.registry.table().rows]
    finally:
        sk.unregister_normalizer("relu3_l1")


def test_piece_parameters_become_normalizer_parameters():
    sk.register_normalizer("user_tilt2", family="softmax_of", g=tilt, dg=dtilt)
    try:
        assert sk.registry.get("user_tilt2").params == {"slope": 0.7}
        x = torch.randn(3, 6, dtype=torch.float64)
        torch.testing.assert_close(sk.normalize(x, "user_tilt2", slope=2.0), torch.softmax(tilt(x, 2.0), -1))
        with pytest.raises(TypeError, match="slop"):
            sk.normalize(x, "user_tilt2", slop=2.0)
        with pytest.raises(ValueError, match="slope"):
            sk.normalize(x, "user_tilt2", slope=float("nan"))
    finally:
        sk.unregister_normalizer("user_tilt2")


def test_hugging_face_names_include_a_registered_normalizer():
    transformers = pytest.importorskip("transformers")
    sk.register_normalizer("user_hf_cube", family="sum_normalized", h=cube, dh=dcube, eps=1e-6)
    try:
        assert "softmaxkit_user_hf_cube" in sk.hf.register()
        cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="softmaxkit_user_hf_cube")
        ids = torch.randint(0, 32, (2, 9))
        out = model(ids, labels=ids)
        out.loss.backward()
        assert torch.isfinite(out.loss)
    finally:
        sk.unregister_normalizer("user_hf_cube")


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="softmax", family="elementwise", h=cube, dh=dcube), "already registered"),
    (dict(name="user_x", family="softmax_off", g=tilt, dg=dtilt), "family must be one of"),
    (dict(name="user_x", family="softmax_of", g=tilt), "needs dg"),
    (dict(name="user_x", family="elementwise", h=cube, dh=dcube, alpha=1.5), "does not take alpha"),
    (dict(name="user_x", family="threshold", alpha=0.5), "alpha must be a finite number >= 1"),
    (dict(name="user_x", family="threshold", alpha=float("inf")), "alpha must be a finite number >= 1"),
    (dict(name="user x", family="elementwise", h=cube, dh=dcube), "identifier"),
    # audit 2026-12-03: softmaxkit_linear_mala, the HF name of linear attention, replaced it
    (dict(name="linear_mala", family="softmax_of", g=tilt, dg=dtilt), "must not start with 'linear_'"),
])
def test_bad_registrations_are_refused(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=match):
        sk.register_normalizer(name, **kwargs)
    assert name == "softmax" or name not in sk.registry.names()


@pytest.mark.parametrize("flag", ["sums_to_one", "can_be_sparse", "shift_invariant"])
def test_registration_flags_must_be_bools(flag):
    """Audit 2026-12-03: sums_to_one="no" was stored, and `softmaxkit list` printed "yes"."""
    with pytest.raises(TypeError, match=flag):
        sk.register_normalizer("user_x", family="softmax_of", g=tilt, dg=dtilt, **{flag: "no"})
    assert "user_x" not in sk.registry.names()


@pytest.mark.parametrize("alpha,streams", [(1.0, False), (1.5, True), (2.0, True), (3.0, False)])
def test_a_threshold_normalizer_says_it_streams_only_where_it_does(alpha, streams):
    """Audit 2026-12-03: a fixed alpha outside (1, 2] was listed as streaming ("threshold
    search") while attention's streaming path refused it."""
    spec = sk.register_normalizer("user_thr", family="threshold", alpha=alpha)
    try:
        assert spec.streamable == streams
        assert spec.streaming == ("threshold search" if streams else "dense")
        q = torch.randn(1, 1, 4, 8)
        if streams:
            sk.attention(q, q, q, "user_thr", method="streaming")
        else:
            with pytest.raises(ValueError, match="stream"):
                sk.attention(q, q, q, "user_thr", method="streaming")
    finally:
        sk.unregister_normalizer("user_thr")


def test_pieces_must_be_hashable_callables():
    """Audit 2026-12-03: a callable dataclass instance failed deep inside with "unhashable type"."""
    import dataclasses

    @dataclasses.dataclass
    class Scaled:
        c: float

        def __call__(self, x):
            return self.c * x

    with pytest.raises(TypeError, match="g must be hashable"):
        sk.register_normalizer("user_x", family="softmax_of", g=Scaled(2.0), dg=dtilt)
    with pytest.raises(TypeError, match="dg must be callable"):
        sk.register_normalizer("user_x", family="softmax_of", g=tilt, dg=3)
    assert "user_x" not in sk.registry.names()


def test_unregister_unknown_name():
    with pytest.raises(ValueError, match="unknown normalizer"):
        sk.unregister_normalizer("never_registered")


def test_builtin_pieces_without_a_signature_take_x_only():
    """torch.exp has no signature inspect can read: it is a piece of x alone (sum-normalized
    exp is softmax), on the reference and on the attention paths."""
    sk.register_normalizer("user_exp_l1", family="sum_normalized", h=torch.exp, dh=torch.exp)
    try:
        x = torch.randn(3, 7, dtype=torch.float64)
        torch.testing.assert_close(sk.normalize(x, "user_exp_l1"), torch.softmax(x, -1))
        q, k, v = (torch.randn(1, 2, 150, 8, dtype=torch.float64) for _ in range(3))
        torch.testing.assert_close(sk.attention(q, k, v, "user_exp_l1", is_causal=True),
                                   sk.attention(q, k, v, "softmax", is_causal=True, method="dense"))
    finally:
        sk.unregister_normalizer("user_exp_l1")


def _cube(x):
    return torch.relu(x) ** 3


def _sigmoid_slope(x):
    return torch.sigmoid(x) * (1 - torch.sigmoid(x))


@pytest.mark.parametrize("family, kwargs, piece, right, wrong", [
    ("sum_normalized", {"h": _cube, "eps": 1e-6}, "dh", lambda x: 3 * torch.relu(x) ** 2,
     lambda x: 2 * torch.relu(x) ** 2),
    ("softmax_of", {"g": lambda x, s=2.0: s * x}, "dg", lambda x, s=2.0: torch.full_like(x, s),
     lambda x, s=2.0: torch.full_like(x, s + 1)),
    ("threshold", {"alpha": 1.5, "g": lambda x, n: x * torch.log(n)}, "dg",
     lambda x, n: torch.log(n) * torch.ones_like(x), lambda x, n: n * torch.ones_like(x)),
    ("elementwise", {"h": torch.sigmoid}, "dh", _sigmoid_slope, lambda x: torch.sigmoid(x)),
])
def test_a_derivative_piece_that_is_not_the_derivative_is_refused(family, kwargs, piece, right, wrong):
    """The derivative piece is compared with central differences of its function at a few
    scores (a typo in ``dh`` gave every backward a wrong gradient, silently); the right one is
    accepted, with the piece's parameters and ``n``."""
    with pytest.raises(ValueError, match=f"{piece} is not the derivative"):
        sk.register_normalizer("derivative_probe", family, **kwargs, **{piece: wrong})
    assert "derivative_probe" not in sk.registry.names()
    sk.register_normalizer("derivative_probe", family, **kwargs, **{piece: right})
    sk.unregister_normalizer("derivative_probe")


@pytest.mark.parametrize("eps,error", [(-1.0, ValueError), (-1e-6, ValueError), (float("inf"), ValueError),
                                       (float("-inf"), ValueError), (None, TypeError),
                                       (torch.tensor(-0.5, dtype=torch.float64), ValueError)])
def test_a_user_sum_normalized_eps_is_checked_at_the_call_as_at_registration(eps, error):
    """Hostile sweep 2026-12-05: register_normalizer refused eps=-1, but the call took it: weights
    of 8 from relu^3 scores (1, 2) with eps=-8, -0.0 on a row of zeros, attention outputs of -6."""
    sk.register_normalizer("user_eps_cube", family="sum_normalized", h=cube, dh=dcube, eps=1e-6)
    try:
        x = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
        with pytest.raises(error, match="eps"):
            sk.normalize(x, "user_eps_cube", eps=eps)
        q = torch.randn(1, 1, 2, 4, dtype=torch.float64)
        with pytest.raises(error, match="eps"):
            sk.attention(q, q, q, normalizer="user_eps_cube", eps=eps)
        torch.testing.assert_close(sk.normalize(x, "user_eps_cube", eps=0.0),
                                   torch.tensor([[1 / 9, 8 / 9, 0.0]], dtype=torch.float64))
    finally:
        sk.unregister_normalizer("user_eps_cube")


def _scaled(x, s):
    return s * x


def _dscaled(x, s):
    return s * torch.ones_like(x)


def _shifted(x, b=None):
    return torch.sigmoid(x + (0.0 if b is None else b))


def _dshifted(x, b=None):
    y = _shifted(x, b)
    return y * (1 - y)


def test_a_piece_parameter_without_a_default_is_required_by_name():
    """Hostile sweep 2026-12-05: a piece parameter without a default, left out of the call, reached
    the piece as None ("unsupported operand type(s) for *: 'NoneType' and 'Tensor'") from
    sk.normalize, sk.nn.Normalizer and sk.attention; a default of None is the piece's to read."""
    sk.register_normalizer("user_needs_s", family="softmax_of", g=_scaled, dg=_dscaled)
    sk.register_normalizer("user_default_none", family="elementwise", h=_shifted, dh=_dshifted)
    try:
        x = torch.randn(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        q = x[None, None]
        for call in (lambda: sk.normalize(x, "user_needs_s"), lambda: sk.nn.Normalizer("user_needs_s"),
                     lambda: sk.attention(q, q, q, normalizer="user_needs_s")):
            with pytest.raises(TypeError, match="normalizer 'user_needs_s' needs s"):
                call()
        torch.testing.assert_close(sk.normalize(x, "user_needs_s", s=2.0), torch.softmax(2 * x, -1))
        torch.testing.assert_close(sk.nn.Normalizer("user_needs_s", s=2.0)(x), torch.softmax(2 * x, -1))
        torch.testing.assert_close(sk.normalize(x, "user_default_none"), torch.sigmoid(x))
    finally:
        sk.unregister_normalizer("user_needs_s")
        sk.unregister_normalizer("user_default_none")
