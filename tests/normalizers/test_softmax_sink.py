"""softmax_sink: the examples its spec carries, its pieces, and the definition written naively."""

import torch

import softmaxkit as sk
from tests.normalizers._oracles import naive_softmax
from tests.normalizers._spec_checks import check_spec

NAME = "softmax_sink"


def test_spec():
    check_spec(NAME)


def test_is_softmax_over_the_row_and_the_sink_without_the_sink(x):
    for sink in (0.0, -2.0, 3.5):
        padded = torch.cat([x, torch.full_like(x[:, :1], sink)], -1)
        torch.testing.assert_close(sk.softmax_sink(x, sink=sink), naive_softmax(padded)[:, :-1])


def test_large_scores_do_not_overflow():
    x = torch.tensor([[1e4, 1e4 - 1.0], [-1e4, 0.0]], dtype=torch.float32)
    out = sk.softmax_sink(x, sink=5.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], torch.softmax(x[0], -1))


def test_per_head_sink_is_learnable_in_attention():
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64).reshape(2, 1, 1).requires_grad_()
    outs = [sk.attention(q, k, v, NAME, is_causal=True, method=m, block_size=4, sink=sink) for m in ("dense",
                                                                                                     "streaming")]
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-12)
    grads = [torch.autograd.grad(o.sum(), sink)[0] for o in outs]
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-12)
