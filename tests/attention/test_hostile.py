"""Hostile inputs to every attention path, each against the dense reference in float64:
streaming rows whose first key tiles are all hidden and whose scores are far below 0, tiles of
finfo.min fills, head dims of 0, no query heads, and ties in sparse_softmax's top-k."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.attention.api import auto_method

from ..conftest import params_for

F64 = torch.float64


def _out_and_grads(q, k, v, name, method, /, **kw):
    out = sk.attention(q, k, v, name, method=method, **kw)
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    return out, torch.autograd.grad((out * weight).sum(), [q, k, v])


def _same(got, want, tol):
    out, grads = got
    ref, ref_grads = want
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


STREAMS = [s.name for s in sk.normalizers() if s.stream_rule(s.with_defaults({})) is not None]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", STREAMS)
def test_streaming_row_that_first_sees_a_key_far_below_zero(name, dtype):
    """Left padding: a query's first key tiles are all hidden and its first visible score is
    -200. The running sums (zeros, against the stand-in shift 0) were rescaled by
    e^{0 - (-200)} = inf, and inf * 0 made the whole row NaN (softmax, SA-Softmax, MultiMax,
    softmax with a sink)."""
    q = torch.ones(1, 1, 2, 1, dtype=dtype, requires_grad=True)
    k = torch.tensor([0.0, 1.0, -200.0, -200.75], dtype=dtype).view(1, 1, 4, 1).requires_grad_()
    v = torch.tensor([[1.0, 0.5], [2.0, -1.0], [3.0, 0.25], [-4.0, 2.0]], dtype=dtype).view(1, 1, 4, 2)
    v.requires_grad_()
    pad = torch.tensor([False, False, True, True])
    want = _out_and_grads(q, k, v, name, "dense", attn_mask=pad, scale=1.0)
    got = _out_and_grads(q, k, v, name, "streaming", attn_mask=pad, scale=1.0, block_size=(2, 1))
    _same(got, want, 1e-4 if dtype == torch.float32 else 1e-12)  # float32: ulp(200) = 1.5e-5


@pytest.mark.parametrize("name", STREAMS)
def test_streaming_tile_of_finfo_min_fills_then_ordinary_scores(name):
    """An additive mask of finfo.min (visible, but far below every other score) filling a
    whole key tile: SA-Softmax's sum of x e^{x - c} over that tile overflowed to -inf, and
    the rescaling by e^{c_old - c_new} = 0 turned it into NaN."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=gen, dtype=F64).requires_grad_() for _ in range(3))
    mask = torch.zeros(1, 1, 5, 5, dtype=F64)
    mask[..., :2] = torch.finfo(F64).min
    want = _out_and_grads(q, k, v, name, "dense", attn_mask=mask)
    got = _out_and_grads(q, k, v, name, "streaming", attn_mask=mask, block_size=2)
    _same(got, want, 1e-12)


@pytest.mark.parametrize("method", ["auto", "dense", "fused", "streaming"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,d", [((0, 1), 4), ((0, 0), 4), ((2, 2), 0)])
def test_no_query_heads_and_head_dim_zero(heads, d, causal, method):
    """H = 0 (with one key/value head, or none: a ValueError about multiples of 0 before, audit
    2026-12-03) gives an empty output and zero gradients for k and v;
    D = 0 makes every score 0 (the mean of the visible values). The streaming path failed on
    both (a per-row column sliced from q, and k left unrepeated for 0 groups)."""
    h, hk = heads
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, h, 5, d, generator=gen, dtype=F64).requires_grad_()
    k = torch.randn(1, hk, 6, d, generator=gen, dtype=F64).requires_grad_()
    v = torch.randn(1, hk, 6, 3, generator=gen, dtype=F64).requires_grad_()
    want = _out_and_grads(q, k, v, "ssmax", "dense", is_causal=causal)
    got = _out_and_grads(q, k, v, "ssmax", method, is_causal=causal)
    assert got[0].shape == (1, h, 5, 3)
    _same(got, want, 1e-12)


def test_query_heads_without_key_value_heads_are_refused():
    with pytest.raises(ValueError, match="at least one key/value head"):
        sk.attention(torch.randn(1, 2, 5, 4), torch.randn(1, 0, 6, 4), torch.randn(1, 0, 6, 4))


@pytest.mark.parametrize("name,good,bad", [("softmax", {"temperature": 1}, {"temperature": True}),
                                           ("ssmax", {"s": 1}, {"s": True}),
                                           ("multimax", {"r": (0, 0, 0, 1)}, {"r": (0, 0, 0, True)}),
                                           ("softmax_sink", {"sink": 0}, {"sink": False})])
def test_a_bool_parameter_is_refused_after_an_accepted_equal_number(name, good, bad):
    """Audit 2026-12-03: the cache of accepted parameter sets keyed True as 1 (equal, and of one
    hash), so after one call with 1 a call with True was never checked."""
    q = torch.randn(1, 1, 4, 8)
    sk.attention(q, q, q, name, **good)
    with pytest.raises(TypeError, match="bool"):
        sk.attention(q, q, q, name, **bad)


def test_sparse_softmax_breaks_ties_by_lowest_index():
    """Ties at the k-th value keep the lowest indices, whatever the row length: the fused
    path's causal tiles (narrower than the rows) kept other keys than the dense path before
    (torch.topk leaves the order of ties unspecified)."""
    x = torch.tensor([0.0, 3.0, 0.0, 3.0, 3.0, -1.0])
    torch.testing.assert_close(sk.sparse_softmax(x, k=2), torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.0]))
    p = sk.sparse_softmax(x, k=4)
    assert (p > 0).tolist() == [True, True, False, True, True, False]
    masked = sk.sparse_softmax(torch.zeros(5), k=2, mask=torch.tensor([False, True, False, True, True]))
    torch.testing.assert_close(masked, torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0]))
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 7, 3, generator=gen, dtype=F64).requires_grad_() for _ in range(3))
    for causal in (False, True):
        want = _out_and_grads(q, k, v, "sparse_softmax", "dense", is_causal=causal, scale=0.0, k=3)
        for block in (None, 2, 3):
            got = _out_and_grads(q, k, v, "sparse_softmax", "fused", is_causal=causal, scale=0.0, k=3,
                                 block_size=block)
            _same(got, want, 1e-12)


