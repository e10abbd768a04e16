"""sk.nn.Normalizer: learnable parameters, initialisations, per-head shapes, state_dict."""

import copy

import pytest
import torch

import softmaxkit as sk
from softmaxkit import registry
from softmaxkit.nn import Normalizer
from tests.conftest import params_for


@pytest.mark.parametrize("name", [s.name for s in registry.normalizers()])
def test_module_equals_functional_at_initialisation(name):
    torch.manual_seed(0)
    module = Normalizer(name, **params_for(name))
    x = torch.randn(3, 8)
    expected = registry.normalize(x, name, **params_for(name), **module.learned_values())
    torch.testing.assert_close(module(x), expected)


def test_paper_initialisations():
    assert Normalizer("ssmax").s.item() == pytest.approx(0.43)
    assert Normalizer("sigmoid").bias_offset.item() == 0.0
    assert Normalizer("entmax").learned_values()["alpha"].item() == pytest.approx(1.5)
    multimax = Normalizer("multimax", param_shape=(4, 1, 1))
    assert multimax.r.shape == (4, 4, 1, 1) and multimax.t.shape == (4, 4, 1, 1)
    assert 0 < multimax.r.std().item() < 0.1  # truncated normal, std 0.02, as the official code


def test_per_head_parameters_receive_gradients_and_are_saved():
    heads = 3
    for name in ("ssmax", "multimax", "sigmoid", "entmax"):
        module = Normalizer(name, param_shape=(heads, 1, 1))
        x = torch.randn(2, heads, 5, 5)
        (module(x) * torch.randn(2, heads, 5, 5)).sum().backward()
        params = dict(module.named_parameters())
        assert params and all(p.grad is not None and torch.isfinite(p.grad).all() for p in params.values())
        assert set(module.state_dict()) == set(params)


def test_learned_alpha_stays_in_range():
    module = Normalizer("entmax")
    with torch.no_grad():
        module.alpha_raw.fill_(50.0)
    assert module.learned_values()["alpha"].item() <= 2.0
    with pytest.raises(ValueError, match="alpha"):
        Normalizer("entmax", alpha=2.5)


def test_fixed_parameters_and_errors():
    module = Normalizer("softmax", temperature=0.5)
    x = torch.randn(4, 6)
    torch.testing.assert_close(module(x), sk.softmax(x, temperature=0.5))
    assert "temperature=0.5" in repr(module)
    assert repr(Normalizer("entmax", alpha=1.3)) == "Normalizer('entmax', dim=-1, learned=['alpha'])"
    assert repr(Normalizer("ssmax", learnable=False)) == "Normalizer('ssmax', dim=-1, learnable=False)"
    fixed_tensor = Normalizer("softmax", temperature=torch.tensor(0.5))
    assert repr(fixed_tensor) == "Normalizer('softmax', dim=-1, temperature=tensor(0.5))"
    assert "temperature=tensor(shape=())" in repr(fixed_tensor.to("meta"))
    per_row = Normalizer("softmax", param_shape=(3, 1), temperature=torch.full((3, 1), 0.5))
    assert "param_shape=(3, 1), temperature=tensor(shape=(3, 1))" in repr(per_row)
    with pytest.raises(TypeError, match="bogus"):
        Normalizer("softmax", bogus=1)
    with pytest.raises(ValueError, match="registered names"):
        Normalizer("nope")
    buffers = Normalizer("ssmax", learnable=False)
    assert not list(buffers.parameters()) and "s" in buffers.state_dict()


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"param_shape": 4}, TypeError, "param_shape must be a tuple of ints"),
    ({"param_shape": "ab"}, TypeError, "param_shape must be a tuple of ints"),
    ({"param_shape": (-1,)}, ValueError, r"param_shape\[0\] must be >= 0"),
    ({"dim": "a"}, TypeError, "dim must be an int"),
    ({"learnable": "no"}, TypeError, "learnable must be a bool"),
    ({"param_shape": (4, 1, 1), "s": torch.ones(2)}, ValueError, "s of shape"),
])
def test_normalizer_constructor_names_the_bad_argument(kwargs, error, match):
    """Hostile audit, 2026-12-02: these raised errors from deep inside (tuple unpacking,
    ``torch.full``, ``expand``), or ``learnable="no"`` was taken as True."""
    with pytest.raises(error, match=match):
        Normalizer("ssmax", **kwargs)


