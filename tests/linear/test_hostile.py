"""Hostile audit of the linear-attention methods, 2026-12-02: each test is a reproducer that
failed before its fix."""

import math

import numpy as np
import pytest
import torch

import softmaxkit as sk
from softmaxkit.linear import LinearAttentionState, draw_projection


def _performer_reference(q, k, v, projection, causal):
    """FAVOR+'s ratio with the same projection, in log space (no range limit)."""
    scale = 1 / math.sqrt(q.shape[-1])
    xq, xk = q * math.sqrt(scale), k * math.sqrt(scale)
    uq = xq @ projection.T - 0.5 * (xq * xq).sum(-1, keepdim=True)
    uk = xk @ projection.T - 0.5 * (xk * xk).sum(-1, keepdim=True)
    log_s = torch.logsumexp(uq[..., :, None, :] + uk[..., None, :, :], -1)
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        hidden = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq)
        log_s = log_s.masked_fill(hidden, float("-inf"))
    return torch.softmax(log_s, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("magnitude", [1.0, 5.0, 10.0, 30.0])
def test_performer_is_its_ratio_at_every_magnitude(causal, magnitude):
    """The denominator was clamped at eps = 1e-6 after each query's features and the keys'
    were divided by their maxima (at |q| ~ 5 about 2 of error), and causal keys were measured
    against the largest key of the whole sequence, future ones included (the output of query 0
    changed with key 1)."""
    g = torch.Generator().manual_seed(0)
    projection = draw_projection(64, 8, generator=g, dtype=torch.float64)
    q, k = (torch.randn(1, 2, 16, 8, generator=g, dtype=torch.float64) * magnitude for _ in range(2))
    v = torch.randn(1, 2, 16, 3, generator=g, dtype=torch.float64)
    expected = _performer_reference(q, k, v, projection, causal)
    for chunk in (1, 5, 64):
        out = sk.linear_attention(q, k, v, "performer", projection=projection, is_causal=causal, chunk_size=chunk)
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_performer_causal_first_query_sees_only_the_first_key():
    g = torch.Generator().manual_seed(19)
    projection = draw_projection(16, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, k = (torch.randn(1, 1, 2, 4, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    v = torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64)
    out = sk.linear_attention(q, k, v, "performer", projection=projection, is_causal=True)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0], rtol=1e-12, atol=1e-12)


def test_performer_decoding_equals_the_causal_pass_at_large_magnitude():
    g = torch.Generator().manual_seed(3)
    projection = draw_projection(32, 8, generator=g, dtype=torch.float64)
    q, k = (torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64) * 8 for _ in range(2))
    v = torch.randn(1, 2, 12, 3, generator=g, dtype=torch.float64)
    full = sk.linear_attention(q, k, v, "performer", projection=projection, is_causal=True)
    state = LinearAttentionState("performer", projection=projection)
    steps = [state.step(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :]) for a, b in ((0, 5), (5, 6), (6, 12))]
    torch.testing.assert_close(torch.cat(steps, -2), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(full, _performer_reference(q, k, v, projection, True), rtol=1e-9, atol=1e-9)


def test_performer_gradcheck_with_scaled_features():
    g = torch.Generator().manual_seed(1)
    projection = draw_projection(8, 4, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64).mul(2).requires_grad_() for _ in range(3))
    for causal in (False, True):
        torch.autograd.gradcheck(lambda a, b, c: sk.linear_attention(
            a, b, c, "performer", projection=projection, is_causal=causal, chunk_size=2), (q, k, v))


