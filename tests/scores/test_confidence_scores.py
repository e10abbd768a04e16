"""Confidence scores on cases whose answer is known by hand."""

import math

import pytest
import torch

import softmaxkit as sk
from softmaxkit.scores import energy, entropy, label_non_uniformity, max_logit, msp

# softmax([log 3, 0]) = [3/4, 1/4]; uniform row [1, 1] gives [1/2, 1/2]
Z = torch.tensor([[math.log(3.0), 0.0], [1.0, 1.0]], dtype=torch.float64)


def test_msp_by_hand():
    torch.testing.assert_close(msp(Z), torch.tensor([0.75, 0.5], dtype=torch.float64))
    # temperature 2: softmax([log 3 / 2, 0]) = [sqrt3, 1] / (sqrt3 + 1)
    s3 = math.sqrt(3.0)
    torch.testing.assert_close(msp(Z, temperature=2.0)[0], torch.tensor(s3 / (s3 + 1), dtype=torch.float64))


def test_max_logit_by_hand():
    torch.testing.assert_close(max_logit(Z), torch.tensor([math.log(3.0), 1.0], dtype=torch.float64))


def test_energy_by_hand():
    # T log(e^{log3} + e^0) = log 4 ; T log(2e) = 1 + log 2
    torch.testing.assert_close(energy(Z), torch.tensor([math.log(4.0), 1 + math.log(2.0)], dtype=torch.float64))
    # T = 2: 2 log(e^{log3/2} + 1) = 2 log(sqrt3 + 1)
    torch.testing.assert_close(energy(Z, temperature=2.0)[0],
                               torch.tensor(2 * math.log(math.sqrt(3.0) + 1), dtype=torch.float64))


def test_entropy_by_hand():
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    torch.testing.assert_close(entropy(Z), torch.tensor([h, math.log(2.0)], dtype=torch.float64))
    # a one-hot softmax has entropy exactly 0, with no NaN from 0 * log 0
    assert entropy(torch.tensor([[0.0, float("-inf")]])).item() == 0.0


def test_label_non_uniformity_is_total_variation_to_uniform():
    # 1/2 (|3/4 - 1/2| + |1/4 - 1/2|) = 1/4 ; uniform -> 0
    torch.testing.assert_close(label_non_uniformity(Z), torch.tensor([0.25, 0.0], dtype=torch.float64))
    # one-hot over C classes: 1 - 1/C
    one_hot = torch.tensor([[50.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(label_non_uniformity(one_hot), torch.tensor([0.75], dtype=torch.float64))


def test_mask_and_dim():
    x = torch.tensor([[2.0, 0.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    p0 = math.exp(2) / (math.exp(2) + 1)
    assert msp(x, mask=mask).item() == pytest.approx(p0)
    assert max_logit(x, mask=mask).item() == 2.0
    assert energy(x, mask=mask).item() == pytest.approx(math.log(math.exp(2) + 1))
    assert label_non_uniformity(x, mask=mask).item() == pytest.approx(p0 - 0.5)
    # dim=0 on the transpose gives the same
    torch.testing.assert_close(msp(x.T, dim=0, mask=mask.T), msp(x, mask=mask))
    torch.testing.assert_close(entropy(x.T, dim=0), entropy(x))
    # nothing visible
    none = torch.zeros_like(mask)
    assert msp(x, mask=none).item() == 0.0
    assert entropy(x, mask=none).item() == 0.0
    assert label_non_uniformity(x, mask=none).item() == 0.0
    assert max_logit(x, mask=none).item() == float("-inf")
    assert energy(x, mask=none).item() == float("-inf")


@pytest.mark.parametrize("fn", [msp, max_logit, energy, entropy, label_non_uniformity])
def test_low_precision_and_shapes(fn):
    x = torch.randn(3, 4, 7, generator=torch.Generator().manual_seed(0))
    ref = fn(x.double())
    assert ref.shape == (3, 4)
    out = fn(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("fn", [msp, max_logit, energy, entropy, label_non_uniformity])
def test_gradcheck(fn):
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert torch.autograd.gradcheck(fn, (x,))


def test_public_names():
    for name in ["msp", "max_logit", "energy", "entropy", "odin", "Mahalanobis", "centroid_distance",
                 "fit_temperature", "ece", "auroc", "aupr", "fpr_at_tpr", "EarlyExitCascade",
                 "classwise_ece", "reliability_diagram", "label_non_uniformity"]:
        assert hasattr(sk.scores, name), name


def test_bad_input():
    with pytest.raises(TypeError, match="logits"):
        msp(torch.tensor([[1, 2]]))
    with pytest.raises(TypeError, match="logits"):
        entropy([[1.0, 2.0]])
    with pytest.raises(ValueError, match="temperature"):
        energy(Z, temperature=0.0)
    with pytest.raises(ValueError, match="dim"):
        max_logit(Z, dim=2)
    with pytest.raises(ValueError, match="mask"):
        msp(Z, mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one class"):
        msp(torch.zeros(2, 0))


def test_entropy_gradient_is_finite_at_minus_inf_logits_and_masked_classes():
    """``where(p > 0, p log p, 0)`` sent ``0 * -inf = NaN`` into the gradient of every class
    (hostile audit, 2026-12-02); the masked / -inf classes now get 0."""
    x = torch.tensor([[0.0, float("-inf"), 1.0]], dtype=torch.float64, requires_grad=True)
    grad, = torch.autograd.grad(sk.scores.entropy(x).sum(), x)
    finite = x.detach()[:, [0, 2]].clone().requires_grad_()
    want, = torch.autograd.grad(sk.scores.entropy(finite).sum(), finite)
    torch.testing.assert_close(grad[:, [0, 2]], want)
    assert grad[0, 1] == 0
    y = torch.tensor([[0.3, 2.0, -1.0]], dtype=torch.float64, requires_grad=True)
    grad, = torch.autograd.grad(sk.scores.entropy(y, mask=torch.tensor([[True, False, True]])).sum(), y)
    assert torch.isfinite(grad).all() and grad[0, 1] == 0