def test_bad_block_size_and_devices_raise_naming_the_argument():
    q = k = v = torch.randn(1, 2, 6, 4)
    with pytest.raises(TypeError, match="block_size"):
        sk.attention(q, k, v, "ssmax", method="streaming", block_size=2.0)
    with pytest.raises(TypeError, match="block_size"):
        sk.attention(q, k, v, "ssmax", method="fused", block_size=True)
    with pytest.raises(ValueError, match="q, k and v must be on one device"):
        sk.attention(q, k.to("meta"), v, "ssmax")


def test_attention_module_names_a_bad_input():
    layer = sk.nn.Attention(16, 4, "ssmax", kv_heads=2)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, dim\) with dim=16"):
        layer(x[0])
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, dim\) with dim=16"):
        layer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"context must have shape"):
        layer(x, context=torch.randn(2, 7, 12))
    with pytest.raises(ValueError, match="batch size"):
        layer(x, context=torch.randn(3, 7, 16))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer([[1.0]])
    assert layer(x, context=torch.randn(2, 7, 16)).shape == (2, 5, 16)


@pytest.mark.parametrize("method", ["auto", "fused"])
def test_temperature_below_one_keeps_a_row_of_finfo_min_fills_visible(method):
    """softmax(x / T) with T = 0.5 on an additive mask of finfo.min (Hugging Face's fill):
    the fill times 1 / T overflowed to -inf on SDPA ("auto") and the fused path, which hid a
    whole row of fills (output 0) where the dense path gives it uniform weights; rows partly
    filled were right already."""
    gen = torch.Generator().manual_seed(3)
    length = 130   # above the dense size of method="auto"
    q, k, v = (torch.randn(1, 2, length, 8, generator=gen).requires_grad_() for _ in range(3))
    mask = torch.zeros(length, length)
    mask[2] = torch.finfo(torch.float32).min
    mask[3, :60] = torch.finfo(torch.float32).min
    want = _out_and_grads(q, k, v, "softmax", "dense", attn_mask=mask, temperature=0.5)
    got = _out_and_grads(q, k, v, "softmax", method, attn_mask=mask, temperature=0.5)
    torch.testing.assert_close(got[0][..., 2, :], v.detach().mean(-2), rtol=1e-5, atol=1e-5)
    _same(got, want, 1e-4)
    with torch.no_grad():   # no gradient wanted: "auto" runs SDPA
        out = sk.attention(q, k, v, "softmax", attn_mask=mask, temperature=0.5, method=method)
    torch.testing.assert_close(out, want[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["fused", "streaming"])
@pytest.mark.parametrize("name,params", [
    ("ssmax", {}),                                                   # s log n > 1 at n = 130
    ("multimax", {"r": (0.1, -0.2, 0.3, 0.1), "t": (0.5, 1.0, -0.5, 2.0)}),
    ("softmax", {"temperature": 0.5}),
])
def test_a_row_of_finfo_min_fills_stays_visible_when_g_overflows(method, name, params):
    """g(x) past -finfo.max (SSMax's s log n, MultiMax's slope, 1 / T above 1) on a row whose
    every score is a finfo.min fill: the fused kernels and the streaming rule read the
    overflowed -inf as "nothing visible" (output 0), where the dense path gives the row
    uniform weights. They now hold g at -finfo.max there (hostile audit, 2026-12-01), and give
    the row the dense path's gradient g'(x) p (dp - D) where g' and it are finite, 0 elsewhere
    (2026-12-02: the fused kernels' MultiMax quadratic terms had made it NaN; the streaming
    rule had given a held score the clamp's derivative 0)."""
    gen = torch.Generator().manual_seed(5)
    length = 130
    q, k, v = (torch.randn(1, 2, length, 8, generator=gen).requires_grad_() for _ in range(3))
    mask = torch.zeros(length, length)
    mask[2] = torch.finfo(torch.float32).min
    mask[3, :60] = torch.finfo(torch.float32).min
    out = sk.attention(q, k, v, name, method=method, attn_mask=mask, **params)
    want = sk.attention(q, k, v, name, method="dense", attn_mask=mask, **params)
    torch.testing.assert_close(out[..., 2, :], v.detach().mean(-2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    weight = torch.linspace(-1, 2, out.numel()).reshape(out.shape)
    dq, dk, dv = torch.autograd.grad((out * weight).sum(), [q, k, v], retain_graph=True)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all()
    torch.testing.assert_close(dv, torch.autograd.grad((want * weight).sum(), v, retain_graph=True)[0], rtol=1e-4, atol=1e-4)
    # g'(x) p (dp - D) on the held row as well, where finite: the fused kernels (2026-12-02) and
    # the streaming rule (which gave held scores the clamp's derivative 0 until 2026-12-02)
    ref = torch.autograd.grad((want * weight).sum(), [q, k], retain_graph=True)
    for g, r in zip((dq, dk), ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["fused", "streaming"])
def test_multimax_whose_square_term_overflows_up_on_padding_fills(method):
    """MultiMax with t3 > 0 (nn.Normalizer's init has t3 ~ 0.02) on Hugging Face's finfo.min
    padding: ``t3 (r3 - x)^2`` overflows to +inf there, so softmax gives those keys the whole
    weight (the dense path computes such rows in float64: equal weights on the fills). The
    fused kernels and the streaming rule formed ``inf - inf``: every row NaN (hostile audit,
    2026-12-02). g is now held at finfo.max there; the fused path also keeps g'(x) p (dp - D)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=gen).requires_grad_() for _ in range(3))
    mask = torch.zeros(1, 1, 40, 40)
    mask[..., 30:] = torch.finfo(torch.float32).min
    mask[..., 4, :] = torch.finfo(torch.float32).min
    params = {"r": (0.0, 0.0, 0.0, 0.0), "t": (0.0, 0.01, 0.02, 0.0)}
    out = sk.attention(q, k, v, "multimax", method=method, attn_mask=mask, **params)
    want = sk.attention(q, k, v, "multimax", method="dense", attn_mask=mask, **params)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[..., 0, :], v.detach()[..., 30:, :].mean(-2), rtol=1e-5, atol=1e-5)
    weight = torch.linspace(-1, 2, out.numel()).reshape(out.shape)
    got = torch.autograd.grad((out * weight).sum(), [q, k, v])
    ref = torch.autograd.grad((want * weight).sum(), [q, k, v])
    assert all(torch.isfinite(g).all() for g in got)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=1e-5)
    if method == "fused":   # (streaming: a held score's derivative is a clamp's 0)
        for g, r in zip(got[:2], ref[:2]):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * float(r.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streaming_adaptive_softmax_on_a_row_of_finfo_min_fills(dtype):
    """The streaming rule's entropy ``c + log d - sum x e / d`` cancelled ``finfo.min`` against
    itself on a padded query row: right output, NaN (or inf) q and k gradients (hostile audit,
    2026-12-02). It now sums ``(x - c) e`` relative to the running shift."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, 4, generator=gen, dtype=dtype).requires_grad_()
    k, v = (torch.randn(1, 2, 5, 4, generator=gen, dtype=dtype).requires_grad_() for _ in range(2))
    mask = torch.zeros(3, 5, dtype=dtype)
    mask[0] = torch.finfo(dtype).min
    mask[2, :2] = torch.finfo(dtype).min
    want = _out_and_grads(q, k, v, "adaptive_softmax", "dense", attn_mask=mask)
    for block_size in (None, 2):
        got = _out_and_grads(q, k, v, "adaptive_softmax", "streaming", attn_mask=mask, block_size=block_size)
        _same(got, want, 1e-5 if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streaming_normalized_sa_softmax_on_rows_of_finfo_min_fills(dtype):
    """Normalized SA-Softmax on the streaming path, a row of finfo.min fills and a row of a few
    scores among fills: the rule split ``(x - low) e`` into ``x e - low e``, whose value sums
    overflowed to ``inf - inf`` (NaN output and gradients; hostile audit, 2026-12-01). It now
    sums ``(x - c) e`` relative to the running shift: outputs and gradients equal the dense path."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=dtype).requires_grad_() for n in (6, 40, 40))
    mask = torch.zeros(6, 40, dtype=dtype)
    mask[2] = torch.finfo(dtype).min
    mask[3, :20] = -1e9
    mask[4, 5:] = torch.finfo(dtype).min
    weight = torch.linspace(-1, 1, 8, dtype=dtype)
    for causal in (False, True):
        kw = {"is_causal": causal, "attn_mask": mask, "normalized": True}
        out = sk.attention(q, k, v, "sa_softmax", method="streaming", block_size=(4, 8), **kw)
        want = sk.attention(q, k, v, "sa_softmax", method="dense", **kw)
        torch.testing.assert_close(out, want)
        got = torch.autograd.grad((out * weight).sum(), [q, k, v])
        ref = torch.autograd.grad((want * weight).sum(), [q, k, v])
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r)


@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, -1e9])
def test_auto_softmax_gradient_on_a_padded_query_row(fill):
    """A query row whose additive mask is all finfo.min (or -1e9): torch's CPU flash SDPA
    backward gave it Lk times the gradient of the math backend (torch 2.13), so "auto" takes
    the dense path when gradients are wanted and such a row exists; rows of ordinary masks
    keep SDPA."""
    from softmaxkit.attention.sdpa import SdpaPlan, sdpa_backward_drifts
    from softmaxkit.attention.inputs import prepare

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=gen).requires_grad_() for _ in range(3))
    mask = torch.zeros(1, 1, 40, 40)
    mask[..., 5, :] = fill
    mask[..., 9, :20] = fill
    want = _out_and_grads(q, k, v, "softmax", "dense", attn_mask=mask)
    _same(_out_and_grads(q, k, v, "softmax", "auto", attn_mask=mask), want, 1e-4)
    ordinary = mask.clone()
    ordinary[..., 5, 0] = 0.0
    assert sdpa_backward_drifts(mask, prepare(q, k, v, is_causal=False, attn_mask=mask, scale=None), SdpaPlan(1.0))
    assert not sdpa_backward_drifts(ordinary, prepare(q, k, v, is_causal=False, attn_mask=ordinary, scale=None),
                                     SdpaPlan(1.0))


@pytest.mark.parametrize("name", ["multimax", "ssmax", "sa_softmax"])
@pytest.mark.parametrize("spread", [1e2, 1e4])
def test_fused_gradients_at_large_scores_follow_the_dense_float32_error(name, spread):
    """Scores of order 1e2-1e4 (q, k of std sqrt(spread)) with per-head parameters, float32
    fused CPU path against the float64 dense path, FlashAttention's rule: each gradient's error
    at most 3x that of the float32 dense path (plus a floor of 1e-6 of its scale). The backward
    row kernel formed ``dp - D`` with ``D = rowsum(dO * O)``, whose rounding ``g'`` multiplied:
    at 1e4 MultiMax's quadratic terms (``g' ~ 4e4``) gave q, k gradients of 4-5 and a t gradient
    of 600 where the exact ones are 0 (one-hot rows); SSMax's s gradient was 90x less accurate
    than the dense path's. ``D`` now comes from the row's own weights. SA-Softmax's factor kernel
    formed ``w dp - D`` (``w(x) = x``) with an FMA or reassociated: on one-hot rows its q and k
    gradients were 500-1000x the dense error at 1e2 (hostile audit, 2026-12-02)."""
    def run(method, dtype):
        gen = torch.Generator().manual_seed(1)
        q, k = ((torch.randn(1, 2, 64, 16, generator=gen, dtype=torch.float64) * spread ** 0.5).to(dtype)
                .requires_grad_() for _ in range(2))
        v = torch.randn(1, 2, 64, 16, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
        if name == "multimax":
            params = {"r": torch.tensor([0.1, -0.2, 0.3, 0.1], dtype=dtype).view(4, 1, 1, 1, 1).repeat(1, 1, 2, 1, 1),
                      "t": torch.tensor([0.5, 1.0, -0.5, 2.0], dtype=dtype).view(4, 1, 1, 1, 1).repeat(1, 1, 2, 1, 1)}
        elif name == "ssmax":
            params = {"s": torch.tensor([0.3, 0.6], dtype=dtype).view(1, 2, 1, 1)}
        else:
            params = {}
        params = {n: t.requires_grad_() for n, t in params.items()}
        out = sk.attention(q, k, v, name, is_causal=True, method=method, **params)
        weight = torch.linspace(-1, 1, out.numel(), dtype=dtype).view(out.shape)
        grads = torch.autograd.grad((out * weight).sum(), [q, k, v, *params.values()])
        return [out, *grads]

    ref = run("dense", torch.float64)
    dense32 = run("dense", torch.float32)
    fused32 = run("fused", torch.float32)
    for want, base, got in zip(ref, dense32, fused32):
        floor = 1e-6 * float(want.abs().max())
        base_err = float((base.double() - want).abs().max())
        assert float((got.double() - want).abs().max()) <= 3 * base_err + floor + 1e-12


#: one per row kernel: softmax_of (and its sink), weighted, sum_normalized, signed, elementwise
ONE_PASS_ON_THE_ROW_KERNELS = ["softmax", "multimax", "softmax_sink", "stablemax", "softpick", "relu_l1", "sigmoid"]


@pytest.mark.parametrize("name", ONE_PASS_ON_THE_ROW_KERNELS)
def test_plus_infinite_scores_give_the_dense_limit_on_the_fused_path(name):
    """A visible ``+inf`` score (an additive mask of ``+inf``) makes a normalised row its limit, equal
    weights on its ``+inf`` entries, which does not move with the scores (zero gradient there), as
    the dense path has it. The row kernels gave NaN rows (sum-normalised family, MultiMax's ``0 inf``)
    or the gradient of the finite row (softmax family); ``auto`` took SDPA's NaN."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 200, 8, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.zeros(200, 200, dtype=dtype)
    mask[3, 5] = mask[4, 7] = mask[4, 9] = float("inf")
    mask[6] = float("-inf")
    mask[6, 2] = float("inf")

    def run(method):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, name, attn_mask=mask, method=method)
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), leaves))

    want = run("dense")
    tol = 1e-5
    for method in ("fused", "auto"):
        for got, ref in zip(run(method), want):
            torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(("name", "param"), [("softmax_sink", "sink"), ("ssmax", "s"), ("softmax", "temperature"),
                                             ("sigmoid", "bias"), ("stablemax", None)])
