"""ODIN through a model whose gradient is known by hand."""

import math

import pytest
import torch
from torch import nn

from softmaxkit.scores import msp, odin


def _identity_model():
    model = nn.Linear(2, 2, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    return model.eval()


def test_odin_by_hand():
    # f(x) = x. For x = (1, 0): yhat = 0 and d(-log softmax(x/T)_0)/dx = (p - e_0)/T,
    # whose sign is (-1, +1); so x~ = x - eps * (-1, +1) = (1 + eps, -eps).
    model = _identity_model()
    x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    t, eps = 2.0, 0.1
    got = odin(model, x, temperature=t, epsilon=eps)
    z = (1 + eps + eps) / t
    assert got.item() == pytest.approx(1 / (1 + math.exp(-z)))


def test_epsilon_zero_is_tempered_msp_and_leaves_model_untouched():
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double().eval()
    x = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        want = msp(model(x), temperature=1000.0)
        got = odin(model, x, temperature=1000.0, epsilon=0.0)
    torch.testing.assert_close(got, want)
    assert all(p.grad is None for p in model.parameters())
    # perturbing raises every sample's own top probability
    assert bool((odin(model, x, temperature=1.0, epsilon=0.01) >= msp(model(x).detach())).all())


def test_bad_input():
    model = _identity_model()
    x = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="eval mode"):
        odin(model.train(), x)
    model.eval()
    with pytest.raises(TypeError, match="model"):
        odin(lambda v: v, x)
    with pytest.raises(TypeError, match="x"):
        odin(model, torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="epsilon"):
        odin(model, x, epsilon=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        odin(model, x, temperature=0.0)
    with pytest.raises(ValueError, match="model must return"):
        odin(nn.Flatten(0).eval(), x)


class _Columns(nn.Module):
    """Logits read from the input without a gradient path (``detach``) or as integers."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x):
        if self.how == "detached":
            return x.detach()
        if self.how == "integer":
            return (x > 0).long()
        return x[:, :0]


def test_odin_names_the_model_output_it_cannot_use():
    """Hostile sweep: (N, 0) logits raised IndexError from argmax, integer logits a TypeError naming x,
    logits without a gradient path (or a call under inference_mode) "element 0 of tensors does not
    require grad" even with epsilon = 0, which needs no gradient."""
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="C >= 1"):
        odin(_Columns("empty").eval(), x)
    with pytest.raises(TypeError, match="model must return floating-point logits"):
        odin(_Columns("integer").eval(), x)
    with pytest.raises(ValueError, match="differentiably"):
        odin(_Columns("detached").eval(), x, epsilon=0.1)
    want = msp(x, temperature=3.0)
    torch.testing.assert_close(odin(_Columns("detached").eval(), x, temperature=3.0, epsilon=0.0), want)
    model = _identity_model()
    with torch.inference_mode():
        torch.testing.assert_close(odin(model, x, temperature=3.0, epsilon=0.0), want)
        with pytest.raises(ValueError, match="inference_mode"):
            odin(model, x, temperature=3.0, epsilon=0.1)


def test_an_epsilon_tensor_must_broadcast_to_x():
    """Hostile sweep: epsilon of shape (2,) for x of shape (2, 3) raised a bare size mismatch."""
    model = nn.Linear(3, 2).double().eval()
    x = torch.randn(2, 3, dtype=torch.float64)
    per_input = torch.tensor([[0.0], [0.1]], dtype=torch.float64)
    got = odin(model, x, temperature=2.0, epsilon=per_input)
    assert got[0].item() == pytest.approx(msp(model(x).detach(), temperature=2.0)[0].item())
    with pytest.raises(ValueError, match="epsilon of shape"):
        odin(model, x, epsilon=torch.tensor([0.1, 0.2], dtype=torch.float64))
    with pytest.raises(ValueError, match="epsilon of shape"):   # would broadcast x to (2, 2, 3)
        odin(model, x, epsilon=per_input[:, None])
