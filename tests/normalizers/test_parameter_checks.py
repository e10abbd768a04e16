"""Real-valued parameters reject NaN (and inf) with a ValueError naming them (issue 12),
through the shared checks of :mod:`softmaxkit._checks`; multimax with its
default parameters survives every finite input."""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit._checks import check_finite, check_number
from softmaxkit.losses import spherical_z_loss
from softmaxkit.nn import Normalizer

NAN, INF = float("nan"), float("inf")


def test_check_finite_and_check_number():
    check_finite(1.5, "s")
    check_finite(torch.tensor([0.0, -2.0]), "s")
    check_number(INF, "s")
    for bad in (NAN, INF, -INF, torch.tensor([1.0, NAN]), torch.tensor(INF)):
        with pytest.raises(ValueError, match="^s must"):
            check_finite(bad, "s")
    with pytest.raises(ValueError, match="s must not"):
        check_number(NAN, "s")
    for bad in (True, "1", None, torch.tensor([1, 2])):
        with pytest.raises(TypeError, match="^s must"):
            check_finite(bad, "s")
    with pytest.raises(TypeError, match="s must be a number"):
        check_finite(torch.tensor(1.0), "s", allow_tensor=False)


def _x():
    return torch.randn(3, 5, generator=torch.Generator().manual_seed(0))


CASES = [
    ("ssmax", "s", lambda v: sk.ssmax(_x(), s=v)),
    ("ssmax", "n", lambda v: sk.ssmax(_x(), n=torch.tensor(v))),
    ("multimax", "r", lambda v: sk.multimax(_x(), r=(0.0, v, 0.0, 0.0))),
    ("multimax", "t", lambda v: sk.multimax(_x(), t=torch.tensor([0.0, 0.0, v, 0.0]))),
    ("sigmoid", "bias", lambda v: sk.sigmoid(_x(), bias=v)),
    ("sigmoid", "bias_offset", lambda v: sk.sigmoid(_x(), bias_offset=torch.tensor(v))),
    ("as_entmax", "beta", lambda v: sk.as_entmax(_x(), beta=v)),
    ("as_entmax", "n", lambda v: sk.as_entmax(_x(), n=torch.full((3, 1), v))),
    ("entmax", "alpha", lambda v: sk.entmax(_x(), alpha=v)),
    ("softmax", "temperature", lambda v: sk.softmax(_x(), temperature=v)),
    ("softpick", "eps", lambda v: sk.softpick(_x(), eps=v)),
    ("spherical_z_loss", "b", lambda v: spherical_z_loss(_x(), torch.tensor([0, 1, 2]), b=v)),
    ("spherical_z_loss", "a", lambda v: spherical_z_loss(_x(), torch.tensor([0, 1, 2]), a=v)),
]


@pytest.mark.parametrize("where,name,call", CASES, ids=[f"{w}-{n}" for w, n, _ in CASES])
def test_nan_parameter_raises_naming_it(where, name, call):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        call(NAN)


@pytest.mark.parametrize("name,params", [("ssmax", {"s": NAN}), ("multimax", {"r": (NAN, 0, 0, 0)}),
                                         ("sigmoid", {"bias": NAN})])
def test_nan_parameter_raises_through_normalize_and_attention(name, params):
    pname = next(iter(params))
    with pytest.raises(ValueError, match=rf"\b{pname}"):
        sk.normalize(_x(), name, **params)
    q = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(1))
    for method in ("dense", "streaming"):
        with pytest.raises(ValueError, match=rf"\b{pname}"):
            sk.attention(q, q, q, normalizer=name, method=method, **params)