@pytest.mark.parametrize("where", ["mask", "query"])
def test_per_head_parameter_gradients_beside_infinite_scores(name, param, where):
    """A row made its limit by a ``+inf`` score (an additive mask of ``+inf``, or an infinite query
    entry: ``+inf`` and ``-inf`` scores) has zero gradient, so it adds nothing to a per-head
    parameter's gradient: the fused path's chain rule multiplied that 0 by the piece's infinite
    derivative there (``d(s x log n)/ds``; the sink's weight ``e^{s - inf}`` over ``inf``), NaN."""
    dtype = torch.float64
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 160, 4, generator=gen, dtype=dtype) for _ in range(3))
    mask = None
    if where == "mask":
        mask = torch.zeros(160, 160, dtype=dtype)
        mask[1, 2] = mask[50, 7] = float("inf")
    else:
        q[0, 1, 4, 0] = float("inf")
    value = torch.tensor([0.3, 0.7], dtype=dtype).view(2, 1, 1)

    def run(method):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        params = {} if param is None else {param: value.clone().requires_grad_()}
        out = sk.attention(*leaves, name, attn_mask=mask, method=method, **params)
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), leaves + list(params.values())))

    want = run("dense")
    for method in ("fused", "auto"):
        for got, ref in zip(run(method), want):
            torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("method", ["streaming", "fused", "auto"])