@pytest.mark.parametrize(("name", "kwargs", "match"), [
    ("softmax", {"temperature": -1.0}, "temperature"),
    ("softmax", {"temperature": float("nan")}, "temperature"),
    ("sparse_softmax", {"k": 0}, "k"),
])
def test_normalizer_refuses_a_bad_fixed_parameter_when_built(name, kwargs, match):
    """Hostile audit: ``Normalizer("softmax", temperature=-1)`` was built, and failed only at
    its first forward, far from the line that made it."""
    with pytest.raises(ValueError, match=match):
        Normalizer(name, **kwargs)


@pytest.mark.parametrize("module", [sk.nn.Attention, sk.nn.LinearAttention])
def test_attention_modules_name_an_input_of_the_wrong_width(module):
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, dim\) with dim=16"):
        module(16, 4)(torch.randn(2, 5, 8))


@pytest.mark.parametrize("name", sk.registry.names())
def test_a_normalizer_module_pickles(name):
    """Audit 2026-12-02: torch.save of a module holding sparsemax (and 9 others) failed on the
    lambdas of its spec."""
    import io

    module = Normalizer(name)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(2, 6)
    assert torch.equal(loaded(x), module(x)) and loaded.spec is module.spec


def test_module_arguments_are_checked_not_coerced():
    """Audit 2026-12-03: is_causal="no" became True, sparse_softmax's k=2.5 became 2 (the
    function refuses it), and an out-of-range dim raised a bare IndexError."""
    with pytest.raises(TypeError, match="is_causal"):
        sk.nn.Attention(8, 2, is_causal="no")
    with pytest.raises(TypeError, match="is_causal"):
        sk.nn.LinearAttention(8, 2, is_causal="no")
    for k in (2.5, "3"):
        with pytest.raises(TypeError, match="k must be an int"):
            sk.nn.Normalizer("sparse_softmax", k=k)
    with pytest.raises(ValueError, match="dim=3 is out of range"):
        sk.nn.Normalizer("softmax", dim=3)(torch.randn(2, 5))
    assert sk.nn.Normalizer("sparse_softmax", k=30)(torch.randn(2, 5)).count_nonzero(-1).tolist() == [5, 5]


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_a_fixed_entmax_alpha_takes_any_value_the_function_does(alpha):
    """Audit 2026-12-03: learnable=False still stored alpha through the learnable bounds (1, 2)."""
    layer = sk.nn.Normalizer("entmax", alpha=alpha, learnable=False)
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), sk.entmax(x, alpha=alpha))
    assert "alpha" in dict(layer.named_buffers())


