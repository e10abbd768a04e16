"""Hostile audit of sampling, top-k, algorithms and scores, 2026-12-02: each test is a
reproducer that failed before its fix."""

import warnings

import numpy as np
import pytest
import torch

import softmaxkit as sk
from softmaxkit import sampling
from softmaxkit.algorithms import OnlineSoftmaxState, two_pass_softmax
from softmaxkit.scores import CentroidDistance, EarlyExitCascade, auroc, energy, fit_temperature, fpr_at_tpr
from softmaxkit.scores.centroid import centroid_distance


@pytest.mark.parametrize("length", [4, 10000])
def test_sample_top_k_refuses_a_nan_logit_hidden_by_ties(length):
    """torch.topk ranks NaN first, the tie rule then replaced it by a tied entry, and a token was drawn."""
    z = torch.zeros(2, length)
    z[1, 2] = float("nan")
    for k in (1, 2, 3):
        with pytest.raises(ValueError, match="NaN"):
            sampling.sample(z, top_k=k, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("scale", [1e2, 1e3, 1e4, 5e5, 9e5])
def test_two_pass_softmax_float32_is_accurate_up_to_its_limit(scale):
    """float32's split of ln 2 kept n * hi exact only for |x| < 355: 3e-4 relative error at 1e4."""
    x = torch.tensor([[scale, scale + 0.5, scale + 1, scale + 2]], dtype=torch.float32)
    rel = (two_pass_softmax(x).double() / torch.softmax(x.double(), -1) - 1).abs().max()
    assert rel < 4e-7


def test_energy_below_temperature_one_does_not_overflow():
    torch.testing.assert_close(energy(torch.tensor([[3e38, 0.0]]), temperature=0.5), torch.tensor([3e38]))
    torch.testing.assert_close(energy(torch.tensor([[-3e38, -3e38]]), temperature=0.5), torch.tensor([-3e38]))
    x = torch.randn(4, 6, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, 0] = True
    expected = 0.3 * torch.logsumexp((x / 0.3).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(energy(x, temperature=0.3, mask=mask), expected)
    torch.autograd.gradcheck(lambda a: energy(a, temperature=0.3), (x.clone().requires_grad_(),))
    assert energy(torch.full((2, 3), float("-inf")), temperature=0.5).eq(float("-inf")).all()


@pytest.mark.parametrize("temperature", [1e-46, 1e-40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_energy_at_a_temperature_below_the_dtypes_smallest_normal(temperature, dtype):
    """(z - m) / T with T rounded to 0 in float32 gave 0 / 0 = NaN at the maximum: the limit is max z."""
    x = torch.tensor([[1.0, 2.0, 3.0], [-5.0, 4.0, 4.0]], dtype=dtype, requires_grad=True)
    out = energy(x, temperature=temperature)
    assert out.dtype == dtype
    torch.testing.assert_close(out, torch.tensor([3.0, 4.0], dtype=dtype))
    grad, = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad.float(), torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.5]]))


def test_hard_gumbel_softmax_of_one_entry():
    assert sampling.gumbel_softmax(torch.tensor(0.3), hard=True).item() == 1.0
    assert sampling.gumbel_softmax(torch.tensor(float("-inf")), hard=True).item() == 0.0
    assert sampling.straight_through(torch.tensor(0.3)).item() == 1.0


def test_centroid_detector_reads_the_predicted_class_one_way():
    """Two adjacent float logits: softmax rounds them to a tie, argmax of the softmax picked
    class 0 for the distance while the threshold was class 1's."""
    logits = torch.tensor([[-0.23197725415229797, -0.23197723925113678, -1.7819724, -3.7317846]])
    centroids = torch.eye(4)
    p = sk.softmax(logits)
    torch.testing.assert_close(centroid_distance(logits, centroids), (p - centroids[1]).norm(dim=1))
    detector = CentroidDistance()
    detector.centroids_ = centroids
    detector.thresholds_ = torch.tensor([0.0, 10.0, 0.0, 0.0], dtype=torch.float64)
    assert detector.accept(logits).item()


def test_fit_temperature_on_a_flat_objective_returns_one_and_says_why():
    with pytest.warns(RuntimeWarning, match="does not depend on T"):
        assert fit_temperature(torch.zeros(5, 3), torch.tensor([0, 1, 2, 0, 1])) == 1.0