@pytest.mark.parametrize("method", ["linear", "performer", "cosformer", "inline", "mala"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_nan_value_behind_a_padding_mask_stays_out(method, causal):
    """Masked values were zeroed by a product, and NaN * 0 = NaN reached every query."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 2, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([True, True, True, False])
    params = {"projection": draw_projection(8, 2, generator=g, dtype=torch.float64)} if method == "performer" else {}
    clean = sk.linear_attention(q, k, v, method, is_causal=causal, attn_mask=mask, **params)
    v[0, 0, 3] = float("nan")
    k[0, 0, 3] = float("inf")
    out = sk.linear_attention(q, k, v, method, is_causal=causal, attn_mask=mask, **params)
    torch.testing.assert_close(out, clean, rtol=0, atol=0)


def test_a_nan_value_of_a_key_hidden_from_every_query_stays_out_of_a_per_query_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 2, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[:, 3] = False
    clean = sk.linear_attention(q, k, v, "linear", attn_mask=mask)
    v[0, 0, 3] = float("nan")
    torch.testing.assert_close(sk.linear_attention(q, k, v, "linear", attn_mask=mask), clean, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["linear", "performer", "soft"])
def test_no_query_with_a_mask_gives_an_empty_result(method):
    q, k, v = torch.randn(2, 2, 0, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 3)
    out = sk.linear_attention(q, k, v, method, attn_mask=torch.ones(2, 1, 1, 5, dtype=torch.bool))
    assert out.shape == (2, 2, 0, 3)
    state = LinearAttentionState("linear")
    assert state.step(q, k[..., :0, :], v[..., :0, :], key_mask=torch.ones(2, 0, dtype=torch.bool)).shape == (2, 2, 0, 3)


def test_soft_converges_by_default_and_its_gradient_matches():
    """20 Newton-Schulz steps (the default) left the landmark pinv 35 away from pinv on a
    landmark matrix of condition 1.6e3, and gradcheck failed."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, 64, 16, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 64, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(sk.linear_attention(q, k, v, "soft"),
                               sk.linear_attention(q, k, v, "soft", newton_iters=200), rtol=1e-8, atol=1e-8)
    small = [t[..., :32, :].clone().requires_grad_() for t in (q, k, v)]
    torch.autograd.gradcheck(lambda a, b, c: sk.linear_attention(a, b, c, "soft", rank=8), small)


def test_soft_takes_fewer_landmarks_on_a_short_sequence():
    q = k = v = torch.randn(1, 1, 10, 4, dtype=torch.float64)
    assert sk.linear_attention(q, k, v, "soft").shape == (1, 1, 10, 4)
    with pytest.raises(ValueError, match="rank=32 must be at most"):
        sk.linear_attention(q, k, v, "soft", rank=32)


def test_numpy_scalars_are_taken_as_numbers():
    q = k = v = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    a = sk.linear_attention(q, k, v, "linear", is_causal=True, chunk_size=np.int64(2), eps=np.float32(1e-6))
    b = sk.linear_attention(q, k, v, "linear", is_causal=True, chunk_size=2, eps=torch.tensor(1e-6))
    torch.testing.assert_close(a, b)


def test_draw_projection_checks_its_arguments():
    with pytest.raises(TypeError, match="orthogonal"):
        draw_projection(8, 4, orthogonal="x")
    with pytest.raises(TypeError, match="dtype"):
        draw_projection(8, 4, dtype=torch.long)


def test_a_state_refuses_a_new_dtype_or_width():
    state = LinearAttentionState("linear")
    x = torch.randn(1, 1, 3, 4)
    state.step(x, x, x)
    with pytest.raises(ValueError, match="this state holds"):
        state.step(x.double(), x.double(), x.double())
    with pytest.raises(ValueError, match="this state holds"):
        state.step(x, x, torch.randn(1, 1, 3, 5))


def test_linear_attention_layer_takes_a_generator_for_its_projection():
    a = sk.nn.LinearAttention(16, 2, method="performer", nb_features=8, generator=torch.Generator().manual_seed(4))
    b = sk.nn.LinearAttention(16, 2, method="performer", nb_features=8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.projection, b.projection)
    with pytest.raises(TypeError, match="seed"):
        sk.nn.LinearAttention(16, 2, method="performer", seed=1.5)
    with pytest.raises(ValueError, match="seed or generator"):
        sk.nn.LinearAttention(16, 2, method="performer", seed=1, generator=torch.Generator())


@pytest.mark.parametrize("method", ["linear", "performer", "cosformer", "inline", "mala", "soft"])
@pytest.mark.parametrize("lq,lk", [(0, 5), (4, 0)])
def test_an_empty_result_is_attached_to_the_inputs(method, lq, lk):
    """Hostile sweep 2026-12-04: with no query or no key the output was a new tensor without a
    grad_fn, and its backward raised "element 0 of tensors does not require grad"."""
    q = torch.randn(2, 4, lq, 3, dtype=torch.float64)
    if lq:
        q[0, 0, 0, 0] = float("nan")   # its gradient is still 0
    q.requires_grad_()
    k = torch.randn(2, 2, lk, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, lk, 5, dtype=torch.float64, requires_grad=True)
    out = sk.linear_attention(q, k, v, method)
    assert out.shape == (2, 4, lq, 5) and out.dtype == torch.float64
    out.sum().backward()
    assert all(t.grad is not None and torch.equal(t.grad, torch.zeros_like(t)) for t in (q, k, v))
    if method != "soft":
        state = LinearAttentionState(method, **({"max_len": 8} if method == "cosformer" else {}))
        state.step(q[:, :, :0], k[:, :, :0], v[:, :, :0]).sum().backward()


def test_integer_parameters_take_numpy_ints_and_refuse_floats_with_a_type_error():
    """Hostile sweep 2026-12-04: chunk_size took a numpy int, but max_len, rank, newton_iters and
    nb_features refused one ("must be a positive int, got np.int64(10)", a ValueError), and
    refused a float with a ValueError."""
    q = k = v = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    pairs = [("cosformer", "max_len", 10), ("soft", "rank", 2), ("soft", "newton_iters", 30),
             ("performer", "nb_features", 8)]
    for method, name, value in pairs:
        seed = {"generator": torch.Generator().manual_seed(0)} if method == "performer" else {}
        a = sk.linear_attention(q, k, v, method, **{name: np.int64(value)}, **seed)
        seed = {"generator": torch.Generator().manual_seed(0)} if method == "performer" else {}
        torch.testing.assert_close(a, sk.linear_attention(q, k, v, method, **{name: value}, **seed), rtol=0, atol=0)
        with pytest.raises(TypeError, match=name):
            sk.linear_attention(q, k, v, method, **{name: float(value)})
    assert draw_projection(np.int64(8), np.int64(4)).shape == (8, 4)
    with pytest.raises(ValueError, match="newton_iters must be an int >= 0"):
        sk.linear.newton_pinv(torch.eye(2), -1)


def test_attention_weights_and_step_check_their_tensors_first():
    """Hostile sweep 2026-12-04: attention_weights built its identity from k's shape before any
    check (a list: AttributeError; a vector: IndexError), LinearAttentionState.step read q.dim()
    first (a list: AttributeError), and sk.nn.LinearAttention took a non-tensor projection with
    a ValueError."""
    from softmaxkit.linear import attention_weights

    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        attention_weights(q, [[1.0]])
    with pytest.raises(ValueError, match=r"k must have shape \(B, H, L, D\)"):
        attention_weights(q, torch.ones(3))
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        LinearAttentionState("linear").step([1.0], q, q)
    with pytest.raises(TypeError, match="projection"):
        sk.nn.LinearAttention(8, 2, method="performer", projection=[1.0])
