"""Fused softmax_topk / log_softmax_topk: same values and indices as softmax then topk."""

import numpy as np
import pytest
import torch

import softmaxkit as sk


def _torch_topk(x, k, log=False):
    p = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    return p.topk(k, dim=-1)


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("k", [1, 7, 600])
def test_same_values_and_indices_as_torch(backend, k):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2000, generator=g) * 4
    with sk.use_backend(backend):
        values, indices = sk.softmax_topk(x, k)
        log_values, log_indices = sk.log_softmax_topk(x, k)
    ref_values, ref_indices = _torch_topk(x, k)
    assert torch.equal(indices, ref_indices) and torch.equal(log_indices, ref_indices)
    torch.testing.assert_close(values, ref_values, rtol=2e-6, atol=1e-9)
    torch.testing.assert_close(log_values, _torch_topk(x, k, log=True)[0], rtol=2e-6, atol=1e-5)


def test_k_equal_to_row_length_and_other_dim():
    x = torch.randn(3, 40, 6)
    with sk.use_backend("numba"):
        values, indices = sk.softmax_topk(x, 6)
        v1, i1 = sk.softmax_topk(x, 4, dim=1)      # not the last axis: reference path
    ref = torch.softmax(x, -1).topk(6, dim=-1)
    torch.testing.assert_close(values, ref.values)
    assert torch.equal(indices, ref.indices)
    assert torch.equal(i1, torch.softmax(x, 1).topk(4, dim=1).indices)


def test_tie_rule_equal_scores_by_increasing_index():
    x = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0, -1.0] * 1000])
    with sk.use_backend("numba"):
        values, indices = sk.softmax_topk(x, 5)
    assert indices.tolist() == [[1, 3, 4, 7, 9]]
    assert torch.all(values[0, :-1] >= values[0, 1:])


def test_adversarial_rows_match_the_reference():
    torch.manual_seed(0)
    x = torch.randn(6, 300) * 3
    x[0] *= 1e4
    x[1, ::2] = float("-inf")
    x[2] = float("-inf")
    x[3, 17] = float("inf")
    x[4, 3] = float("nan")
    with sk.use_backend("numba"):
        values, indices = sk.softmax_topk(x, 3)
    with sk.use_backend("reference"):
        ref_values, ref_indices = sk.softmax_topk(x, 3)
    torch.testing.assert_close(values, ref_values, equal_nan=True)
    # one documented order on both paths, underflowing probabilities (row 0: the top
    # entry, then ties at 0) and empty rows included: equal values by increasing index
    assert torch.equal(indices[:4], ref_indices[:4])
    top = int(x[0].argmax())
    assert indices[0].tolist() == [top] + [i for i in range(3) if i != top][:2]
    assert torch.equal(values[2], torch.zeros(3))


def test_k_is_validated():
    x = torch.randn(2, 5)
    for bad in (0, 6, -1):
        with pytest.raises(ValueError, match="k must be between 1 and 5"):
            sk.softmax_topk(x, bad)
    with pytest.raises(TypeError, match="k must be an int"):
        sk.softmax_topk(x, 2.0)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        sk.softmax_topk(torch.ones(2, 5, dtype=torch.long), 2)


