"""The numba row kernels of the CPU fused attention (kernels/cpu/attention.py) against the fused
path's torch operations on the same tiles: outputs and gradients (q, k, v, per-head
parameters), float64 and float32, with causal masking, bool and additive masks, empty rows
and hostile scores, for every normalizer that declares numba pieces."""

import importlib

import numpy as np
import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels.cpu import attention as rows
from softmaxkit.kernels.cpu._exp import exp_nonpositive_fast
from softmaxkit.kernels.cpu.pieces import IDENTITY

fused = importlib.import_module("softmaxkit.attention.fused")

NUMBA = [s.name for s in sk.normalizers() if s.numba is not None]
SCENARIOS = ["causal", "bool_empty_rows", "additive", "hostile"]


def _inputs(scenario, dtype, gen):
    b, h, lq, lk, d = 2, 3, 10, 13, 4
    mask, causal, scale = None, False, 1.0
    if scenario == "causal":
        causal = True
    elif scenario == "bool_empty_rows":
        mask = torch.rand(b, 1, lq, lk, generator=gen) > 0.4
        mask[:, :, 3] = False  # rows with no visible key
        mask[1] = False        # a batch entry that sees nothing
    elif scenario == "additive":
        mask = torch.randn(1, h, lq, lk, generator=gen, dtype=dtype)
        mask[..., 2, :] = float("-inf")
        mask[..., 0, 5:] = float("-inf")
        causal = True
    else:  # scores of +-1e4 and beyond
        scale, causal = 3e3, True
    q = (scale * torch.randn(b, h, lq, d, generator=gen, dtype=dtype)).requires_grad_()
    k = torch.randn(b, h, lk, d, generator=gen, dtype=dtype).requires_grad_()
    v = torch.randn(b, h, lk, d, generator=gen, dtype=dtype).requires_grad_()
    return q, k, v, causal, mask


def _learnable(name, h, dtype, gen):
    spec = sk.registry.get(name)
    out = {}
    for p in spec.param_specs:
        if p.learnable is None:
            continue
        init = torch.as_tensor(p.learnable.init, dtype=dtype)
        if p.size > 1:
            value = init.view(p.size, 1, 1, 1) + 0.3 * torch.randn(p.size, h, 1, 1, generator=gen, dtype=dtype)
        else:
            value = init + 0.1 * torch.randn(h, 1, 1, generator=gen, dtype=dtype)
        out[p.name] = value.requires_grad_()
    return out


