"""linear_cross_entropy against F.cross_entropy on materialised logits."""

import pytest
import torch
import torch.nn.functional as F

from softmaxkit.losses import linear_cross_entropy


def _problem(n=37, v=100, d=16, dtype=torch.float32, seed=0, ignore_every=5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) / d ** 0.5).requires_grad_()
    b = torch.randn(v, generator=g, dtype=dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    if ignore_every:
        t[::ignore_every] = -100
    return h, w, b, t


def _reference(h, w, b, t, label_smoothing=0.0, z_penalty=0.0, reduction="mean", ignore_index=-100):
    logits = h @ w.T + (b if b is not None else 0)
    per_token = F.cross_entropy(logits, t, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                reduction="none")
    per_token = per_token + z_penalty * torch.logsumexp(logits, -1) ** 2 * (t != ignore_index)
    if reduction == "none":
        return per_token
    if reduction == "sum":
        return per_token.sum()
    return per_token.sum() / (t != ignore_index).sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing,z_penalty", [(0.0, 0.0), (0.2, 1e-2)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_torch_float32(reduction, label_smoothing, z_penalty, with_bias):
    h, w, b, t = _problem()
    b = b if with_bias else None
    out = linear_cross_entropy(h, w, t, bias=b, label_smoothing=label_smoothing, z_penalty=z_penalty,
                               reduction=reduction, chunk_size=8, vocab_block=30)
    ref = _reference(h, w, b, t, label_smoothing, z_penalty, reduction)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    upstream = torch.randn_like(ref)
    inputs = [x for x in (h, w, b) if x is not None]
    got = torch.autograd.grad(out, inputs, upstream)
    want = torch.autograd.grad(ref, inputs, upstream)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_plain_torch_argument_defaults():
    h, w, _, t = _problem(ignore_every=0)
    torch.testing.assert_close(linear_cross_entropy(h, w, t), F.cross_entropy(h @ w.T, t), rtol=1e-5, atol=1e-5)


def _small_smoothed_problem(reduction):
    """A float64 problem with every option on, small blocks, and the loss as a function of
    ``(hidden, weight, bias)``; also the target."""
    h, w, b, t = _problem(n=6, v=11, d=4, dtype=torch.float64, ignore_every=4)

    def f(h, w, b):
        return linear_cross_entropy(h, w, t, bias=b, label_smoothing=0.1, z_penalty=0.01,
                                    reduction=reduction, chunk_size=4, vocab_block=5)
    return h, w, b, t, f


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradcheck_float64(reduction):
    h, w, b, t, f = _small_smoothed_problem(reduction)

    # a repeated backward recomputes the logits (the first hands out the gradients formed in
    # forward) with the forward's block maxima: bit for bit the same gradients (gradcheck's
    # reentrancy check, nondet_tol=0; hostile audit, 2026-12-02)
    assert torch.autograd.gradcheck(f, (h, w, b))


@pytest.mark.parametrize("chunk_size,vocab_block", [(2, 9), (3, 7), (37, 100), (64, 1000)])
def test_chunking_does_not_change_the_result(chunk_size, vocab_block):
    h, w, b, t = _problem(dtype=torch.float64)
    out = linear_cross_entropy(h, w, t, bias=b, label_smoothing=0.1, chunk_size=chunk_size, vocab_block=vocab_block)
    ref = _reference(h, w, b, t, 0.1)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out, (h, w, b)), torch.autograd.grad(ref, (h, w, b)))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bias_can_mask_tokens_with_minus_inf(reduction):
    h, w, b, t = _problem(dtype=torch.float64, ignore_every=0)
    b = b.detach().clone()
    b[:40] = float("-inf")  # whole vocabulary blocks of 20 are masked
    t = t % 60 + 40
    out = linear_cross_entropy(h, w, t, bias=b, reduction=reduction, chunk_size=8, vocab_block=20)
    ref = _reference(h, w, b, t, reduction=reduction)
    torch.testing.assert_close(out, ref)
    upstream = torch.ones_like(ref)
    for a, e in zip(torch.autograd.grad(out, (h, w), upstream), torch.autograd.grad(ref, (h, w), upstream)):
        torch.testing.assert_close(a, e)


def test_default_chunk_size():
    from softmaxkit.losses.linear_cross_entropy import default_chunk_size
    assert default_chunk_size(4096, 65536) == 512
    assert default_chunk_size(1024, 16384) == 128
    assert default_chunk_size(50, 100) == 50
    assert default_chunk_size(10**6, 2**26) == 128


