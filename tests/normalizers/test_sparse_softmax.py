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
