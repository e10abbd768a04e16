"""``softmax_topk`` / ``log_softmax_topk`` on a 0-d input: like every normalizer, a scalar is a
row of one entry (found by the function audit: it raised from ``narrow``)."""

import pytest
import torch

import softmaxkit as sk


@pytest.mark.parametrize(("fn", "torch_fn"), [(sk.softmax_topk, torch.softmax),
                                              (sk.log_softmax_topk, torch.log_softmax)])
@pytest.mark.parametrize("dim", [0, -1])
def test_zero_dim_input_is_its_own_top_one(fn, torch_fn, dim):
    x = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    values, indices = fn(x, 1, dim=dim)
    want_values, want_indices = torch_fn(x, 0).topk(1, 0)
    assert values.shape == indices.shape == ()
    assert indices.dtype == torch.int64
    torch.testing.assert_close(values, want_values)
    assert torch.equal(indices, want_indices)
    values.backward()
    assert x.grad == 0
    with pytest.raises(ValueError, match="k must be between 1 and 1"):
        fn(x, 2, dim=dim)
