"""numba softmax / log_softmax / logsumexp against the reference definitions."""

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels.cpu import functions

from ._inputs import adversarial

ALGORITHMS = ("three_pass", "two_pass", "online")
OPS = {"softmax": sk.softmax, "log_softmax": sk.log_softmax, "logsumexp": sk.logsumexp}


def _both(op, x, algorithm=None, **kw):
    with sk.use_backend("numba", algorithm=algorithm):
        fast = op(x, **kw)
    with sk.use_backend("reference"):
        ref = op(x, **kw)
    return fast, ref


def _tolerance(dtype):
    return dict(rtol=2e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", list(OPS))
def test_matches_reference_on_adversarial_rows_float32(name, algorithm):
    x, special = adversarial(n=3000)
    fast, ref = _both(OPS[name], x, algorithm)
    nan_row = special["nan"]
    keep = [r for r in range(x.shape[0]) if r != nan_row]
    torch.testing.assert_close(fast[keep], ref[keep], **_tolerance(x.dtype))
    # NaN stays in its row: every visible entry of that row is NaN
    assert torch.isnan(fast[nan_row]).all()


@pytest.mark.parametrize("name", list(OPS))
def test_matches_reference_float64(name):
    x, special = adversarial(n=700, dtype=torch.float64)
    fast, ref = _both(OPS[name], x)
    keep = [r for r in range(x.shape[0]) if r != special["nan"]]
    torch.testing.assert_close(fast[keep], ref[keep], **_tolerance(x.dtype))


def test_all_minus_inf_row_gives_zeros_and_plus_inf_row_its_limit():
    x, special = adversarial(n=64)
    with sk.use_backend("numba"):
        p = sk.softmax(x)
    assert torch.equal(p[special["empty"]], torch.zeros(64))
    expected = torch.zeros(64)
    expected[[5, 9]] = 0.5
    assert torch.equal(p[special["inf"]], expected)


@pytest.mark.parametrize("n", [1, 2, 5000])
def test_row_lengths(n):
    x = torch.randn(3, n)
    for algorithm in ALGORITHMS:
        fast, ref = _both(sk.softmax, x, algorithm)
        torch.testing.assert_close(fast, ref, **_tolerance(x.dtype))


def test_row_of_a_million_entries():
    x = torch.randn(1, 1_000_000) * 5
    x[0, ::7] = float("-inf")
    x[0, 123_456] = 1e4
    x[0, 654_321] = 1e4 - 1
    for algorithm in ALGORITHMS:
        fast, ref = _both(sk.softmax, x, algorithm)
        torch.testing.assert_close(fast, ref, rtol=2e-6, atol=1e-7)
    fast, ref = _both(sk.log_softmax, x)
    torch.testing.assert_close(fast, ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_scores_in_different_blocks_get_equal_probabilities(dtype):
    """The default long-row algorithms scale every exp(x - max) by one factor (three_pass) or
    by exact powers of two (two_pass): a tie is a tie wherever its entries lie, as in the
    reference (sampling and argmax then break it the same way on every backend)."""
    x = torch.round(torch.randn(2, 300_000, dtype=dtype, generator=torch.Generator().manual_seed(4)) * 4) / 4
    for algorithm in (None, "three_pass", "two_pass"):
        with sk.use_backend("numba", algorithm=algorithm):
            p = sk.softmax(x)
        for r in range(2):
            for v in torch.unique(x[r]):
                assert torch.unique(p[r][x[r] == v]).numel() == 1, (algorithm, float(v))
        torch.testing.assert_close(p.double().sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=2e-6)


def test_temperature_and_leading_shape():
    x = torch.randn(2, 3, 500)
    for name in ("softmax", "log_softmax"):
        fast, ref = _both(OPS[name], x, temperature=0.3)
        torch.testing.assert_close(fast, ref, **_tolerance(x.dtype))
    fast, ref = _both(sk.logsumexp, x, keepdim=True)
    assert fast.shape == (2, 3, 1)
    torch.testing.assert_close(fast, ref, **_tolerance(x.dtype))


@pytest.mark.parametrize("name", list(OPS))
def test_gradcheck_float64(name):
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    kw = {"temperature": 0.7} if name != "logsumexp" else {}
    with sk.use_backend("numba"):
        assert torch.autograd.gradcheck(lambda t: OPS[name](t, **kw), (x,))


@pytest.mark.parametrize("name", list(OPS))
def test_gradients_match_reference_with_infinities(name):
    x, special = adversarial(n=40, dtype=torch.float64)
    x = x.clone().requires_grad_()
    g = torch.randn_like(OPS[name](x.detach()))
    grads = []
    for backend in ("numba", "reference"):
        with sk.use_backend(backend):
            (grad,) = torch.autograd.grad(OPS[name](x), x, g)
        grads.append(grad)
    keep = [r for r in range(x.shape[0]) if r != special["nan"]]
    torch.testing.assert_close(grads[0][keep], grads[1][keep], rtol=1e-9, atol=1e-10)


def test_unknown_algorithm_is_rejected():
    with pytest.raises(ValueError, match="three_pass"):
        functions.softmax(torch.randn(2, 3), algorithm="four_pass")


def test_double_backward_float64():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    with sk.use_backend("numba"):
        for name in OPS:
            assert torch.autograd.gradgradcheck(OPS[name], (x,))


@pytest.mark.parametrize("n", [700, 5000])   # rows of one block and of more (the two algorithms)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", [0, 1, 2])   # PROBS, LOG_PROBS, LSE
def test_forward_only_is_the_full_forward_or_declines(mode, dtype, n):
    x, special = adversarial(n=n, dtype=dtype)
    full = (functions.softmax, functions.log_softmax, functions.logsumexp)[mode]
    rows = [x[r:r + 1] for r in range(x.shape[0])] + [x, x.reshape(2, 5, -1)]
    compared = 0
    for t in rows:
        for _ in range(2):   # the first call compiles and caches the entry point; the second uses it
            out = functions.forward_only(t, mode)
            if out is None:
                continue
            expected, todo = full(t)
            assert not todo.any()   # forward_only returns a result only when every row was done
            assert out.shape == expected.shape and out.dtype == dtype
            torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
            compared += 1
    assert compared >= 2 * 8   # the ordinary single rows at least


@pytest.mark.parametrize("rows", [1, 3])
def test_forward_only_with_gradient_declines_a_row_at_its_plus_inf_limit(rows):
    """A ``+inf`` score's row is its limit (equal weights on the ``+inf`` entries), whose
    gradient is zero: a caller that differentiates the output (``gradient``) gets None, on
    one row (the serial entry, looked up by dtype from the second call) and on several."""
    x = torch.randn(rows, 3000)
    x[-1, 7] = float("inf")
    for _ in range(2):
        assert functions.forward_only(x, 0, gradient=True) is None
        out = functions.forward_only(x, 0)
        assert out is not None and out[-1, 7] == 1 and out[-1].sum() == 1


def test_forward_only_takes_no_gradient_and_keeps_the_input():
    x = torch.randn(3, 50, requires_grad=True)
    before = x.detach().clone()
    out = functions.forward_only(x, 0, 0.5)
    assert out is not None and not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, torch.softmax(before * 0.5, -1))
    assert torch.equal(x.detach(), before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", [0, 1, 2])   # PROBS, LOG_PROBS, LSE
def test_forward_only_declines_a_row_the_kernel_leaves_to_the_reference(mode, dtype):
    """x / T overflowing on a finite score (finfo.max at T = 1/4) is a row the kernel leaves
    to the reference: the call returns None whichever row it is, on one row (the serial
    kernel) and many (the parallel one); the same call at T = 1 is complete."""
    big = torch.finfo(dtype).max
    for rows in (1, 7):
        for bad in range(rows):
            x = torch.randn(rows, 300, dtype=dtype)
            x[bad, 3] = big
            assert functions.forward_only(x, mode, 4.0) is None
            out = functions.forward_only(x, mode)
            assert out is not None
            expected = (torch.softmax, torch.log_softmax, torch.logsumexp)[mode](x.double(), -1).to(dtype)
            torch.testing.assert_close(out, expected)


def test_forward_only_log_sum_exp_of_a_vector_is_a_scalar():
    x = torch.randn(40)
    out = functions.forward_only(x, 2)
    assert out.shape == () and torch.isclose(out, torch.logsumexp(x, 0))


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_from_output_is_the_reference_gradient(rows, mode, dtype):
    # the lane's backward (addresses, serial for one row): -inf scores, zero probabilities, and
    # infinite / NaN incoming gradients at visible and at hidden entries, with an expanded gradient
    torch.manual_seed(rows + 10 * mode)
    x = torch.randn(rows, 3000, dtype=torch.float64) * 4
    x[:, 5] = float("-inf")
    x[:, 6] = -1e4   # a probability 0 at a finite score
    g = torch.randn(rows, 3000, dtype=torch.float64)
    g[0, 5] = float("inf")
    g[0, 6] = float("nan")
    if rows > 1:
        g[1, 9] = float("inf")
    x64 = x.clone().requires_grad_()
    with sk.use_backend("reference"):
        ref = (sk.log_softmax if mode else sk.softmax)(x64, -1)
    (want,) = torch.autograd.grad(ref, x64, g, retain_graph=True)
    y = ref.detach().to(dtype)
    got = functions.backward_from_output(y, g.to(dtype), mode)
    # float32: y rounded, and e^y times a row sum of |g| ~ 100
    tol = _tolerance(dtype) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.double(), want, equal_nan=True, **tol)
    ones = functions.backward_from_output(y, torch.ones(3000, dtype=dtype).expand(rows, 3000), mode)
    (want_ones,) = torch.autograd.grad(ref, x64, torch.ones_like(ref))
    torch.testing.assert_close(ones.double(), want_ones, **tol)