def test_argument_checks_name_the_argument():
    with pytest.raises(ValueError, match="T of shape"):
        sampling.soften(torch.rand(2, 3), torch.ones(4))
    with pytest.raises(TypeError, match="max_sweeps"):
        EarlyExitCascade([1.0, 2.0]).fit([torch.randn(6, 3), torch.randn(6, 3)], torch.tensor([0, 1, 2, 0, 1, 2]),
                                         max_sweeps="a")
    with pytest.raises(ValueError, match="rows of shape"):
        OnlineSoftmaxState.from_block(torch.randn(3, 4)).merge(OnlineSoftmaxState.from_block(torch.randn(2, 4)))
    assert fpr_at_tpr([1.0, 2.0, 3.0], [0.0, 2.5], tpr=np.float32(0.5)) == fpr_at_tpr([1.0, 2.0, 3.0], [0.0, 2.5], 0.5)
    with pytest.raises(TypeError, match="real-valued"):
        auroc(np.array([1 + 1j, 2.0]), [0.0])
    with pytest.raises(ValueError, match="no entry along dim"):
        sk.softmax_topk(torch.randn(3, 0), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert auroc(np.array([2.0, 3.0]), [0.0]) == 1.0


@pytest.mark.parametrize("num_classes", [2.0, "2", 0, -1, True])
def test_mahalanobis_num_classes_is_checked(num_classes):
    """Audit 2026-12-03: 2.0 failed in bincount, -1 spoke of labels in [0, -2]."""
    features, labels = torch.randn(4, 2), torch.tensor([0, 1, 0, 1])
    with pytest.raises((TypeError, ValueError), match="num_classes"):
        sk.scores.Mahalanobis().fit(features, labels, num_classes=num_classes)
    assert sk.scores.Mahalanobis().fit(features, labels, num_classes=np.int64(2)).means_.shape == (2, 2)


@pytest.mark.parametrize("epsilon", [float("inf"), float("nan")])
def test_odin_epsilon_must_be_finite(epsilon):
    """Audit 2026-12-03: epsilon = inf gave all-NaN scores."""
    with pytest.raises(ValueError, match="epsilon"):
        sk.scores.odin(torch.nn.Linear(3, 2).eval(), torch.randn(4, 3), epsilon=epsilon)


@pytest.mark.parametrize("kwargs", [{}, {"top_k": 2}, {"top_p": 0.9999}])
def test_sample_at_a_huge_temperature_keeps_the_small_weight(kwargs):
    """(z - top) overflowed between finfo.max and finfo.min before the division by T = 1e38:
    index 1 (probability 1 / (1 + e^{6.8}) = 0.0011) was never drawn."""
    f32 = torch.finfo(torch.float32)
    z = torch.tensor([[f32.max, f32.min]]).expand(40000, 2)
    drawn = sampling.sample(z, temperature=1e38, generator=torch.Generator().manual_seed(0), **kwargs)
    assert 20 <= int(drawn.sum()) <= 80   # expected 44


_WIDE_UNSIGNED = [getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)]


@pytest.mark.parametrize("dtype", _WIDE_UNSIGNED)
def test_labels_of_the_wide_unsigned_dtypes(dtype):
    """Hostile sweep, 2026-12-04: labels of uint16 / uint32 / uint64 raised NotImplementedError
    ('"min_all" not implemented for UInt16') in every score that takes labels."""
    from softmaxkit.scores import Mahalanobis, classwise_ece, ece, fit_centroids, nll

    logits = torch.tensor([[2.0, 0.0, 0.5], [0.0, 2.0, 0.1], [0.3, 0.0, 2.0], [1.0, 0.2, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 1])
    wide = labels.to(dtype)
    probs = torch.softmax(logits, -1)
    assert fit_temperature(logits, wide) == fit_temperature(logits, labels)
    assert nll(logits, wide) == nll(logits, labels)
    assert ece(probs, wide) == ece(probs, labels) and classwise_ece(probs, wide) == classwise_ece(probs, labels)
    assert torch.equal(fit_centroids(logits[:3], wide[:3]), fit_centroids(logits[:3], labels[:3]))
    torch.testing.assert_close(Mahalanobis().fit(logits, wide).score(logits), Mahalanobis().fit(logits, labels).score(logits))
    cascade = EarlyExitCascade([1.0, 2.0]).fit([logits, logits], wide)
    assert cascade.thresholds_ == EarlyExitCascade([1.0, 2.0]).fit([logits, logits], labels).thresholds_
    assert cascade.predict([logits, logits]).accuracy(wide) == 0.75


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 in this torch")
def test_float8_inputs_are_refused_by_name():
    """Hostile sweep: float8 tensors passed the floating-point checks and raised NotImplementedError
    ('"mul_cpu_reduced_float" not implemented for Float8_e4m3fn') from the first arithmetic op."""
    from softmaxkit import losses, ops
    from softmaxkit.scores import msp

    x = torch.randn(4, 3).to(torch.float8_e4m3fn)
    calls = [("x", lambda: sk.softmax(x)), ("logits", lambda: msp(x)), ("logits", lambda: energy(x)),
             ("logits", lambda: losses.fenchel_young_loss(x, torch.tensor([0, 1, 2, 0]))),
             ("logits", lambda: sampling.sample(x)), ("x", lambda: sk.softmax_topk(x, 2)),
             ("x", lambda: ops.soft_pool2d(x[None], 2)), ("Q", lambda: ops.maxsim(x[None], x[None])),
             ("boxes", lambda: ops.soft_nms(torch.zeros(1, 4).to(torch.float8_e5m2), torch.ones(1)))]
    for name, call in calls:
        with pytest.raises(TypeError, match=f"{name} must be a floating-point tensor"):
            call()