def test_requires_grad_keeps_the_graph():
    x = torch.randn(2, 100, requires_grad=True)
    with sk.use_backend("numba"):
        values, _ = sk.softmax_topk(x, 3)
    values.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kth_largest_by_heap_matches_a_sort(dtype):
    from softmaxkit.kernels.cpu.topk import _kth_largest

    rng = np.random.default_rng(3)
    cases = [rng.standard_normal(2004), np.round(rng.standard_normal(500)), np.full(64, 2.5),
             np.concatenate([np.full(40, -np.inf), rng.standard_normal(30)]), np.arange(50.0)[::-1],
             np.arange(50.0)]
    for v in cases:
        v = v.astype(dtype)
        for k in sorted({1, 2, 7, 50, len(v)} & set(range(1, len(v) + 1))):
            heap, scratch = np.empty(k, dtype), np.empty(k, np.int64)
            assert _kth_largest(v, k, heap, scratch) == np.sort(v)[::-1][k - 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_plain_topk_kernel_matches_torch_topk(dtype, threads):
    from softmaxkit.kernels.cpu.topk import topk

    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows, n, k in [(5, 128256, 50), (3, 6500 + 17, 5), (2, 50257, 1)]:
            z = torch.randn(rows, n, dtype=dtype)
            z[0, :3000] = float("-inf")   # a masked stretch: still exact
            values, indices = topk(z, k)
            ref_values, ref_indices = torch.topk(z, k)
            assert torch.equal(values, ref_values) and torch.equal(indices, ref_indices)
    finally:
        torch.set_num_threads(before)


def test_plain_topk_kernel_orders_ties_by_index_and_declines_nan_and_inf():
    from softmaxkit.kernels.cpu.topk import topk

    z = torch.round(torch.randn(3, 20000, generator=torch.Generator().manual_seed(1)) * 2)
    values, indices = topk(z, 50)
    for r in range(3):
        expected = sorted(range(z.shape[1]), key=lambda j: (-z[r, j].item(), j))[:50]
        assert indices[r].tolist() == expected
        assert torch.equal(values[r], z[r, expected])
    almost_empty = torch.full((1, 20000), float("-inf"))
    almost_empty[0, 9999] = -1e9
    values, indices = topk(almost_empty, 4)
    assert values[0, 0] == -1e9 and indices[0].tolist() == [9999, 0, 1, 2]
    for bad in (float("nan"), float("inf")):
        z = torch.randn(4, 20000)
        z[2, 123] = bad
        assert topk(z, 5) is None


def test_sample_top_k_through_the_kernel_still_rejects_nan_and_inf_logits():
    for bad in (float("nan"), float("inf")):
        z = torch.randn(4, 20000)
        z[1, 77] = bad
        with pytest.raises(ValueError, match="logits"):
            sk.sampling.sample(z, top_k=5, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fill", [-1e9, "min", "max", float("-inf"), "tiny"])
def test_plain_topk_kernel_is_exact_on_mask_fills(dtype, fill):
    from softmaxkit.kernels.cpu.topk import topk

    info = torch.finfo(dtype)
    value = {"min": info.min, "max": info.max, "tiny": info.smallest_normal / 4}.get(fill, fill)
    z = torch.randn(4, 5000 + 33, dtype=dtype, generator=torch.Generator().manual_seed(2)).to(dtype)
    z[0, 300:] = value    # a masked stretch
    z[1] = value          # a whole row of the fill
    z[2, ::7] = value     # scattered
    values, indices = topk(z, 17)   # (a finfo.max row overflows its sum to +inf: still computed)
    for r in range(4):
        expected = sorted(range(z.shape[1]), key=lambda j: (-z[r, j].item(), j))[:17]
        assert indices[r].tolist() == expected
        assert torch.equal(values[r], z[r, expected])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plain_topk_kernel_computes_a_row_whose_sum_is_nan_without_a_nan(dtype):
    """finfo.max and finfo.min side by side: the row sum (the kernel's NaN test) is inf - inf."""
    from softmaxkit.kernels.cpu.topk import topk

    info = torch.finfo(dtype)
    z = torch.randn(3, 20000, dtype=dtype)
    z[1, ::2], z[1, 1::2] = info.max, info.min
    values, indices = topk(z, 5)
    assert indices[1].tolist() == [0, 2, 4, 6, 8] and bool((values[1] == info.max).all())
    ref_values, ref_indices = torch.topk(z[[0, 2]], 5)
    assert torch.equal(values[[0, 2]], ref_values) and torch.equal(indices[[0, 2]], ref_indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_topk_kernels_at_chunk_and_block_boundaries(dtype):
    """Rows one entry short of, at and past a multiple of the chunk and the block (the chunk
    maxima's tail chunk, a last chunk of one entry), with ties and a masked stretch: the plain
    and the fused kernels give the reference's order (decreasing value, equal values by
    increasing index)."""
    from softmaxkit.kernels.cpu.topk import BLOCK, CHUNK, topk

    g = torch.Generator().manual_seed(3)
    for n in (1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + CHUNK + 1):
        z = torch.round(torch.randn(3, n, generator=g, dtype=dtype) * 2)
        z[1, : n // 2] = float("-inf")
        k = min(n, 9)
        values, indices = topk(z, k)
        with sk.use_backend("numba"):
            p_values, p_indices = sk.softmax_topk(z, k)
        for r in range(3):
            expected = sorted(range(n), key=lambda j: (-z[r, j].item(), j))[:k]
            assert indices[r].tolist() == expected, (n, r)
            assert torch.equal(values[r], z[r, expected])
            assert p_indices[r].tolist() == expected, (n, r)
        torch.testing.assert_close(p_values, torch.softmax(z, -1).gather(-1, p_indices))
