"""A floating target of the wrong shape gets the documented ValueError naming the target
(found by the function audit: a float class-index vector raised IndexError from movedim)."""

import pytest
import torch

from softmaxkit.losses import fenchel_young_loss


@pytest.mark.parametrize("dim", [-1, 1])
@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
def test_float_class_indices_are_refused_with_the_target_named(normalizer, dim):
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="distribution target must have the shape of logits"):
        fenchel_young_loss(logits, torch.tensor([0.0, 1.0, 2.0, 3.0]), normalizer, dim=dim)


def test_a_distribution_along_dim_0_still_works():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    target = torch.softmax(2 * logits, 0)
    # the KL divergence KL(y || softmax(logits)) along dim 0, per column, averaged
    want = (target * (target.log() - torch.log_softmax(logits, 0))).sum(0).mean()
    torch.testing.assert_close(fenchel_young_loss(logits, target, dim=0), want)
