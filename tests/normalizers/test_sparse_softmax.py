"""sparse_softmax: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "sparse_softmax"


def test_spec():
    check_spec(NAME)


def test_sparse_softmax(x):
    out = sk.sparse_softmax(x, k=3)
    top = x.topk(3, -1)
    expected = torch.zeros_like(x).scatter(-1, top.indices, naive_softmax(top.values))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(sk.sparse_softmax(x, k=x.shape[-1]), naive_softmax(x))


def test_k_is_checked_against_the_row_length_and_an_empty_axis_gives_an_empty_result():
    import pytest

    with pytest.raises(ValueError, match="k must be between 1 and 4, got 5"):
        sk.sparse_softmax(torch.randn(3, 4), k=5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        sk.sparse_softmax(torch.randn(3, 0), k=0)
    assert sk.sparse_softmax(torch.randn(5, 0), k=3).shape == (5, 0)