def test_a_row_that_sees_nothing_under_a_very_low_sink(method):
    """A sink below -745 (float64; -104 in float32) underflows against the stand-in shift 0 of a row
    with nothing visible: the streaming rule divided 0 by 0."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[1] = False
    for sink in (-1000.0, -1e300):
        got = sk.attention(q, k, v, "softmax_sink", attn_mask=mask, sink=sink, method=method)
        want = sk.attention(q, k, v, "softmax_sink", attn_mask=mask, sink=sink, method="dense")
        assert (got[:, :, 1] == 0).all()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "param"), [("ssmax", "s"), ("sigmoid", "bias_offset")])
@pytest.mark.parametrize("causal", [False, True])
def test_minus_infinite_scores_leave_the_visible_count(name, param, causal):
    """An infinite key entry makes scores of ``-inf`` (and ``+inf``) in every query: the reference
    counts a ``-inf`` score as hidden, so the ``n`` of SSMax's ``s log n`` and sigmoid's ``-log n``
    leaves it out; the row kernels counted the key (the mask's count)."""
    dtype = torch.float64
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 150, 4, generator=gen, dtype=dtype) for _ in range(3))
    k[0, 0, 1, 0] = float("inf")
    k[0, 1, 3, 2] = float("-inf")
    value = torch.tensor([0.6, 1.4], dtype=dtype).view(2, 1, 1)

    def run(method):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + [value.clone().requires_grad_()]
        out = sk.attention(*leaves[:3], name, is_causal=causal, method=method, **{param: leaves[3]})
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), [leaves[2], leaves[3]]))

    want = run("dense")
    for method in ("fused", "auto"):
        for got, ref in zip(run(method), want):
            torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["fused", "fused, numba kernels", "streaming"])
