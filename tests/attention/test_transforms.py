"""Every attention method under ``torch.func`` transforms and forward-mode AD: the SDPA,
fused and streaming paths are autograd Functions and kernels that read the data (torch's
CPU flash kernel has no forward derivative), so there each method runs the dense reference;
the results equal the dense method's, call by call."""

import pytest
import torch
from torch.autograd import forward_ad

import softmaxkit as sk
from softmaxkit.attention.api import auto_method

F64 = torch.float64
B, H, L, D = 2, 2, 8, 4

CASES = [
    ("softmax", {}),
    ("softmax", {"is_causal": True}),
    ("softmax", {"mask": True}),
    ("ssmax", {}),
    ("entmax15", {}),
    ("softpick", {"is_causal": True}),
]
METHODS = ["auto", "sdpa", "fused", "streaming", "dense"]


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, dtype=F64, generator=g) for _ in range(3))
    mask = torch.rand(L, L, generator=g) > 0.3
    mask[:, 0] = True
    return q, k, v, mask


def _attend(method, name, case, mask):
    kw = dict(case)
    if kw.pop("mask", False):
        kw["attn_mask"] = mask

    def run(q, k, v):
        return sk.attention(q, k, v, name, method=method, **kw)
    return run


def _runs(method, name, case, q, k, v, mask):
    try:
        _attend(method, name, case, mask)(q, k, v)
    except ValueError:   # the method does not run this normalizer at all
        return False
    return True


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name, case", CASES)
def test_grad_vmap_and_forward_ad_equal_the_dense_method(name, case, method):
    q, k, v, mask = _inputs()
    if not _runs(method, name, case, q, k, v, mask):
        pytest.skip(f"method={method!r} does not run {name}")
    f = _attend(method, name, case, mask)
    ref = _attend("dense", name, case, mask)

    def loss(fn):
        return lambda q, k, v: fn(q, k, v).square().sum()

    for got, want in zip(torch.func.grad(loss(f), argnums=(0, 1, 2))(q, k, v),
                         torch.func.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)):
        torch.testing.assert_close(got, want)

    batch = torch.randn(3, B, H, L, D, dtype=F64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(torch.func.vmap(f, in_dims=(0, None, None))(batch, k, v),
                               torch.stack([ref(x, k, v) for x in batch]))
    torch.testing.assert_close(torch.func.vmap(f, in_dims=(None, 0, 0))(q, batch, batch),
                               torch.stack([ref(q, x, x) for x in batch]))

    tangent = torch.randn_like(q)
    _, want = torch.func.jvp(lambda q: ref(q, k, v), (q,), (tangent,))
    _, got = torch.func.jvp(lambda q: f(q, k, v), (q,), (tangent,))
    torch.testing.assert_close(got, want)
    with forward_ad.dual_level():
        dual = f(forward_ad.make_dual(q, tangent), k, v)
        torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent, want)


def test_vmap_over_the_mask_alone():
    """A batch of masks (the inputs plain tensors): each mask's own result."""
    q, k, v, mask = _inputs()
    masks = torch.stack([mask, mask.tril(), torch.ones_like(mask)])
    got = torch.func.vmap(lambda m: sk.attention(q, k, v, attn_mask=m))(masks)
    torch.testing.assert_close(got, torch.stack([sk.attention(q, k, v, attn_mask=m, method="dense")
                                                 for m in masks]))


def test_grad_of_a_per_head_parameter():
    """``torch.func.grad`` with respect to a per-head temperature (the sdpa path's row scale)."""
    q, k, v, _ = _inputs()
    t = torch.tensor([0.5, 2.0], dtype=F64).reshape(1, H, 1, 1)

    def loss(method):
        return lambda t: sk.attention(q, k, v, temperature=t, method=method).square().sum()

    torch.testing.assert_close(torch.func.grad(loss("auto"))(t), torch.func.grad(loss("dense"))(t))


def test_auto_method_names_dense_under_a_transform():
    q, k, v, _ = _inputs()
    assert auto_method(q, k, v) != "dense"
    seen = []

    def record(q):
        seen.append(auto_method(q, k, v))
        return q
    torch.func.vmap(record)(q.unsqueeze(0))
    assert seen == ["dense"]
