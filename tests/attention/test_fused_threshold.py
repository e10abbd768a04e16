"""The fused threshold family (sparsemax, 1.5-entmax, alpha-entmax) on the numba row kernels:
outputs and gradients equal the sort-based dense reference in float64 under causal masking,
padding, additive -inf masks, GQA, packed sequences and rows that see nothing; rows with a
NaN follow the reference; float32 at a longer causal length."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.attention import auto_method, fused

CASES = [("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 2.5})]
SCENARIOS = ["causal", "causal_padding_gqa", "additive", "causal_more_queries", "packed", "padding"]


def _scenario(kind, gen, lq=70, lk=70, h=3, d=8):
    """q, k, v, is_causal, attn_mask (float64); rows longer than one kernel block (32)."""
    b, hk, mask, causal = 2, h, None, False
    if kind == "causal":
        causal = True
    elif kind == "causal_padding_gqa":
        hk, causal = 1, True
        mask = torch.rand(b, 1, lq, lk, generator=gen) > 0.25
        mask[0, 0, 4] = False  # a row that sees nothing
    elif kind == "additive":
        mask = torch.randn(1, h, lq, lk, generator=gen, dtype=torch.float64)
        mask[..., 2, :] = float("-inf")
        mask[..., 0, 40:] = float("-inf")
    elif kind == "causal_more_queries":
        lk, causal = lq - 9, True  # the first 9 queries see no key (end-aligned diagonal)
    elif kind == "packed":
        causal = True
        doc = torch.arange(lq) // 25
        mask = (doc[:, None] == doc[None, :]).view(1, 1, lq, lk)
    elif kind == "padding":
        mask = torch.rand(b, 1, 1, lk, generator=gen) > 0.3
        mask[1] = False
    q = (3.0 * torch.randn(b, h, lq, d, generator=gen, dtype=torch.float64)).requires_grad_()
    k = torch.randn(b, hk, lk, d, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(b, hk, lk, d, generator=gen, dtype=torch.float64).requires_grad_()
    return q, k, v, causal, mask


def _run(q, k, v, name, causal, mask, params, method, block_size=None):
    backend = "numba" if method == "fused" else "reference"
    with sk.use_backend(backend):
        out = sk.attention(q, k, v, name, is_causal=causal, attn_mask=mask, method=method,
                           block_size=block_size, **params)
        weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
        grads = torch.autograd.grad((out * weight).sum(), [q, k, v])
    return out, grads


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name,params", CASES)
def test_fused_threshold_equals_sorted_reference_float64(name, params, scenario):
    gen = torch.Generator().manual_seed(SCENARIOS.index(scenario) * 7 + len(name))
    q, k, v, causal, mask = _scenario(scenario, gen)
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    got, got_grads = _run(q, k, v, name, causal, mask, params, "fused", block_size=16)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(got_grads, dense_grads):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name,params", CASES[:2])
def test_fused_threshold_one_head_per_tile(name, params, monkeypatch):
    """A tile budget of one head per tile (the layout of long sequences) agrees too."""
    monkeypatch.setattr(fused, "TILE_ELEMENTS", 16 * 70)
    gen = torch.Generator().manual_seed(11)
    q, k, v, causal, mask = _scenario("causal_padding_gqa", gen)
    dense, dense_grads = _run(q, k, v, name, causal, mask, params, "dense")
    got, got_grads = _run(q, k, v, name, causal, mask, params, "fused", block_size=16)
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10)
    for gs, gd in zip(got_grads, dense_grads):
        torch.testing.assert_close(gs, gd, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name,params", CASES[:2])
def test_fused_threshold_nan_row_follows_the_reference(name, params):
    """A query with a NaN gives NaN scores on its rows: the kernel leaves them to the reference,
    and the other rows are unaffected."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, causal, mask = _scenario("causal", gen)
    with torch.no_grad():
        q[0, 1, 33, 2] = float("nan")
    with torch.no_grad():
        with sk.use_backend("reference"):
            dense = sk.attention(q, k, v, name, is_causal=True, method="dense", **params)
        with sk.use_backend("numba"):
            got = sk.attention(q, k, v, name, is_causal=True, method="fused", block_size=16, **params)
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-10, equal_nan=True)
    assert torch.isnan(got[0, 1, 33]).all() and torch.isfinite(got[0, 1, :33]).all()


def test_fused_threshold_float32_long_causal_rows():
    """float32 at a length where rows span many kernel blocks, against the float64 reference."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 600, 32, generator=gen) for _ in range(3))
    for name in ("sparsemax", "entmax15"):
        with torch.no_grad():
            got = sk.attention(q, k, v, name, is_causal=True, method="fused")
            with sk.use_backend("reference"):
                ref = sk.attention(q.double(), k.double(), v.double(), name, is_causal=True, method="dense")
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", ["reference", "numba"])   # the tile's torch solver and the kernels
@pytest.mark.parametrize("alpha", [3.0, 5.0])
def test_fused_float32_gradients_past_alpha_two_follow_the_flash_rule(backend, alpha):
    """Past alpha = 2 the support's smallest weights hang on the threshold to many digits: the
    fused backward forms them in float64 from a float64 threshold, as the forward does (a
    float32 threshold gave dv 100x the error of the dense float32 path at alpha = 5)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v, d_o = (2 * torch.randn(1, 2, 80, 16, generator=gen) for _ in range(4))

    def run(dtype, method):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        with sk.use_backend(backend if method == "fused" else "reference"):
            out = sk.attention(*leaves, "entmax", alpha=alpha, is_causal=True, method=method)
            return [out, *torch.autograd.grad(out, leaves, d_o.to(dtype))]

    exact = run(torch.float64, "dense")
    dense = run(torch.float32, "dense")
    fused = run(torch.float32, "fused")
    for got, same_precision, want in zip(fused, dense, exact):
        limit = 3 * (same_precision.double() - want).abs().max() + 1e-7
        assert (got.double() - want).abs().max() <= limit


def test_auto_takes_the_fused_path_for_the_threshold_family():
    q = k = v = torch.randn(1, 4, 512, 16)
    for name in ("sparsemax", "entmax15"):
        assert auto_method(q, k, v, name, is_causal=True) == "fused"
        assert auto_method(q, k, v, name, attn_mask=torch.rand(1, 1, 512, 512) > 0.5) == "fused"
