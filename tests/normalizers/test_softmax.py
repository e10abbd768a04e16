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
