"""torch.compile traces the streaming path of one-pass normalizers into one graph (inference).

The Inductor backend compiles the same graph (checked by hand; too slow for the suite on 2
cores), so the test uses ``aot_eager`` with ``fullgraph=True``: any graph break fails it.
In training mode the autograd.Function's backward calls ``torch.autograd.grad``, which
dynamo does not trace: the attention runs eagerly there and the test checks that fallback.
"""

import pytest
import torch

import softmaxkit as sk


@pytest.mark.slow
def test_streaming_forward_compiles_in_one_graph_and_training_falls_back():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))

    def fn(q, k, v):
        return sk.attention(q, k, v, "softpick", is_causal=True, block_size=4)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=1e-6)
    qg = q.clone().requires_grad_()
    out = torch.compile(fn, backend="aot_eager")(qg, k, v)
    (grad,) = torch.autograd.grad(out.sum(), [qg])
    (expected,) = torch.autograd.grad(fn(qg, k, v).sum(), [qg])
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-6)
