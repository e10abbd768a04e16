"""``sample`` never returns an index past the vocabulary and draws from the definition's
distribution at extreme temperatures and fills.

Found by the function audit: ``temperature=1e-46`` on float32 logits (T rounds to 0 there:
``0 / 0`` at the maxima) drew index ``V``; a row of ``finfo.min`` with ``top_p`` and
``T < 1`` (every ``x / T`` overflowing to ``-inf``) raised an out-of-bounds ``RuntimeError``.
"""

import pytest
import torch

from softmaxkit.sampling import sample

FMIN = torch.finfo(torch.float32).min


def _draws(logits, n=400, **kw):
    rows = logits.expand(n, -1).contiguous()
    return sample(rows, generator=torch.Generator().manual_seed(0), **kw)


@pytest.mark.parametrize("options", [{}, {"top_p": 0.9}, {"top_k": 3}, {"min_p": 0.5}, {"top_k": 3, "top_p": 0.7}])
@pytest.mark.parametrize("temperature", [1e-46, 1e-45, 1e-40])
def test_a_temperature_below_float32s_range_is_the_argmax(temperature, options):
    logits = torch.tensor([[3.0, 4.0, 4.0, 0.0, -1.0]])
    drawn = _draws(logits, temperature=temperature, **options)
    assert set(drawn.tolist()) == {1, 2}, "the two maxima, and only them"


@pytest.mark.parametrize("temperature", [1e-46, 1e-40])
def test_equal_logits_at_a_tiny_temperature_are_uniform(temperature):
    drawn = _draws(torch.zeros(1, 4), temperature=temperature)
    assert 0 <= int(drawn.min()) and int(drawn.max()) < 4
    counts = torch.bincount(drawn, minlength=4)
    assert (counts > 50).all(), counts


@pytest.mark.parametrize(("options", "count"), [({}, 4), ({"top_p": 0.5}, 2), ({"top_k": 2}, 2),
                                               ({"top_p": 0.99, "min_p": 0.1}, 4)])
def test_a_finfo_min_row_over_a_small_temperature_is_uniform(options, count):
    logits = torch.full((1, 4), FMIN)
    drawn = _draws(logits, temperature=0.5, **options)
    assert 0 <= int(drawn.min()) and int(drawn.max()) < 4
    assert len(set(drawn.tolist())) == count


def test_one_finfo_min_entry_above_the_rest_takes_everything():
    logits = torch.full((1, 6), FMIN)
    logits[0, 4] = FMIN * 0.999
    for options in ({}, {"top_p": 0.5}, {"top_k": 2}):
        assert set(_draws(logits, temperature=0.5, **options).tolist()) == {4}
