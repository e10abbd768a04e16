"""torch.compile traces the streaming path of one-pass normalizers into one graph (inference).

The Inductor backend compiles the same graph (checked by hand; too slow for the suite on 2
cores), so the test uses ``aot_eager`` with ``fullgraph=True``: any graph break fails it.
In training mode the autograd.Function's backward calls ``torch.autograd.grad``, which
dynamo does not trace: the attention is a graph break there and runs eagerly (checked by
hand; see the README).
"""

import pytest
import torch

import softmaxkit as sk


@pytest.mark.slow
def test_streaming_forward_compiles_in_one_graph():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 4, generator=gen) for _ in range(3))

    def fn(q, k, v):
        return sk.attention(q, k, v, "softpick", is_causal=True, block_size=(4, 2))

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=1e-6)