def _run(q, k, v, name, causal, mask, params):
    out = sk.attention(q, k, v, name, is_causal=causal, attn_mask=mask, method="fused", block_size=4, **params)
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    tensors = [q, k, v] + [t for t in params.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    return out, torch.autograd.grad((out * weight).sum(), tensors)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", NUMBA)
def test_row_kernels_equal_the_torch_tiles(name, scenario, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(len(name) * 7 + SCENARIOS.index(scenario))
    q, k, v, causal, mask = _inputs(scenario, dtype, gen)
    learnable = scenario in ("causal", "additive")
    params = _learnable(name, q.shape[1], dtype, gen) if learnable else {}
    used = []
    real = fused._tile_pieces
    monkeypatch.setattr(fused, "_tile_pieces", lambda *a: used.append(real(*a)) or used[-1])
    got, got_grads = _run(q, k, v, name, causal, mask, params)
    assert used and used[0] is not None  # the row kernels ran
    monkeypatch.setattr(fused, "_tile_pieces", lambda *a: None)
    want, want_grads = _run(q, k, v, name, causal, mask, params)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-5, "atol": 2e-5}
    if scenario == "hostile" and dtype == torch.float32:
        tol = {"rtol": 1e-4, "atol": 1e-3}  # scores ~1e4: a float32 ulp of a score is ~1e-3
    spec = sk.registry.get(name)
    if scenario == "hostile" and dtype == torch.float64 and fused.kind_for(spec, spec.with_defaults({})) == "rows":
        # off the kernels these run their reference with autograd, not the same closed form: the
        # two round the products of scores ~1e4 and q ~3e3 differently (dP - D cancels at p ~ 1)
        tol = {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(got, want, **tol)
    for gs, gw in zip(got_grads, want_grads):
        scale = max(1.0, float(gw.abs().max()))
        torch.testing.assert_close(gs / scale, gw / scale, **tol)
    if mask is not None and scenario == "bool_empty_rows":
        assert (got[:, :, 3] == 0).all() and (got[1] == 0).all()
        assert (got_grads[0][:, :, 3] == 0).all() and (got_grads[0][1] == 0).all()


def _tile(dtype, r=6, c=9):
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(r, c, generator=gen, dtype=dtype) * 4
    lim = np.array([0, 1, 4, 9, 9, 7], dtype=np.int64)[:r]
    hidden = np.zeros((r, c), dtype=np.bool_)
    hidden[4, :] = True   # a row whose visible keys are all hidden
    hidden[5, ::2] = True
    cnt = np.maximum(lim, 1).astype(s.numpy().dtype)
    par = np.zeros((1, 1), dtype=s.numpy().dtype)
    return s, lim, hidden, cnt, par


def _visible(lim, hidden, c):
    vis = torch.arange(c)[None, :] < torch.as_tensor(lim)[:, None]
    return vis & ~torch.as_tensor(hidden)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_softmax_rows_forward_and_backward(dtype):
    s, lim, hidden, cnt, par = _tile(dtype)
    vis = _visible(lim, hidden, s.shape[1])
    want = torch.softmax(s.masked_fill(~vis, float("-inf")), -1).nan_to_num(0.0)
    got = s.clone()
    den = np.empty(s.shape[0], dtype=s.numpy().dtype)
    rows.softmax_of_forward(got.numpy(), den, lim, hidden, cnt, par, s.shape[0], True, IDENTITY.row, IDENTITY.fn,
                            IDENTITY.sink)
    tol = 1e-13 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got / torch.from_numpy(den)[:, None], want, rtol=tol, atol=tol)
    assert (got[~vis] == 0).all() and (got[:2].sum() == got[1].sum())
    # backward: dS = p (dp - rowsum(p dp)) for softmax; dd given as that row sum
    gen = torch.Generator().manual_seed(4)
    dp = torch.randn(s.shape, generator=gen, dtype=dtype)
    dd = (want * dp).sum(-1)
    p, ds = s.clone(), dp.clone()
    rows.softmax_of_backward(p.numpy(), ds.numpy(), dd.numpy(), lim, hidden, cnt, par, s.shape[0], True, IDENTITY.row,
                             IDENTITY.fn, IDENTITY.dfn, IDENTITY.sink, True)
    torch.testing.assert_close(p, want, rtol=tol, atol=tol)
    torch.testing.assert_close(ds, want * (dp - dd[:, None]), rtol=tol, atol=tol)
    assert (ds[~vis] == 0).all() and (ds[0] == 0).all() and (ds[4] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sum_normalized_and_elementwise_rows(dtype):
    relu_l1 = sk.registry.get("relu_l1").numba()
    s, lim, hidden, cnt, par = _tile(dtype)
    vis = _visible(lim, hidden, s.shape[1])
    f = torch.relu(s) * vis
    total = f.sum(-1, keepdim=True) + 1e-3
    got = s.clone()
    den = np.empty(s.shape[0], dtype=s.numpy().dtype)
    eps = s.numpy().dtype.type(1e-3)
    rows.sum_normalized_forward(got.numpy(), den, lim, hidden, cnt, par, s.shape[0], True, relu_l1.row, relu_l1.fn, eps)
    tol = 1e-13 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got, f, rtol=tol, atol=tol)
    torch.testing.assert_close(torch.from_numpy(den)[:, None], total, rtol=tol, atol=tol)
    got = s.clone()
    rows.elementwise_forward(got.numpy(), lim, hidden, cnt, par, s.shape[0], True, relu_l1.row, relu_l1.fn)
    torch.testing.assert_close(got, f, rtol=tol, atol=tol)


def test_fast_exp_is_within_two_ulp_and_safe_at_the_ends():
    from numba import njit

    @njit
    def apply(a):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = exp_nonpositive_fast(a[i])
        return out

    x = np.concatenate([np.linspace(-87.0, 0.0, 200001), [0.0, -1e-30, -87.5, -1e30, -np.inf]]).astype(np.float32)
    got = apply(x)
    ref = np.exp(x.astype(np.float64))
    normal = ref > np.finfo(np.float32).tiny
    ulp = np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    assert (np.abs(got[normal] - ref[normal]) / ulp).max() <= 2.0
    assert got[-5] == 1.0 and got[-4] == 1.0 and (got[-3:] == 0).all()
    assert np.isnan(apply(np.array([np.nan], dtype=np.float32))).all()


@pytest.mark.parametrize("grad", [False, True])
def test_softmax_with_a_per_head_temperature_uses_its_pieces(grad, monkeypatch):
    gen = torch.Generator().manual_seed(11)
    q, k, v, causal, mask = _inputs("causal", torch.float64, gen)
    temperature = (0.5 + torch.rand(q.shape[1], 1, 1, generator=gen, dtype=torch.float64)).requires_grad_(grad)
    got, got_grads = _run(q, k, v, "softmax", causal, mask, {"temperature": temperature})
    monkeypatch.setattr(fused, "_tile_pieces", lambda *a: None)
    want, want_grads = _run(q, k, v, "softmax", causal, mask, {"temperature": temperature})
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for gs, gw in zip(got_grads, want_grads):
        torch.testing.assert_close(gs, gw, rtol=1e-12, atol=1e-12)


def test_ssmax_with_a_given_n_uses_it_per_row(monkeypatch):
    gen = torch.Generator().manual_seed(12)
    q, k, v, causal, mask = _inputs("causal", torch.float64, gen)
    got, got_grads = _run(q, k, v, "ssmax", causal, mask, {"n": 50})
    monkeypatch.setattr(fused, "_tile_pieces", lambda *a: None)
    want, want_grads = _run(q, k, v, "ssmax", causal, mask, {"n": 50})
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for gs, gw in zip(got_grads, want_grads):
        torch.testing.assert_close(gs, gw, rtol=1e-12, atol=1e-12)


def _rows_reference(name, s, vis, dp, params=None):
    """The normalizer's reference on the visible entries of each row, and the gradient at the
    scores for the upstream gradient ``dp`` (autograd)."""
    x = s.detach().clone().requires_grad_()
    p = sk.registry.get(name).fn(x, dim=-1, mask=vis, **(params or {}))
    (ds,) = torch.autograd.grad(p, x, dp)
    return p.detach(), ds


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["sa_softmax", "softmax_sink", "softpick"])
def test_rule_normalizers_rows_against_their_reference(name, dtype):
    """The sink, factor and signed row kernels, called directly on a tile with causal limits,
    hidden entries and rows that see nothing, against autograd through the reference."""
    from softmaxkit.attention.fused import kernel_form, numba_pieces

    spec = sk.registry.get(name)
    params = spec.with_defaults({})
    pieces = numba_pieces(spec, params)
    form = kernel_form(spec, params)
    assert pieces is not None and form is not None
    s, lim, hidden, cnt, _ = _tile(dtype)
    s[3, 2] = s[3, 5] = s[3, :4].max() + 1  # a tied row maximum (softpick's gradient at the maximum)
    par = np.array([[0.3 if name == "softmax_sink" else 0.0]], dtype=s.numpy().dtype)
    vis = _visible(lim, hidden, s.shape[1])
    gen = torch.Generator().manual_seed(6)
    dp = torch.randn(s.shape, generator=gen, dtype=dtype)
    extra = {"sink": 0.3} if name == "softmax_sink" else {}
    want, want_ds = _rows_reference(name, s.double(), vis, dp.double(), extra)
    dd = (want * dp.double()).sum(-1).to(dtype)
    got, den = s.clone(), np.empty(s.shape[0], dtype=s.numpy().dtype)
    p, ds = s.clone(), dp.clone()
    args = (lim, hidden, cnt, par, s.shape[0], True, pieces.row)
    if name == "softpick":
        eps = s.numpy().dtype.type(params["eps"])
        rows.signed_forward(got.numpy(), den, *args, pieces.fn, eps)
        rows.signed_backward(p.numpy(), ds.numpy(), dd.numpy(), *args, pieces.fn, pieces.dfn, eps)
    elif name == "sa_softmax":
        rows.factor_forward(got.numpy(), den, *args, pieces.fn, pieces.sink, pieces.factor)
        rows.factor_backward(p.numpy(), ds.numpy(), dd.numpy(), *args, pieces.fn, pieces.dfn, pieces.sink,
                             pieces.factor, pieces.dfactor)
    else:
        rows.softmax_of_forward(got.numpy(), den, *args, pieces.fn, pieces.sink)
        rows.softmax_of_backward(p.numpy(), ds.numpy(), dd.numpy(), *args, pieces.fn, pieces.dfn, pieces.sink, True)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close((got / torch.from_numpy(den)[:, None]).double(), want, **tol)
    torch.testing.assert_close(p.double(), want, **tol)
    torch.testing.assert_close(ds.double(), want_ds, **tol)
    assert (got[~vis] == 0).all() and (ds[~vis] == 0).all() and (ds[4] == 0).all()


