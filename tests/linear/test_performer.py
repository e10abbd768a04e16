"""FAVOR+: positive random features estimate the softmax kernel without bias."""

import math

import pytest
import torch

from softmaxkit.linear import draw_projection


def _phi(x, w):
    return torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[0])


@pytest.mark.parametrize("orthogonal", [False, True])
def test_mean_over_draws_approaches_the_softmax_kernel(orthogonal):
    g = torch.Generator().manual_seed(0)
    d, m, draws = 4, 16, 3000
    x = 0.4 * torch.randn(5, d, generator=g, dtype=torch.float64)
    y = 0.4 * torch.randn(5, d, generator=g, dtype=torch.float64)
    exact = torch.exp((x * y).sum(-1))
    est = torch.stack([(_phi(x, w) * _phi(y, w)).sum(-1) for w in
                       (draw_projection(m, d, orthogonal=orthogonal, generator=g, dtype=torch.float64)
                        for _ in range(draws))])
    # One feature Y = exp(w.(x+y) - (|x|^2+|y|^2)/2), w ~ N(0, I): E[Y] = exp(x.y),
    # E[Y^2] = exp(2|x+y|^2 - |x|^2 - |y|^2). With m i.i.d. features per draw and `draws`
    # draws the mean's standard error is sqrt(Var Y / (m draws)); orthogonal rows are each
    # N(0, I), so the mean is unbiased too, with a variance no larger (Choromanski et al. 2020).
    var_y = torch.exp(2 * ((x + y) ** 2).sum(-1) - (x * x).sum(-1) - (y * y).sum(-1)) - exact ** 2
    se = torch.sqrt(var_y / (m * draws))
    se_emp = est.std(0) / math.sqrt(draws)
    assert ((est.mean(0) - exact).abs() < 5 * torch.maximum(se, se_emp)).all()
    # and a single draw is not exact: the test could fail
    assert (est[0] - exact).abs().max() > se.max()


def test_projection_rows_are_orthogonal_in_blocks_and_gaussian_in_length():
    w = draw_projection(8, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for block in (w[:4], w[4:]):
        gram = block @ block.T
        torch.testing.assert_close(gram - torch.diag(torch.diagonal(gram)), torch.zeros(4, 4, dtype=torch.float64),
                                   atol=1e-12, rtol=0)
    norms = torch.cat([draw_projection(64, 4, generator=torch.Generator().manual_seed(s)).norm(dim=1)
                       for s in range(50)])
    assert abs(float((norms ** 2).mean()) - 4.0) < 0.3   # E|w|^2 = D for w ~ N(0, I_D)


def test_bad_projection():
    with pytest.raises(ValueError, match="nb_features must be a positive int"):
        draw_projection(0, 4)
    with pytest.raises(TypeError, match="generator"):
        draw_projection(4, 4, generator=3)