def test_fused_and_recomputed_backward_agree():
    h, w, b, t = _problem(dtype=torch.float64)
    mean = linear_cross_entropy(h, w, t, bias=b, chunk_size=5, vocab_block=17)
    per_token = linear_cross_entropy(h, w, t, bias=b, reduction="none", chunk_size=5, vocab_block=17)
    fused = torch.autograd.grad(mean, (h, w, b))
    recomputed = torch.autograd.grad(per_token.sum() / (t != -100).sum(), (h, w, b))
    for a, e in zip(fused, recomputed):
        torch.testing.assert_close(a, e)


def test_a_second_backward_recomputes():
    h, w, b, t = _problem(dtype=torch.float64)
    out = linear_cross_entropy(h, w, t, bias=b, label_smoothing=0.1, z_penalty=0.01, reduction="sum")
    first = torch.autograd.grad(out, (h, w, b), retain_graph=True)
    second = torch.autograd.grad(out, (h, w, b), torch.tensor(2.0, dtype=torch.float64))
    for a, c in zip(first, second):
        torch.testing.assert_close(2 * a, c)


def test_only_the_inputs_that_require_grad_get_one():
    h, w, b, t = _problem()
    h = h.detach()
    out = linear_cross_entropy(h, w, t, bias=b)
    gw, = torch.autograd.grad(out, (w,))
    ref = _reference(h, w, b, t)
    torch.testing.assert_close(gw, torch.autograd.grad(ref, (w,))[0], rtol=1e-5, atol=1e-5)


def test_no_grad_gives_the_value():
    h, w, b, t = _problem()
    with torch.no_grad():
        out = linear_cross_entropy(h, w, t, bias=b)
    torch.testing.assert_close(out, _reference(h, w, b, t).detach(), rtol=1e-5, atol=1e-5)


