"""multimax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "multimax"


def test_spec():
    check_spec(NAME)


def test_multimax(x):
    r = [-1.0, 1.0, -0.5, 0.5]
    t = [0.3, 0.7, 0.2, 0.1]
    relu = torch.relu
    sigma = x + t[0] * relu(r[0] - x) + t[1] * relu(x - r[1]) + t[2] * relu(r[2] - x) ** 2 + t[3] * relu(x - r[3]) ** 2
    torch.testing.assert_close(sk.multimax(x, r=r, t=t), naive_softmax(sigma))
    torch.testing.assert_close(sk.multimax(x), naive_softmax(x))


def test_form_derivative_is_the_modulators_own_past_the_square_cap():
    """d_modulator (the fused and streaming backward's g') equals autograd of the modulator
    everywhere, past sqrt(finfo.max) too, where _term holds the square constant (it gave
    2 t3 |x| there, 1e200 times the autograd slope at x = -1e200 in float64)."""
    from softmaxkit.normalizers.multimax import d_modulator, modulator

    r, t = (0.1, -0.2, 0.3, 0.1), (0.5, 1.0, 0.02, 2.0)
    x = torch.tensor([-1e200, -3e38, -2.0, 0.0, 0.2, 5.0, 3e38, 1e200], dtype=torch.float64, requires_grad=True)
    (autograd,) = torch.autograd.grad(modulator(x, r, t).sum(), x)
    torch.testing.assert_close(d_modulator(x.detach(), r, t), autograd)