def test_fixed_tensor_parameters_are_module_state():
    """Audit 2026-12-03: a per-head fixed temperature lived in a plain dict: absent from the
    state dict and left behind by .double() / .to()."""
    temperature = torch.tensor([0.5, 2.0]).reshape(2, 1, 1)
    layer = sk.nn.Normalizer("softmax", param_shape=(2, 1, 1), temperature=temperature)
    assert "temperature" in layer.state_dict()
    assert layer.double().temperature.dtype == torch.float64
    other = sk.nn.Normalizer("softmax", param_shape=(2, 1, 1), temperature=torch.ones(2, 1, 1))
    other.load_state_dict(layer.state_dict())
    x = torch.randn(3, 2, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(other.double()(x), sk.softmax(x, temperature=temperature.double()))


def test_an_explicit_performer_projection_is_a_saved_buffer():
    projection = torch.randn(8, 8)
    layer = sk.nn.LinearAttention(16, heads=2, method="performer", projection=projection)
    torch.testing.assert_close(layer.state_dict()["projection"], projection)
    x = torch.randn(1, 5, 16)
    before = layer(x)
    layer.redraw_features(seed=3)
    assert not torch.allclose(layer(x), before)
    with pytest.raises(ValueError, match="projection must be"):
        sk.nn.LinearAttention(16, heads=2, method="performer", projection=torch.randn(8, 5))


@pytest.mark.parametrize("name", ["softmax", "ssmax", "entmax", "as_entmax", "multimax"])
def test_modules_build_on_the_meta_device(name):
    """Deferred initialisation (``torch.device("meta")``): a bounded learnable parameter
    (entmax's alpha) checked its bounds with ``bool(...)`` and raised on meta tensors."""
    with torch.device("meta"):
        layer = sk.nn.Attention(16, 4, name)
        out = layer(torch.empty(2, 5, 16))
    assert out.shape == (2, 5, 16) and out.is_meta


def test_a_fixed_tensor_shapes_the_construction_probe():
    """Hostile sweep: the construction check ran the module on a probe shaped by param_shape alone,
    so a valid fixed tensor (a temperature per row, or per entry of rows of 3) was refused with
    "temperature of shape (2, 1) does not broadcast to the input shape (2,)"."""
    x = torch.randn(2, 3)
    per_row = torch.tensor([[0.5], [2.0]])
    torch.testing.assert_close(Normalizer("softmax", temperature=per_row)(x), sk.softmax(x, temperature=per_row))
    per_entry = torch.tensor([0.5, 1.0, 2.0])
    torch.testing.assert_close(Normalizer("softmax", temperature=per_entry)(x), sk.softmax(x, temperature=per_entry))
    per_column = per_entry[:, None]
    torch.testing.assert_close(Normalizer("softmax", dim=0, temperature=per_column)(x.T),
                               sk.softmax(x.T, dim=0, temperature=per_column))
    for name, value in (("ssmax", {"s": torch.full((2, 1), 0.4)}), ("ssmax", {"s": torch.full((3,), 0.4)}),
                        ("softmax_sink", {"sink": torch.zeros(2, 1)})):   # initial tensors beyond param_shape
        torch.testing.assert_close(Normalizer(name, **value)(x), sk.normalize(x, name, **value))
    with pytest.raises(ValueError, match="temperature"):   # still checked up front
        Normalizer("softmax", temperature=torch.tensor([[0.5], [-1.0]]))
    with pytest.raises(ValueError, match="broadcast"):   # a fixed tensor that param_shape contradicts
        Normalizer("ssmax", param_shape=(3, 1), n=torch.ones(2, 1))


def test_a_dim_past_any_input_builds_at_once_and_is_named_at_the_forward():
    """``Normalizer("softmax", dim=10**9)`` built a construction probe of 10^9 axes (a list of
    that many ints, then a tensor): it hung (found by a hostile sweep, 2026-12-04). The probe
    is skipped past 1024 axes; the forward names ``dim``."""
    module = sk.nn.Normalizer("softmax", dim=10**9)
    with pytest.raises(ValueError, match="dim"):
        module(torch.randn(3, 4))


@pytest.mark.parametrize("name,params", [("ssmax", {}), ("ssmax", {"s": torch.tensor([0.1, 0.2]).reshape(2, 1, 1)}),
                                         ("multimax", {}), ("entmax", {"alpha": 1.3}), ("as_entmax", {}),
                                         ("sigmoid", {}), ("softmax_sink", {}), ("entmax", {"learnable": False}),
                                         ("softmax", {"temperature": torch.tensor(0.5)})])
def test_reset_parameters_after_meta_construction(name, params):
    # a module built on the meta device and materialised with to_empty held uninitialised memory,
    # with no reset_parameters to initialise it (nn.Linear's convention; found by a lifecycle sweep)
    torch.manual_seed(0)
    reference = Normalizer(name, param_shape=(2, 1, 1), **params)
    with torch.device("meta"):
        module = Normalizer(name, param_shape=(2, 1, 1), **params)
    module.to_empty(device="cpu")
    torch.manual_seed(0)
    module.reset_parameters()
    moved = copy.deepcopy(reference).to("meta").to_empty(device="cpu").double()
    torch.manual_seed(0)
    moved.reset_parameters()
    assert module.state_dict().keys() == reference.state_dict().keys() == moved.state_dict().keys()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(module.state_dict()[key], value)
        torch.testing.assert_close(moved.state_dict()[key], value.double())
    x = torch.randn(3, 2, 4, 5)
    torch.testing.assert_close(module(x), reference(x))
