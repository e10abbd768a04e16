"""torch.compile traces attention into one graph, with and without a gradient.

The Inductor backend compiles the same graphs (checked by hand; too slow for the suite on 2
cores), so the tests use ``aot_eager`` with ``fullgraph=True``: any graph break fails them.
The fused and streaming autograd Functions' backwards call ``torch.autograd.grad``, which
dynamo does not trace: while it traces, with a gradient, the streaming path is differentiated
tile by tile as written (the threshold normalizers, whose searched threshold carries no
gradient there, and the fused path run the dense reference).
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


@pytest.mark.parametrize("method", ["streaming", "fused"])
@pytest.mark.parametrize("normalizer", ["softmax", "sigmoid", "entmax15"])
def test_attention_gradient_under_compile_fullgraph(method, normalizer):
    """With a gradient, ``fullgraph=True`` failed on the fused and streaming paths (dynamo does
    not trace ``autograd.grad`` in their backwards); values and gradients equal eager's."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 20, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    mask = torch.rand(20, 20, generator=gen) > 0.3
    mask[3] = False

    def fn(q, k, v):
        return sk.attention(q, k, v, normalizer, attn_mask=mask, method=method, block_size=8)

    results = []
    for call in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = call(*leaves)
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)
