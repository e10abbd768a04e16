"""softmax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "softmax"


def test_spec():
    check_spec(NAME)


def test_softmax_temperature(x):
    torch.testing.assert_close(sk.softmax(x, temperature=0.7), naive_softmax(x, 0.7))
    torch.testing.assert_close(sk.log_softmax(x, temperature=2.0), torch.log(naive_softmax(x, 2.0)))
    torch.testing.assert_close(sk.logsumexp(x), torch.log(torch.exp(x).sum(-1)))


def test_tiny_temperature_plus_inf_row_has_zero_gradient():
    # x / T overflows for the finite entries of a row that also holds +inf: the row takes
    # its limit (weight on the +inf entry), and its gradient is 0, not NaN
    from softmaxkit.normalizers.softmax import log_softmax_reference, softmax_reference
    for x0, dtype in (([0.5, -0.2, float("inf"), 0.1], torch.float64), ([0.5, -0.2, 3e38, 0.1], torch.float32)):
        for ref in (softmax_reference, log_softmax_reference):
            x = torch.tensor([x0, [0.5, -0.2, 0.3, 0.1]], dtype=dtype, requires_grad=True)
            y = ref(x, temperature=1e-30)
            (g,) = torch.autograd.grad(y[0].masked_fill(y[0] == float("-inf"), 0).sum() + y[1, 0], x)
            assert torch.equal(g[0], torch.zeros(4, dtype=dtype))
            assert torch.isfinite(g).all()


def test_logsumexp_keepdim_must_be_a_bool():
    import pytest
    x = torch.randn(64, 300)
    for backend in ("auto", "numba", "reference"):
        with sk.use_backend(backend):
            for bad in (1, "no", None):
                with pytest.raises(TypeError, match="keepdim"):
                    sk.logsumexp(x, keepdim=bad)
            assert sk.logsumexp(x, keepdim=True).shape == (64, 1)


def test_an_infinite_temperature_is_refused_by_name():
    """softmax(x / inf) has no value (inf / inf at a +inf maximum, -inf / inf elsewhere): only a
    limit; every temperature argument asks for a finite T > 0."""
    import math

    import pytest

    from softmaxkit.sampling import soften
    from softmaxkit.scores import msp, odin

    x = torch.tensor([[math.inf, 1.0, 2.0], [0.0, 1.0, -math.inf]])
    for bad in (math.inf, torch.tensor([1.0, math.inf, 1.0])):
        for fn in (sk.softmax, sk.log_softmax):
            with pytest.raises(ValueError, match="temperature"):
                fn(x, temperature=bad)
    with pytest.raises(ValueError, match="T"):
        soften(torch.rand(2, 3), math.inf)
    with pytest.raises(ValueError, match="temperature"):
        msp(torch.randn(2, 3), temperature=math.inf)
    with pytest.raises(ValueError, match="temperature"):
        odin(torch.nn.Linear(3, 2).eval(), torch.randn(2, 3), temperature=math.inf)
    assert torch.equal(sk.softmax(x[:1], temperature=1e30), torch.tensor([[1.0, 0.0, 0.0]]))


def test_a_float32_tensor_temperature_of_float64_scores_keeps_float64_precision():
    x = torch.randn(4, 50, dtype=torch.float64)
    t = torch.tensor(0.3, dtype=torch.float32)
    expected = torch.softmax(x / t.double(), -1)
    for backend in ("auto", "reference"):
        with sk.use_backend(backend):
            assert (sk.softmax(x, temperature=t) - expected).abs().max() < 1e-15


def test_second_derivative_of_logsumexp_at_a_plus_inf_row_is_zero_on_every_backend():
    import math

    x0 = torch.tensor([[math.inf, 1.0, 2.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    results = {}
    for backend in ("reference", "numba"):
        x = x0.clone().requires_grad_(True)
        with sk.use_backend(backend):
            (g,) = torch.autograd.grad(sk.logsumexp(x).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad((g * w).sum(), x)
        assert torch.equal(gg[0], torch.zeros(3, dtype=torch.float64))
        results[backend] = gg
    torch.testing.assert_close(results["numba"], results["reference"])


def test_a_temperature_that_varies_along_the_row_has_its_own_gradient():
    """Found by a hostile sweep (2026-12-04): the temperature's gradient was taken relative to
    the row's largest score (exact only for a temperature shared by the row), so a temperature
    per entry (broadcastable to x, as documented) got a wrong gradient; SSMax's ``s`` too."""
    import math

    x = torch.randn(3, 5, dtype=torch.float64)
    for shape in ((3, 5), (1, 5), (3, 1), ()):
        t = (torch.rand(shape, dtype=torch.float64) + 0.5).requires_grad_()
        for fn in (sk.softmax, sk.log_softmax):
            for dim in (0, 1):
                assert torch.autograd.gradcheck(lambda t: fn(x, dim=dim, temperature=t), (t,))
        s = t.detach().clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda s: sk.ssmax(x, s=s), (s,))
        assert torch.autograd.gradcheck(lambda t: sk.normalize(x, "softmax", temperature=t), (t,))
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    t = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    (got,) = torch.autograd.grad(sk.softmax(x, temperature=t), t, g)
    (want,) = torch.autograd.grad(torch.softmax(x / t, -1), t, g)
    torch.testing.assert_close(got, want)
    (got,) = torch.autograd.grad(sk.ssmax(x, s=t), t, g)
    (want,) = torch.autograd.grad(torch.softmax(x * t * math.log(3), -1), t, g)
    torch.testing.assert_close(got, want)