def test_compiled_call_picks_the_specialisation_of_each_kind_of_arguments():
    """compiled_call caches one entry point per kind of arguments: float32 and float64 tiles,
    another piece, and a non-contiguous array each reach their own specialisation (the kernel's
    own result through the dispatcher is the reference)."""
    from softmaxkit.kernels.cpu import compiled_call

    sig = importlib.import_module("softmaxkit.normalizers.sigmoid")._numba_pieces()
    relu = importlib.import_module("softmaxkit.normalizers.relu")._numba_pieces()
    gen = np.random.default_rng(0)
    hidden = np.zeros((0, 0), dtype=np.bool_)
    for dtype in (np.float32, np.float64, np.float32):
        for pieces in (sig, relu, sig):
            for contiguous in (True, False):
                base = gen.standard_normal((6, 14)).astype(dtype)
                tile = base if contiguous else base[:, ::2]
                lim = np.array([7, 0, 3, 7, 5, 1], dtype=np.int64)
                cnt = np.maximum(lim, 1).astype(dtype)
                par = np.zeros((2, 3), dtype=dtype)
                want = tile.copy() if contiguous else base.copy()[:, ::2]   # the same layout
                rows.elementwise_forward(want, lim, hidden, cnt, par, 3, True, pieces.row, pieces.fn)
                got = tile.copy() if contiguous else base.copy()[:, ::2]
                compiled_call(rows.elementwise_forward, got, lim, hidden, cnt, par, 3, True, pieces.row, pieces.fn)
                np.testing.assert_array_equal(got, want)