def test_nn_normalizer_parameter_checks():
    with pytest.raises(ValueError, match=r"r must have 4 entries, got 3"):
        Normalizer("multimax", r=(0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match=r"t must have 4 entries"):
        Normalizer("multimax", t=torch.zeros(3))
    with pytest.raises(ValueError, match=r"r\[1\] must be finite"):
        Normalizer("multimax", r=(0.1, NAN, 0.3, 0.4))
    with pytest.raises(ValueError, match=r"\bs must be finite"):
        Normalizer("ssmax", s=NAN)
    with pytest.raises(ValueError, match=r"bias_offset"):
        Normalizer("sigmoid", bias_offset=INF)
    norm = Normalizer("ssmax")
    with torch.no_grad():
        norm.s.fill_(NAN)
    with pytest.raises(ValueError, match=r"\bs must"):
        norm(_x())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_multimax_defaults_equal_softmax_at_any_finite_magnitude(dtype):
    """r = t = 0: the quadratic terms are exactly 0 even where their square overflows."""
    big = torch.finfo(dtype).max
    for v in (2e19, 1e30, big / 2, big):
        x = torch.tensor([[v, 1.0, -v, 0.0], [-v, -v, 3.0, -1e9]], dtype=dtype, requires_grad=True)
        r = torch.zeros(4, dtype=dtype, requires_grad=True)
        t = torch.zeros(4, dtype=dtype, requires_grad=True)
        for params in ({}, {"r": r, "t": t}):
            y = sk.multimax(x, **params)
            torch.testing.assert_close(y, torch.softmax(x.detach(), -1), rtol=0, atol=0)
            grads = torch.autograd.grad((y * torch.arange(4.0, dtype=dtype)).sum(), [x, *params.values()])
            for g in grads:
                assert torch.isfinite(g).all()
            torch.testing.assert_close(grads[0], torch.zeros_like(x), rtol=0, atol=0)


def test_multimax_modulator_keeps_its_value_and_gradient():
    """The reordered quadratic terms: same values as the formula, gradcheck in float64."""
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    r = torch.tensor([0.1, -0.2, 0.3, -0.4], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0.5, 0.2, -0.1, 0.3], dtype=torch.float64, requires_grad=True)
    relu = torch.relu
    expected = (x + t[0] * relu(r[0] - x) + t[1] * relu(x - r[1])
                + t[2] * relu(r[2] - x) ** 2 + t[3] * relu(x - r[3]) ** 2)
    torch.testing.assert_close(sk.functional.multimax_modulator(x, r, t), expected)
    assert torch.autograd.gradcheck(lambda a, b, c: sk.multimax(a, r=b, t=c), (x, r, t))
    assert math.isinf(sk.functional.multimax_modulator(torch.tensor([1e20]), [0.0] * 4, [0.0, 0.0, 0.0, 1.0]).item())


def test_nan_clipped_softmax_and_attention_scale_are_value_errors():
    """NaN is a bad value of the right type: ValueError (they used to raise TypeError)."""
    for kwargs in ({"gamma": NAN}, {"zeta": NAN}, {"zeta": INF}):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=rf"^{name} must be finite"):
            sk.clipped_softmax(_x(), **kwargs)
    with pytest.raises(TypeError, match="gamma"):
        sk.clipped_softmax(_x(), gamma="0.1")
    q = torch.randn(1, 1, 4, 8)
    for bad in (NAN, INF):
        with pytest.raises(ValueError, match="^scale must be finite"):
            sk.attention(q, q, q, scale=bad)
    with pytest.raises(TypeError, match="scale"):
        sk.attention(q, q, q, scale="big")


def test_a_numpy_integer_dim_counts_as_an_int_and_a_bool_does_not():
    import numpy as np

    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for fn in (sk.softmax, sk.log_softmax, sk.logsumexp, sk.sparsemax, sk.entmax15):
        for dim in (0, -1, 1):
            torch.testing.assert_close(fn(x, dim=np.int64(dim)), fn(x, dim=dim))
    for spec in sk.normalizers():
        params = {"k": 2} if spec.name == "sparse_softmax" else {}
        torch.testing.assert_close(sk.normalize(x, spec.name, dim=np.int32(0), **params),
                                   sk.normalize(x, spec.name, dim=0, **params))
    for bad in (True, np.bool_(True), 0.0):
        with pytest.raises(TypeError, match="dim must be an int"):
            sk.softmax(x, dim=bad)