def test_batched_hidden_and_custom_ignore_index():
    h, w, b, t = _problem(n=24, ignore_every=0)
    t = t.clone()
    t[3] = 7_000
    out = linear_cross_entropy(h.reshape(2, 3, 4, -1), w, t.reshape(2, 3, 4), bias=b, ignore_index=7_000,
                               reduction="none")
    assert out.shape == (2, 3, 4)
    ref = _reference(h, w, b, t, ignore_index=7_000, reduction="none")
    torch.testing.assert_close(out.reshape(-1), ref, rtol=1e-5, atol=1e-5)
    assert out.reshape(-1)[3] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    h, w, b, t = _problem(n=64, v=300, d=32, dtype=dtype)
    out = linear_cross_entropy(h, w, t, bias=b, chunk_size=16, vocab_block=64)
    assert out.dtype == dtype
    grads = torch.autograd.grad(out, (h, w, b))
    assert [g.dtype for g in grads] == [dtype] * 3
    h32, w32, b32 = (x.detach().float().requires_grad_() for x in (h, w, b))
    ref = _reference(h32, w32, b32, t)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    for g, e in zip(grads, torch.autograd.grad(ref, (h32, w32, b32))):
        torch.testing.assert_close(g.float(), e, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_gives_zero_not_nan(reduction):
    h, w, b, t = _problem(n=5)
    t = torch.full_like(t, -100)
    out = linear_cross_entropy(h, w, t, bias=b, reduction=reduction, label_smoothing=0.1, z_penalty=1e-3)
    assert not torch.isnan(out).any() and bool((out == 0).all())
    for g in torch.autograd.grad(out.sum(), (h, w, b)):
        assert bool((g == 0).all())


def test_target_out_of_range_names_target():
    h, w, b, t = _problem()
    for bad in (100, -1):
        t2 = t.clone()
        t2[1] = bad
        with pytest.raises(ValueError, match="target"):
            linear_cross_entropy(h, w, t2)


@pytest.mark.parametrize("kwargs,error,name", [
    ({"reduction": "avg"}, ValueError, "reduction"),
    ({"label_smoothing": 1.5}, ValueError, "label_smoothing"),
    ({"z_penalty": -1.0}, ValueError, "z_penalty"),
    ({"z_penalty": float("inf")}, ValueError, "z_penalty"),
    ({"z_penalty": float("nan")}, ValueError, "z_penalty"),
    ({"chunk_size": 0}, ValueError, "chunk_size"),
    ({"vocab_block": 0}, ValueError, "vocab_block"),
    ({"ignore_index": 1.0}, TypeError, "ignore_index"),
    ({"ignore_index": -2 ** 70}, ValueError, "ignore_index"),
    ({"ignore_index": 2 ** 63}, ValueError, "ignore_index"),
    # hostile sweep: OverflowError from math.isfinite
    ({"label_smoothing": 10 ** 400}, ValueError, "label_smoothing"),
    ({"z_penalty": 10 ** 400}, ValueError, "z_penalty"),
])
def test_bad_arguments(kwargs, error, name):
    h, w, b, t = _problem()
    with pytest.raises(error, match=name):
        linear_cross_entropy(h, w, t, **kwargs)


def test_bad_shapes_and_dtypes():
    h, w, b, t = _problem()
    with pytest.raises(TypeError, match="target"):
        linear_cross_entropy(h, w, t.float())
    with pytest.raises(ValueError, match="target"):
        linear_cross_entropy(h, w, t[:-1])
    with pytest.raises(ValueError, match="hidden"):
        linear_cross_entropy(h[:, :-1], w, t)
    with pytest.raises(ValueError, match="bias"):
        linear_cross_entropy(h, w, t, bias=b[:-1])
    with pytest.raises(TypeError, match="dtype"):
        linear_cross_entropy(h.double(), w, t)
    with pytest.raises(TypeError, match="bias"):   # as F.linear; a float16 bias was silently cast
        linear_cross_entropy(h.double(), w.double(), t, bias=b.half())


def _largest_allocation(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.cpu_memory_usage for e in prof.events())


def test_never_allocates_the_full_logits():
    n, v, d = 256, 2048, 8
    h, w, b, t = _problem(n=n, v=v, d=d)
    full = n * v * 4
    assert _largest_allocation(lambda: _reference(h, w, b, t).backward()) >= full
    biggest = _largest_allocation(lambda: linear_cross_entropy(h, w, t, bias=b, chunk_size=64, vocab_block=1024).backward())
    assert 0 < biggest <= full / 4


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_every_integer_target_dtype(dtype, reduction):
    """int8/int16/uint8 targets used to fail inside gather: every integer dtype equals int64."""
    h, w, b, t = _problem(v=100, ignore_every=0)
    ignore_index = 7 if dtype == torch.uint8 else -100
    t = t.clone()
    t[::4] = ignore_index
    expected = linear_cross_entropy(h, w, t, bias=b, reduction=reduction, ignore_index=ignore_index)
    g_expected = torch.autograd.grad(expected.sum(), (h, w, b))
    got = linear_cross_entropy(h, w, t.to(dtype), bias=b, reduction=reduction, ignore_index=ignore_index)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for g, e in zip(torch.autograd.grad(got.sum(), (h, w, b)), g_expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    torch.testing.assert_close(got, _reference(h, w, b, t, reduction=reduction, ignore_index=ignore_index))


def test_target_dtype_errors_name_target():
    h, w, _, t = _problem(ignore_every=0)
    for bad in (t.bool(), t.double(), t.half(), t.to(torch.complex64)):
        with pytest.raises(TypeError, match="target"):
            linear_cross_entropy(h, w, bad)
    with pytest.raises(ValueError, match="target"):
        linear_cross_entropy(h, w, torch.full_like(t, 200).to(torch.uint8))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_an_ignored_token_with_a_minus_inf_bias_on_class_0_adds_0(reduction):
    """Ignored tokens stand in class 0 as their target; with a -inf bias there (a banned
    token) their loss was ``inf * 0 = NaN`` (hostile audit, 2026-12-02). F.cross_entropy gives 0."""
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(3, 4, dtype=torch.float64, generator=gen).requires_grad_()
    w = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    b = torch.zeros(5, dtype=torch.float64)
    b[0] = float("-inf")
    t = torch.tensor([1, -100, 3])
    got = linear_cross_entropy(h, w, t, bias=b, reduction=reduction)
    want = torch.nn.functional.cross_entropy(h @ w.T + b, t, reduction=reduction)
    torch.testing.assert_close(got, want)
    weight = torch.ones_like(got)
    g1, = torch.autograd.grad(got, h, weight)
    g2, = torch.autograd.grad(want, h, weight)
    torch.testing.assert_close(g1, g2)


def test_a_repeated_backward_gives_the_first_gradients_bit_for_bit():
    h, w, b, t = _problem(n=9, v=23, d=5, dtype=torch.float32, ignore_every=4)
    h, w, b = (x.clone().requires_grad_() for x in (h, w, b))
    loss = linear_cross_entropy(h, w, t, bias=b, chunk_size=4, vocab_block=7, label_smoothing=0.1)
    first = torch.autograd.grad(loss, (h, w, b), torch.tensor(0.7), retain_graph=True)
    second = torch.autograd.grad(loss, (h, w, b), torch.tensor(0.7))
    for a, c in zip(first, second):
        assert torch.equal(a, c)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_second_derivatives(reduction):
    """create_graph=True used to drop the second-order term silently (a once_differentiable backward)."""
    h, w, b, t, f = _small_smoothed_problem(reduction)
    assert torch.autograd.gradgradcheck(f, (h, w, b))
    v = torch.randn(h.shape, generator=torch.Generator().manual_seed(1), dtype=h.dtype)
    got, = torch.autograd.grad(f(h, w, b).sum(), h, create_graph=True)
    want, = torch.autograd.grad(_reference(h, w, b, t, 0.1, 0.01, reduction).sum(), h, create_graph=True)
    hvp = torch.autograd.grad((got * v).sum(), (h, w, b))
    for a, e in zip(hvp, torch.autograd.grad((want * v).sum(), (h, w, b))):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_torch_func_transforms(reduction):
    """torch.func.grad, vmap (per-sample gradients), jvp and forward-mode AD give the plain path's results."""
    h, w, b, t = _problem(n=6, v=11, d=4, dtype=torch.float64, ignore_every=4)
    h, w, b = h.detach(), w.detach(), b.detach()

    def f(h, w, b, t=t):
        return linear_cross_entropy(h, w, t, bias=b, label_smoothing=0.1, z_penalty=0.01, reduction=reduction,
                                    chunk_size=4, vocab_block=5).sum()

    inputs = tuple(x.clone().requires_grad_() for x in (h, w, b))
    want = torch.autograd.grad(f(*inputs), inputs)
    for a, e in zip(torch.func.grad(f, argnums=(0, 1, 2))(h, w, b), want):
        torch.testing.assert_close(a, e)
    per_sample_grad = torch.func.vmap(torch.func.grad(f, argnums=1), in_dims=(0, None, None, 0))
    per_sample = per_sample_grad(h[:, None], w, b, t[:, None])
    for i in range(h.shape[0]):
        wi = w.clone().requires_grad_()
        torch.testing.assert_close(per_sample[i], torch.autograd.grad(f(h[i:i + 1], wi, b, t[i:i + 1]), wi)[0])
    tangent = torch.randn(h.shape, generator=torch.Generator().manual_seed(1), dtype=h.dtype)
    value, jvp = torch.func.jvp(lambda h: f(h, w, b), (h,), (tangent,))
    torch.testing.assert_close(value, f(h, w, b))
    torch.testing.assert_close(jvp, (want[0] * tangent).sum())
    with torch.autograd.forward_ad.dual_level():
        dual = f(torch.autograd.forward_ad.make_dual(h, tangent), w, b)
        torch.testing.assert_close(torch.autograd.forward_ad.unpack_dual(dual).tangent, jvp)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_under_compile_fullgraph(reduction):
    """torch.compile(fullgraph=True): the target check read values through a C function dynamo
    cannot trace (a graph break); traced, the loss runs in plain torch ops on the full logits."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=gen)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen)
    target = torch.randint(0, 11, (7,), generator=gen)
    target[2] = -100

    def fn(h, w):
        return linear_cross_entropy(h, w, target, label_smoothing=0.1, z_penalty=1e-3,
                                    reduction=reduction)

    results = []
    for call in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = call(h, w)
        loss.sum().backward()
        results.append((loss.detach(), h.grad, w.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_zero_width_hidden_and_numpy_ignore_index(reduction):
    """Hostile sweep: D = 0 raised "cannot reshape tensor of 0 elements into shape [-1, 0]" (F.cross_entropy
    of the bias alone is defined), and ignore_index=np.int64(-100) was refused as not an int."""
    import numpy as np

    hidden = torch.zeros(4, 0, dtype=torch.float64, requires_grad=True)
    weight = torch.zeros(5, 0, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 3, -100, 4])
    got = linear_cross_entropy(hidden, weight, target, bias, reduction=reduction)
    want = F.cross_entropy(bias.expand(4, 5), target, reduction=reduction)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), bias)[0], torch.autograd.grad(want.sum(), bias)[0])
    got = linear_cross_entropy(hidden, weight, target, bias, ignore_index=np.int64(-100), reduction=reduction)
    torch.testing.assert_close(got, want)
