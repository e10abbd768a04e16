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
