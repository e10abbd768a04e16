"""sk.nn.Attention: shapes, grouped-query heads, per-head learnable normalizer parameters."""

import numpy as np
import pytest
import torch

import softmaxkit as sk


@pytest.mark.parametrize("name,learned", [("ssmax", ["s"]), ("sigmoid", ["bias_offset"]),
                                          ("multimax", ["r", "t"]), ("entmax", ["alpha_raw"]),
                                          ("softpick", [])])
def test_attention_module_learns_per_head_parameters(name, learned):
    torch.manual_seed(0)
    layer = sk.nn.Attention(16, heads=4, normalizer=name, kv_heads=2, is_causal=True)
    x = torch.randn(2, 7, 16)
    y = layer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().sum().backward()
    params = dict(layer.normalizer.named_parameters())
    assert sorted(params) == sorted(learned)
    for pname, p in params.items():
        assert p.shape[-3:] == (4, 1, 1) and p.grad is not None and p.grad.abs().sum() > 0, pname
    assert all(f"normalizer.{p}" in layer.state_dict() for p in learned)


def test_attention_module_equals_the_functional_call():
    torch.manual_seed(0)
    layer = sk.nn.Attention(12, heads=3, normalizer="ssmax", s=0.6)
    x = torch.randn(2, 5, 12)
    b = x.shape[0]
    q = layer.q_proj(x).view(b, 5, 3, 4).transpose(1, 2)
    k = layer.k_proj(x).view(b, 5, 3, 4).transpose(1, 2)
    v = layer.v_proj(x).view(b, 5, 3, 4).transpose(1, 2)
    ref = sk.attention(q, k, v, "ssmax", s=0.6, method="dense")
    expected = layer.out_proj(ref.transpose(1, 2).reshape(b, 5, 12))
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-5)


def test_cross_attention_and_masks():
    layer = sk.nn.Attention(8, heads=2, normalizer="relu_l1")
    x, ctx = torch.randn(1, 3, 8), torch.randn(1, 6, 8)
    mask = torch.zeros(1, 1, 3, 6, dtype=torch.bool)
    mask[..., :2, :4] = True
    y = layer(x, context=ctx, attn_mask=mask)
    assert y.shape == (1, 3, 8)
    torch.testing.assert_close(y[0, 2], layer.out_proj.bias, rtol=0, atol=1e-6)  # row 2 sees nothing


@pytest.mark.parametrize("kwargs", [{"kv_heads": 3}, {"heads": 0}, {"dim": 10, "heads": 4}])
def test_bad_module_arguments(kwargs):
    args = {"dim": 16, "heads": 4, **kwargs}
    with pytest.raises(ValueError):
        sk.nn.Attention(**args)


def test_reset_parameters_after_meta_construction():
    # to_empty of a layer built on the meta device left the normalizer's parameters uninitialised
    # and the layer had no reset_parameters (found by a lifecycle sweep)
    torch.manual_seed(0)
    reference = sk.nn.Attention(16, heads=4, normalizer="ssmax", kv_heads=2)
    with torch.device("meta"):
        layer = sk.nn.Attention(16, heads=4, normalizer="ssmax", kv_heads=2)
    layer.to_empty(device="cpu")
    torch.manual_seed(0)
    layer.reset_parameters()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(layer.state_dict()[key], value)


@pytest.mark.parametrize("bias", [-1.0, 0.0, torch.tensor(-1.0), 1])
def test_projection_bias_must_be_a_bool(bias):
    # Attention(..., "sigmoid", bias=-1.0) (the normalizer's bias, as sk.sigmoid takes it) built
    # projections with biases and sigmoid's default -log n, silently; bias=0.0 dropped them
    # (found by a lifecycle sweep)
    with pytest.raises(TypeError, match="bias must be a bool"):
        sk.nn.Attention(16, heads=4, normalizer="sigmoid", bias=bias)
    with pytest.raises(TypeError, match="bias must be a bool"):
        sk.nn.LinearAttention(16, heads=4, bias=bias)
    assert sk.nn.Attention(16, heads=4, bias=np.bool_(False)).q_proj.bias is None