def test_a_numpy_temperature_is_inverted_in_float64_and_keepdim_may_be_a_numpy_bool():
    """Found by a hostile sweep (2026-12-04): ``1.0 / np.float16(0.7)`` stays float16 under
    NumPy 2's promotion (2.7% off, and an overflow warning for float64 scores); and a NumPy
    ``bool_`` keepdim reached ``torch.logsumexp`` on the aten lane, which refused it."""
    import warnings

    import numpy as np

    x = torch.linspace(-30, 30, 7)
    for backend in ("auto", "reference", "numba"):
        with sk.use_backend(backend), warnings.catch_warnings():
            warnings.simplefilter("error")
            for t, scores in ((np.float16(0.7), x), (np.float32(0.7), x.double())):
                want = torch.softmax(scores / float(t), -1)
                torch.testing.assert_close(sk.softmax(scores, temperature=t), want, rtol=1e-6, atol=0)
                torch.testing.assert_close(sk.log_softmax(scores, temperature=t), want.log())
            for shape in ((4, 5), (64, 4096)):
                assert sk.logsumexp(torch.randn(shape), keepdim=np.bool_(True)).shape == (shape[0], 1)


def test_an_int_temperature_beyond_the_float_range_is_refused_by_name():
    import pytest

    with pytest.raises(ValueError, match="temperature"):
        sk.softmax(torch.randn(2, 3), temperature=10**400)
    assert torch.allclose(sk.softmax(torch.randn(2, 3), temperature=10**300), torch.full((2, 3), 1 / 3))


def test_a_per_entry_temperature_beside_an_overflowing_fill_keeps_every_other_weight():
    """Found by a hostile sweep (2026-12-04): a row where a finite ``x / T`` overflows (an
    additive ``finfo.min`` fill over ``T < 1``) is computed as ``(x - max) / T``, which is
    ``x / T`` up to the row's constant only where ``T`` is the row's own: with a temperature
    per entry the other weights came out wrong (0.03 / 0.60 / 0.37 for 0.16 / 0.74 / 0.10)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 9, generator=gen) * 3
    hidden = torch.rand(6, 9, generator=gen) < 0.3
    hidden[:, 0] = False
    t = torch.rand(6, 9, generator=gen) * 2 + 0.05
    filled = x.masked_fill(hidden, torch.finfo(torch.float32).min)
    want = torch.softmax(x.double().masked_fill(hidden, float("-inf")) / t.double(), -1)
    for backend in ("auto", "reference"):
        with sk.use_backend(backend):
            torch.testing.assert_close(sk.softmax(filled, temperature=t).double(), want, rtol=1e-5, atol=1e-7)
            want_log = torch.log_softmax(filled.double() / t.double(), -1).float()   # a fill: -inf or finite
            torch.testing.assert_close(sk.log_softmax(filled, temperature=t), want_log, rtol=1e-5, atol=1e-5)
    x = torch.tensor([[-1e308, 0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0.1, 1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    p = sk.softmax(x, temperature=t)
    visible = torch.tensor([[False, True, True]])
    q = sk.softmax(x, mask=visible, temperature=t)
    torch.testing.assert_close(p, q)
    for a, b in zip(torch.autograd.grad(p[0, 2], (x, t)), torch.autograd.grad(q[0, 2], (x, t))):
        torch.testing.assert_close(a, b)
