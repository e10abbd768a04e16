"""ssmax: the examples its spec carries, its pieces, and the definition written naively."""

import math

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "ssmax"


def test_spec():
    check_spec(NAME)


def test_ssmax(x):
    n = x.shape[-1]
    torch.testing.assert_close(sk.ssmax(x, s=0.43), naive_softmax(0.43 * math.log(n) * x))
    torch.testing.assert_close(sk.ssmax(x, s=0.5, n=100), naive_softmax(0.5 * math.log(100) * x))


def test_ssmax_counts_visible_entries_only(x):
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[:, 4:] = False
    out = sk.ssmax(x, mask=mask, s=0.6)
    torch.testing.assert_close(out[:, :4], naive_softmax(0.6 * math.log(4) * x[:, :4]))
    assert (out[:, 4:] == 0).all()


def test_a_scale_that_overflows_is_refused_not_spread_over_the_positive_scores():
    """Audit 2026-12-03: n = inf (or s log n beyond float64) made s log(n) x = +inf at every
    positive score, and the +inf rule gave each of them equal weight instead of the argmax."""
    import pytest

    x = torch.tensor([[0.3, 1.2, 0.9, -0.5]], dtype=torch.float64)
    for params in ({"n": math.inf}, {"n": torch.tensor([[math.inf]])}, {"s": 1e308, "n": 1000}):
        with pytest.raises(ValueError, match="n must be finite|s \\* log"):
            sk.ssmax(x, **params)
    with pytest.raises(ValueError, match="n must be finite"):
        sk.as_entmax(x, n=math.inf)
    for backend in ("reference", "numba", "auto"):   # large finite scales reach the argmax
        with sk.use_backend(backend):
            assert sk.ssmax(x, s=1e300, n=1000).tolist() == [[0.0, 1.0, 0.0, 0.0]]
            assert sk.ssmax(x.float(), s=1e38, n=1000).tolist() == [[0.0, 1.0, 0.0, 0.0]]
