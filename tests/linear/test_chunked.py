"""The engine: step-by-step decoding equals the full causal pass; the state is constant-size."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.linear import LinearAttentionState, draw_projection

METHODS = ["linear", "performer", "cosformer", "inline", "mala"]


def _params(method, d):
    if method == "performer":
        return {"projection": draw_projection(16, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)}
    if method == "cosformer":
        return {"max_len": 64}
    return {}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("prefill", [0, 1, 13])
def test_step_by_step_equals_full_causal_pass(method, prefill):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 30, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 30, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 30, 6, generator=g, dtype=torch.float64)
    params = _params(method, 8)
    full = sk.linear_attention(q, k, v, method, is_causal=True, **params)
    state = LinearAttentionState(method, chunk_size=4, **params)
    outs = []
    if prefill:
        outs.append(state.step(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill]))
    for t in range(prefill, 30):
        outs.append(state.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=0, atol=1e-10)
    assert state.position == 30
    assert state.sums.kv.shape[-2:] == (state.sums.k.shape[-1], 6)   # (F, Dv), whatever the length


@pytest.mark.parametrize("method", METHODS)
def test_step_with_padding_keys(method):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    params = _params(method, 4)
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[1, :3] = False  # left padding
    full = sk.linear_attention(q, k, v, method, is_causal=True, attn_mask=pad[:, None, None, :], **params)
    state = LinearAttentionState(method, **params)
    out = torch.cat([state.step(q[:, :, :5], k[:, :, :5], v[:, :, :5], key_mask=pad[:, :5])]
                    + [state.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], key_mask=pad[:, t:t + 1])
                       for t in range(5, 12)], dim=2)
    torch.testing.assert_close(out, full, rtol=0, atol=1e-10)


def test_performer_state_rescales_when_a_larger_key_arrives():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 10, 4, generator=g) for _ in range(3))
    k[..., 7, :] *= 6.0   # its features dwarf the earlier keys': the carried sums are rescaled
    proj = draw_projection(32, 4, generator=g)
    full = sk.linear_attention(q, k, v, "performer", is_causal=True, projection=proj)
    state = LinearAttentionState("performer", projection=proj)
    out = torch.cat([state.step(q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :]) for t in range(10)], 2)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_state_errors():
    with pytest.raises(ValueError, match="no recurrent decoding form"):
        LinearAttentionState("soft")
    with pytest.raises(ValueError, match="needs max_len"):
        LinearAttentionState("cosformer")
    state = LinearAttentionState("linear")
    x = torch.randn(1, 2, 3, 4)
    state.step(x, x, x)
    with pytest.raises(ValueError, match="holds"):
        state.step(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))
    with pytest.raises(ValueError, match="as many new keys as new queries"):
        state.step(x[:, :, :1], x, x)
    state.reset()
    assert state.position == 0 and state.sums is None


def test_no_lxl_tensor_in_the_causal_graph():
    """Everything autograd saves is O(L): the largest saved tensor is far below L x L."""
    length = 512
    q = torch.randn(1, 1, length, 16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sk.linear_attention(q, q, q, "linear", is_causal=True, chunk_size=32).sum()
    assert max(saved) < length * length / 8