def test_sa_softmax_output_on_a_row_of_finfo_min_fills_is_the_dense_one(method, dtype):
    """SA-Softmax ``x softmax(x)`` on a row whose every score is a finfo.min fill (left padding):
    the output ``fill * mean(v)`` is finite, but the fused kernels summed ``x e`` against the
    values before dividing by ``n`` and the streaming rule summed ``x e v`` (n fills times v:
    inf, and NaN in float32; hostile audit, 2026-12-02). Both now divide first; the streaming
    rule sums ``(x - c) e v`` and adds ``c`` times the mean of v. (The gradients: the next test.)"""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=gen, dtype=dtype) for _ in range(3))
    fill = torch.finfo(dtype).min
    mask = torch.zeros(16, 16, dtype=dtype)
    mask[:3] = fill            # rows of fills only
    mask[5, :4] = fill         # fills next to ordinary scores: weight 0 there
    with sk.use_backend("numba" if "numba" in method else "auto"), torch.no_grad():
        out = sk.attention(q, k, v, "sa_softmax", attn_mask=mask, method=method.split(",")[0])
        want = sk.attention(q, k, v, "sa_softmax", attn_mask=mask, method="dense")
    assert torch.isfinite(want).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["fused", "streaming"])
def test_sa_softmax_gradients_on_a_row_of_finfo_min_fills_are_the_dense_ones(method, dtype):
    """The gradients of that row are near finfo.max but finite (the dense reference scales the
    gradient per row). The fused kernel's backward summed ``w e dp`` with ``w(x) = x`` at the
    fills (``inf - inf``: NaN in every q and k gradient), and both paths formed ``dS k`` before
    the scale (inf where ``dS k scale`` is finite; hostile audit, 2026-12-04)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=gen, dtype=dtype).requires_grad_() for _ in range(3))
    mask = torch.zeros(16, 16, dtype=dtype)
    mask[3] = torch.finfo(dtype).min
    want = _out_and_grads(q, k, v, "sa_softmax", "dense", attn_mask=mask)
    assert all(torch.isfinite(g).all() for g in want[1])
    got = _out_and_grads(q, k, v, "sa_softmax", method, attn_mask=mask)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for g, r in zip(got[1], want[1]):
        torch.testing.assert_close(g, r, rtol=tol, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["softmax", "softpick", "entmax15", "clipped_softmax", "adaptive_softmax", "multimax"])
def test_a_plus_inf_mask_entry_gives_its_key_the_row_on_every_method(name, dtype):
    """A float mask adding +inf to a key: the dense reference gives that key the row's whole
    weight (output v[key]). The streaming rules (auto's path for clipped and adaptive softmax)
    and SDPA gave NaN rows, fused entmax15 raised a dtype error in float32 and NaN q / k
    gradients in float64 (hostile audit, 2026-12-02). Every method now runs the dense path then."""
    gen = torch.Generator().manual_seed(2)
    length = 150
    q, k, v = (torch.randn(1, 2, length, 8, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.zeros(length, length, dtype=dtype)
    mask[:, 1] = float("inf")
    results = {}
    for method in ("dense", "auto", "fused", "streaming"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, name, attn_mask=mask, method=method)
        results[method] = [out, *torch.autograd.grad((out * out.detach()).sum(), leaves)]
    torch.testing.assert_close(results["dense"][0], v[:, :, 1:2].expand_as(v))
    assert auto_method(q, k, v, name, attn_mask=mask) == "dense"
    for method in ("auto", "fused", "streaming"):
        for got, want in zip(results[method], results["dense"]):
            assert torch.isfinite(got).all(), method
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("fill", [-1e9, torch.finfo(torch.float32).min])
def test_explicit_sdpa_leaves_torch_where_a_padded_query_row_drifts(fill):
    """``method="sdpa"`` ran torch's kernel even where ``auto`` leaves it: on a query row whose
    every key a finite fill hides, torch's backward gave dq of about -9 where the dense gradient
    is 0.03 (hostile audit, 2026-12-02). The explicit method now takes auto's way out there."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 140, 16, generator=gen) for _ in range(3))
    mask = torch.zeros(140, 140)
    mask[5] = fill
    grads = {}
    for method in ("sdpa", "dense"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, "softmax", attn_mask=mask, method=method)
        grads[method] = [out, *torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), leaves)]
    for got, want in zip(grads["sdpa"], grads["dense"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_is_causal_takes_a_numpy_bool():
    """``is_causal=np.bool_(True)`` (a flag read from an array or a config) raised "is_causal
    must be a bool, got bool" (hostile audit, 2026-12-02); it is a bool. An int still raises."""
    import numpy as np

    q = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sk.attention(q, q, q, is_causal=np.bool_(True)), sk.attention(q, q, q, is_causal=True))
    with pytest.raises(TypeError, match="is_causal must be a bool, got int"):
        sk.attention(q, q, q, is_causal=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["relu_l1", "softplus_l1", "stablemax"])
def test_a_huge_finite_mask_bonus_stays_finite_on_the_fused_path(name, dtype):
    """A finite additive bonus near the dtype's range (1e38 in float32): the row's weights are
    finite (one-hot on that key), but the fused kernels summed ``h v`` against the values before
    dividing by ``sum h``, and formed ``dp sum h`` in the backward: inf / NaN outputs and
    gradients (hostile audit, 2026-12-02). Such rows are now normalised in the kernel."""
    gen = torch.Generator().manual_seed(8)
    length = 150
    q, k, v = (torch.randn(1, 2, length, 8, generator=gen, dtype=dtype) for _ in range(3))
    v = v * 10
    big = 1e38 if dtype == torch.float32 else 1e300
    mask = torch.zeros(length, length, dtype=dtype)
    mask[:, 1] = big
    mask[3] = big / 100
    results = {}
    for method in ("dense", "fused"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with sk.use_backend("numba"):
            out = sk.attention(*leaves, name, attn_mask=mask, method=method)
        results[method] = [out, *torch.autograd.grad(out.sum(), leaves)]
    for got, want in zip(results["fused"], results["dense"]):
        assert torch.isfinite(want).all() and torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("method", ["dense", "auto", "fused", "streaming"])
@pytest.mark.parametrize(("name", "param", "value"), [("softmax", "temperature", (0.7, 1.5)), ("ssmax", "s", (0.43, 0.8))])
def test_per_head_parameter_gradient_beside_a_padded_query_row(name, param, value, method, dtype):
    """Hugging Face's float mask: ``finfo.min`` where hidden, and a query row of padding that sees
    no key has every score ``finfo.min``. Its weights do not move with the parameter, nor do
    hidden entries' (weight 0); the parameter's chain rule ``sum_j dS_j x_j`` summed rounding
    errors times 1e38 there (temperature 0.7: NaN, 1.5: -1e30; SSMax: 2e31 or -inf), differently
    on each path. Expected: the float64 dense gradient with the same mask (softmax: as with a
    boolean mask, where the padded row is empty)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 8, generator=gen, dtype=F64) for _ in range(3))
    visible = torch.ones(40, 40, dtype=torch.bool).tril().expand(2, 1, 40, 40).clone()
    visible[1, :, :5] = False   # the first five queries of batch entry 1 are padding

    def param_grad(method, dtype, mask):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        theta = torch.tensor(value, dtype=dtype).view(2, 1, 1).requires_grad_()
        out = sk.attention(*leaves, name, attn_mask=mask, method=method, **{param: theta})
        weight = torch.linspace(-1, 2, out.numel(), dtype=dtype).reshape(out.shape)
        return torch.autograd.grad((out * weight).sum(), theta)[0]

    def hf_mask(dtype):
        return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)

    got = param_grad(method, dtype, hf_mask(dtype))
    want = param_grad("dense", F64, hf_mask(F64))
    assert torch.isfinite(got).all()
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    if name == "softmax":
        torch.testing.assert_close(want, param_grad("dense", F64, visible), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("mask_kind", "name", "method"), [
    (mask_kind, name, method) for mask_kind in ("bool", "-inf", "gqa")
    for name in ("softmax", "sigmoid", "sparsemax", "softpick", "ssmax")
    for method in ("auto", "dense", "fused", "streaming", "sdpa")
    # SDPA runs softmax, and SSMax's per-row scale with a boolean mask only
    if method != "sdpa" or name == "softmax" or (name == "ssmax" and mask_kind != "-inf")])
def test_garbage_in_slots_no_query_sees_stays_there(mask_kind, name, method):
    """A key-value cache preallocated with ``torch.empty`` and read past its length, under a
    key-padding mask: the hidden slots hold NaN and inf, and so does a query row that sees no
    key. Their weights are 0, but ``0 * NaN`` made every output and gradient of the head NaN on
    every path (torch's SDPA too). Expected: the result with zeros in those slots, and zero
    gradients there."""
    gen = torch.Generator().manual_seed(3)
    heads_kv = 1 if mask_kind == "gqa" else 2
    q = torch.randn(2, 2, 24, 8, generator=gen, dtype=F64)
    k, v = (torch.randn(2, heads_kv, 24, 8, generator=gen, dtype=F64) for _ in range(2))
    visible = torch.ones(2, 1, 24, 24, dtype=torch.bool)
    visible[1, ..., 18:] = False          # batch entry 1: keys 18.. are cache slots not yet written
    visible[0, :, 3] = False              # batch entry 0: query 3 sees no key
    mask = visible if mask_kind != "-inf" else torch.zeros(visible.shape, dtype=F64).masked_fill(~visible, float("-inf"))
    dirty = [t.clone() for t in (q, k, v)]
    dirty[1][1, :, 18:] = float("nan")
    dirty[2][1, :, 18:, ::2] = float("inf")
    dirty[2][1, :, 18:, 1::2] = float("nan")
    dirty[0][0, :, 3] = float("nan")
    clean = [t.clone() for t in (q, k, v)]
    for t in (clean[1], clean[2]):
        t[1, :, 18:] = 0
    clean[0][0, :, 3] = 0

    def run(tensors):
        leaves = [t.clone().requires_grad_() for t in tensors]
        out = sk.attention(*leaves, name, attn_mask=mask, method=method)
        weight = torch.linspace(-1, 2, out.numel(), dtype=F64).reshape(out.shape)
        return [out.detach(), *torch.autograd.grad((out * weight).sum(), leaves)]

    got, want = run(dirty), run(clean)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    dq, dk, dv = got[1:]
    assert dk[1, :, 18:].eq(0).all() and dv[1, :, 18:].eq(0).all() and dq[0, :, 3].eq(0).all()


@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("name", [s.name for s in sk.normalizers()])
def test_an_infinite_query_or_key_entry_gives_the_dense_result(name, where):
    """An infinite query entry makes a row of ``+inf`` and ``-inf`` scores (a ``-inf`` key entry, a
    column of them): the dense reference gives the limit's rows, where the streaming path gave NaN
    rows for most normalizers and the fused path NaN gradients for the entmax family, SA-Softmax
    and MultiMax with its own r and t. Every method now gives the dense result, NaN where it has
    NaN."""
    params = {"k": 5} if name == "sparse_softmax" else (
        {"r": (-1.0, 0.0, 0.5, 1.0), "t": (0.5, 0.3, 0.0, 0.1)} if name == "multimax" else {})
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 160, 8, generator=gen, dtype=F64) for _ in range(3))
    if where == "q":
        q[0, 0, 5, 0] = float("inf")
    else:
        k[0, 1, 7, 2] = float("-inf")

    def run(method):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = sk.attention(*leaves, name, is_causal=True, method=method, **params)
        weight = torch.linspace(-1, 2, out.numel(), dtype=F64).view_as(out)
        return [out.detach(), *torch.autograd.grad((out * weight).sum(), leaves)]

    want = run("dense")
    assert torch.isfinite(want[0][0, 0 if where == "q" else 1, 5 if where == "q" else 7:]).any()
    for method in ("auto", "fused", "streaming"):
        if method == "streaming" and name not in STREAMS:
            continue
        for got, ref in zip(run(method), want):
            torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, equal_nan=True)
    assert auto_method(q, k, v, name, is_causal=True, **params) in ("dense", "sdpa")   # (SDPA: then checked)


@pytest.mark.parametrize("method", ["auto", "fused", "streaming"])
def test_inputs_recording_a_gradient_raise_no_warning(method):
    """The check of q and k for non-finite entries read them as Python numbers with their graph
    (torch's "Converting a tensor with requires_grad=True to a scalar" warning on every call)."""
    import warnings

    q, k, v = (torch.randn(1, 2, 300, 8, requires_grad=True) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sk.attention(q, k, v, "sigmoid", is_causal=True, method=method).sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name, method", [(name, "streaming") for name in STREAMS] + [("as_entmax", "fused")])
def test_a_row_of_finfo_min_fills_has_the_dense_gradient(name, method, dtype):
    """An additive mask row of ``finfo.min`` (every score of the row rounds to the fill): the
    dense reference takes the row's maximum out first, so its weights and gradients are those
    of the tiny score differences. ASEntmax's streaming piece clamped the overflowing
    ``scale * x`` and passed no gradient (q and k got 0)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=F64).to(dtype).requires_grad_() for n in (3, 6, 6))
    mask = torch.zeros(1, 1, 3, 6, dtype=dtype)
    mask[..., 1, :] = torch.finfo(dtype).min
    params = params_for(name, 6)
    try:
        got = _out_and_grads(q, k, v, name, method, attn_mask=mask, **params)
    except ValueError:
        pytest.skip(f"method={method!r} does not run {name} with these parameters")
    want = _out_and_grads(q, k, v, name, "dense", attn_mask=mask, **params)
    if not all(torch.isfinite(t).all() for t in (want[0], *want[1])):
        pytest.skip("the dense reference itself is not finite here")
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    _same(got, want, tol)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(("method", "backend"), [("auto", "numba"), ("fused", "auto")])
def test_stablemax_rows_of_finfo_min_fills_have_the_dense_output_and_gradients(method, backend, dtype):
    """StableMax on query rows whose every visible key is a ``finfo.min`` fill (Hugging Face left
    padding under a causal mask): the fused kernels computed ``w / sum w`` without the row's
    maximum, with ``w = 1 / (1 - x) = 1 / finfo.max`` subnormal there, so ``1 / sum w`` overflowed
    and the q and k gradients were NaN where the dense path has 0 (2026-12-04). Such rows now go
    through ``g`` and the row's maximum, as the reference computes them."""
    gen = torch.Generator().manual_seed(3)
    length = 136
    q, k, v = (torch.randn(1, 2, length, 8, generator=gen, dtype=dtype).requires_grad_() for _ in range(3))
    mask = torch.zeros(length, length, dtype=dtype)
    mask[:, 0] = torch.finfo(dtype).min   # row 0 sees only the fill
    mask[5, :6] = torch.finfo(dtype).min  # every key row 5 sees is a fill
    mask[9, :3] = torch.finfo(dtype).min  # fills next to ordinary scores
    with sk.use_backend(backend):
        assert auto_method(q, k, v, "stablemax", True, mask) == "fused" or method == "fused"
        got = _out_and_grads(q, k, v, "stablemax", method, is_causal=True, attn_mask=mask)
    want = _out_and_grads(q, k, v, "stablemax", "dense", is_causal=True, attn_mask=mask)
    assert all(torch.isfinite(t).all() for t in (want[0], *want[1]))
    _same(got, want, 1e-5 if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("k", [2, 3])
def test_sparse_softmax_k_range_names_the_real_row_length_of_one_key(k):
    """With one key the check ran on a dummy row of two: k = 3 was refused as "between 1 and 2"
    (hostile audit, 2026-12-04)."""
    q, kk, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4)
    with pytest.raises(ValueError, match="between 1 and 1"):
        sk.attention(q, kk, v, "sparse_softmax", k=k)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(("name", "param", "value"), [("softmax", "temperature", (0.7, 1.3)), ("ssmax", "s", (1.2, 0.3))])
def test_a_learnable_parameter_leaves_the_gradient_of_a_query_a_fill_hides_whole(name, param, value, dtype):
    """Found by a hostile sweep (2026-12-04): on the fused path a learnable per-head parameter
    runs the row kernel without ``g'``, and a query row that a ``finfo.min`` fill hides whole,
    on a head where ``g`` overflows, got ``dq`` 0 there (dense, and fused with the parameter
    not learnable: the uniform row's gradient)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.zeros(4, 4, dtype=dtype)
    mask[1] = torch.finfo(dtype).min

    def grads(method, learnable):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        theta = torch.tensor(value, dtype=dtype).view(1, 2, 1, 1).requires_grad_(learnable)
        out = sk.attention(*leaves, name, attn_mask=mask, method=method, **{param: theta})
        return torch.autograd.grad(out.sum() + (out ** 2).sum(), leaves)

    want = grads("dense", True)
    for learnable in (False, True):
        for got, ref in zip(grads("fused", learnable), want):
            torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("dtype", [F64])
def test_multimax_t_gradient_beside_a_query_a_fill_hides_whole(dtype):
    """Found by a hostile sweep (2026-12-04): on the fused path MultiMax's learnable ``t`` took
    the modulator's derivative at the ``finfo.min`` fills of a hidden query row, where ``g``
    overflowed and is held (constant in ``t``): 1e291 for the dense path's -0.27 (which finite
    differences confirm). (float32: dense recomputes such rows in float64, where a float32 fill's
    quadratic term does not overflow: another value; see CHANGELOG.)"""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.zeros(4, 4, dtype=dtype)
    mask[1] = torch.finfo(dtype).min

    def t_grad(method):
        t = torch.full((4, 1, 2, 1, 1), 0.2, dtype=dtype, requires_grad=True)
        out = sk.attention(q, k, v, "multimax", attn_mask=mask, method=method, t=t)
        w = torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)
        return torch.autograd.grad((out * w).sum(), t)[0]

    want = t_grad("dense")
    assert torch.isfinite(want).all()
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    torch.testing.assert_close(t_grad("fused"), want, rtol=tol, atol=tol)
