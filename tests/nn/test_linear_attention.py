"""softmaxkit.nn.LinearAttention: shapes, GQA, padding, decoding, performer's buffer."""

import pytest
import torch

import softmaxkit as sk

METHODS = ["linear", "performer", "cosformer", "inline", "mala"]


@pytest.mark.parametrize("method", METHODS)
def test_forward_backward_and_step_equal_full(method):
    torch.manual_seed(0)
    params = {"max_len": 32} if method == "cosformer" else {}
    layer = sk.nn.LinearAttention(16, heads=4, method=method, kv_heads=2, is_causal=True, seed=0, **params).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    y = layer(x)
    y.sum().backward()
    assert y.shape == x.shape and layer.q_proj.weight.grad.abs().sum() > 0
    state = layer.new_state()
    with torch.no_grad():
        steps = torch.cat([layer.step(x[:, :5], state)] + [layer.step(x[:, t:t + 1], state) for t in range(5, 12)], 1)
    torch.testing.assert_close(steps, y.detach(), rtol=0, atol=1e-10)


def test_soft_module_and_padding():
    torch.manual_seed(0)
    layer = sk.nn.LinearAttention(16, heads=2, method="soft", rank=4)
    x = torch.randn(2, 12, 16)
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[1, 8:] = False
    y = layer(x, key_padding_mask=pad)
    x2 = x.clone()
    x2[1, 8:] = 100.0   # padded positions change: the visible outputs do not
    torch.testing.assert_close(layer(x2, key_padding_mask=pad)[1, :8], y[1, :8])
    with pytest.raises(ValueError, match="no causal form"):
        sk.nn.LinearAttention(16, heads=2, method="soft", is_causal=True)


def test_performer_projection_is_a_saved_buffer_and_redrawn():
    layer = sk.nn.LinearAttention(16, heads=2, method="performer", nb_features=8, seed=1)
    assert layer.state_dict()["projection"].shape == (8, 8)
    x = torch.randn(1, 5, 16)
    before = layer(x)
    clone = sk.nn.LinearAttention(16, heads=2, method="performer", nb_features=8, seed=2)
    clone.load_state_dict(layer.state_dict())
    torch.testing.assert_close(clone(x), before)
    layer.redraw_features(seed=3)
    assert not torch.allclose(layer(x), before)
    with pytest.raises(ValueError, match="no random features"):
        sk.nn.LinearAttention(16, heads=2, method="linear").redraw_features()


def test_bad_arguments():
    with pytest.raises(ValueError, match="kv_heads"):
        sk.nn.LinearAttention(16, heads=4, kv_heads=3)
    with pytest.raises(TypeError, match="unexpected parameter"):
        sk.nn.LinearAttention(16, heads=4, method="linear", rank=2)
    with pytest.raises(ValueError, match="unknown linear attention method"):
        sk.nn.LinearAttention(16, heads=4, method="nope")
    layer = sk.nn.LinearAttention(16, heads=4)
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer(torch.randn(2, 5, 16), key_padding_mask=torch.ones(2, 4, dtype=torch.bool))


def test_step_checks_its_inputs():
    """Hostile sweep 2026-12-04: step() checked nothing: a wrong width raised torch's "mat1 and
    mat2 shapes cannot be multiplied", a (B, dim) input "not enough values to unpack", and a
    state of another method decoded silently with that method."""
    layer = sk.nn.LinearAttention(16, 2, method="linear", is_causal=True)
    with pytest.raises(ValueError, match="dim=16"):
        layer.step(torch.randn(2, 1, 15), layer.new_state())
    with pytest.raises(ValueError, match=r"\(B, L, dim\)"):
        layer.step(torch.randn(2, 16), layer.new_state())
    with pytest.raises(TypeError, match="LinearAttentionState"):
        layer.step(torch.randn(2, 1, 16), None)
    with pytest.raises(ValueError, match="'mala'"):
        layer.step(torch.randn(2, 1, 16), sk.linear.LinearAttentionState("mala"))


@pytest.mark.parametrize("params", [{"seed": 3}, {"projection": torch.randn(8, 4)}, {}])
def test_reset_parameters_after_meta_construction(params):
    # to_empty of a layer built on the meta device left performer's projection uninitialised and
    # the layer had no reset_parameters (found by a lifecycle sweep)
    method = "performer" if params else "linear"
    torch.manual_seed(0)
    reference = sk.nn.LinearAttention(16, heads=4, method=method, **params)
    with torch.device("meta"):
        layer = sk.nn.LinearAttention(16, heads=4, method=method, **params)
    layer.to_empty(device="cpu")
    torch.manual_seed(0)
    layer.reset_parameters()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(layer.state_dict()[key], value)


@pytest.mark.parametrize("method", ["linear", "mala"])
def test_compiled_aot_backward_through_the_head_views(method):
    # elu's backward gives the transposed head view another stride than its meta kernel says, and
    # torch.compile(layer, backend="aot_eager") failed in the backward on a view of the gradient
    # ("view size is not compatible with input tensor's size and stride"; found by a lifecycle sweep)
    torch.manual_seed(0)
    layer = sk.nn.LinearAttention(16, heads=4, method=method, kv_heads=2, is_causal=True)
    x = torch.randn(2, 6, 16)
    eager = torch.autograd.grad(layer(x).square().sum(), list(layer.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager")
    grads = torch.autograd.grad(compiled(x).square().sum(), list(layer.parameters()))
    for got, expected in zip(grads, eager):
        torch.testing.assert_close(got, expected)


def test_repr_names_the_method_parameters():
    # the repr left out the method's parameters: performer with nb_features=16 looked like the
    # default 256, SOFT's rank and cosformer's max_len were not shown (found by a lifecycle sweep)
    layer = sk.nn.LinearAttention(16, heads=4, method="performer", nb_features=16, seed=0)
    assert "nb_features=16" in repr(layer)
    assert "rank=3" in repr(sk.nn.LinearAttention(16, heads=4, method="soft", rank=3))
    assert "max_len=32" in repr(sk.nn.LinearAttention(16, heads=4, method="cosformer", max_len=32))
    given = sk.nn.LinearAttention(16, heads=4, method="performer", projection=torch.randn(8, 4))
    assert "nb_features=8" in repr(given) and "projection" not in repr(given)
