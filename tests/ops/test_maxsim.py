"""MaxSim and Signed MaxSim against the dense einsum, and the sparse-vector construction."""

import pytest
import torch

from softmaxkit.ops import maxsim, signed_maxsim


def dense_maxsim(Q, D, q_mask=None, d_mask=None, q_sign=None):
    """The naive formula: the full (Bq, Bd, Lq, Ld) similarity tensor."""
    sim = torch.einsum("qid,bjd->qbij", Q, D)
    if d_mask is not None:
        sim = sim.masked_fill(~d_mask[None, :, None, :], float("-inf"))
    best = sim.amax(-1)
    if d_mask is not None:
        best = torch.where(d_mask.any(-1)[None, :, None], best, torch.zeros(()))
    weights = torch.ones(Q.shape[:2], dtype=Q.dtype)
    if q_sign is not None:
        weights = weights * q_sign
    if q_mask is not None:
        weights = weights * q_mask
    return (best * weights[:, None, :]).sum(-1)


def random_inputs(seed, bq=3, lq=5, bd=11, ld=7, d=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(bq, lq, d, generator=g, dtype=dtype)
    D = torch.randn(bd, ld, d, generator=g, dtype=dtype)
    q_mask = torch.rand(bq, lq, generator=g) > 0.3
    d_mask = torch.rand(bd, ld, generator=g) > 0.3
    d_mask[1] = False  # a document with no visible token
    q_sign = torch.where(torch.rand(bq, lq, generator=g) > 0.5, 1.0, -1.0).to(dtype)
    return Q, D, q_mask, d_mask, q_sign


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 100])
@pytest.mark.parametrize("seed", range(3))
def test_equals_dense_einsum(chunk_size, seed):
    Q, D, q_mask, d_mask, q_sign = random_inputs(seed)
    torch.testing.assert_close(maxsim(Q, D, chunk_size=chunk_size), dense_maxsim(Q, D))
    torch.testing.assert_close(maxsim(Q, D, q_mask, d_mask, chunk_size=chunk_size),
                               dense_maxsim(Q, D, q_mask, d_mask))
    torch.testing.assert_close(signed_maxsim(Q, D, q_sign, q_mask, d_mask, chunk_size=chunk_size),
                               dense_maxsim(Q, D, q_mask, d_mask, q_sign))
    assert torch.all(maxsim(Q, D, q_mask, d_mask)[:, 1] == 0)


def test_all_positive_signs_is_maxsim_and_low_precision():
    Q, D, q_mask, d_mask, _ = random_inputs(5, dtype=torch.float32)
    ones = torch.ones(Q.shape[:2])
    torch.testing.assert_close(signed_maxsim(Q, D, ones, q_mask, d_mask), maxsim(Q, D, q_mask, d_mask))
    out = maxsim(Q.bfloat16(), D.bfloat16(), q_mask, d_mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense_maxsim(Q.bfloat16().float(), D.bfloat16().float(), q_mask, d_mask),
                               rtol=2e-2, atol=2e-2)


def test_gradcheck():
    Q, D, q_mask, d_mask, q_sign = random_inputs(1, bq=2, lq=3, bd=3, ld=3, d=3)
    Q.requires_grad_(True)
    D.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, d: maxsim(q, d, q_mask, d_mask, chunk_size=3), (Q, D))
    assert torch.autograd.gradcheck(lambda q, d: signed_maxsim(q, d, q_sign, q_mask, d_mask, chunk_size=1), (Q, D),
                                    fast_mode=True)
    grad_q, = torch.autograd.grad(maxsim(Q, D, q_mask, d_mask, chunk_size=2).sum(), Q)
    ref_q, = torch.autograd.grad(dense_maxsim(Q, D, q_mask, d_mask).sum(), Q)
    torch.testing.assert_close(grad_q, ref_q)


def sparse_vector(n, k, g):
    x = torch.zeros(n, dtype=torch.float64)
    # integer values: every product and sum below is exact in float64
    x[torch.randperm(n, generator=g)[:k]] = torch.randint(1, 10, (k,), generator=g).to(torch.float64)
    return x


def multivector(x):
    """The MaxSim representation of a vector: one vector ``x_i e_i`` per non-zero ``x_i``.

    k vectors for a k-sparse x (one zero vector, masked out, if x = 0).
    """
    support = torch.nonzero(x).flatten()
    vectors = torch.zeros(max(len(support), 1), len(x), dtype=x.dtype)
    vectors[torch.arange(len(support)), support] = x[support]
    mask = torch.zeros(len(vectors), dtype=torch.bool)
    mask[: len(support)] = True
    return vectors, mask


@pytest.mark.parametrize("k", [1, 3, 8])
def test_sparse_inner_product_construction(k):
    """For non-negative k-sparse x, y: MaxSim of their k-vector representations is <x, y>.

    Query token x_i e_i meets document tokens y_j e_j: the inner product is x_i y_i when
    j = i and 0 otherwise, and x_i y_i >= 0, so max_j gives x_i y_i exactly; summing over
    the support of x gives <x, y>. The identity survives a common rotation of all vectors.
    """
    g = torch.Generator().manual_seed(k)
    n = 40
    xs = [sparse_vector(n, k, g) for _ in range(6)]
    ys = [sparse_vector(n, k, g) for _ in range(9)] + [torch.zeros(n, dtype=torch.float64)]
    ys[0] = xs[0].clone()  # identical supports
    pad = lambda reps: torch.nn.utils.rnn.pad_sequence([r[0] for r in reps], batch_first=True)
    pad_mask = lambda reps: torch.nn.utils.rnn.pad_sequence([r[1] for r in reps], batch_first=True)
    qx, dy = [multivector(x) for x in xs], [multivector(y) for y in ys]
    Q, q_mask, D, d_mask = pad(qx), pad_mask(qx), pad(dy), pad_mask(dy)
    assert Q.shape[1] <= k and D.shape[1] <= k
    expected = torch.stack(xs) @ torch.stack(ys).T
    assert torch.equal(maxsim(Q, D, q_mask, d_mask, chunk_size=4), expected)
    rotation, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    torch.testing.assert_close(maxsim(Q @ rotation, D @ rotation, q_mask, d_mask), expected, rtol=0, atol=1e-12)
    # signed query vectors represent a signed x against a non-negative y
    signed = xs[1] * torch.where(torch.rand(n, generator=g) > 0.5, 1.0, -1.0).to(torch.float64)
    vectors, mask = multivector(signed.abs())
    sign = torch.sign(signed[torch.nonzero(signed).flatten()])[None]
    got = signed_maxsim(vectors[None], D, sign, mask[None], d_mask)
    torch.testing.assert_close(got[0], torch.stack(ys) @ signed, rtol=0, atol=1e-12)


def test_empty_inputs():
    assert maxsim(torch.zeros(0, 4, 8), torch.randn(5, 3, 8)).shape == (0, 5)
    assert maxsim(torch.randn(2, 4, 8), torch.zeros(0, 3, 8)).shape == (2, 0)
    assert torch.equal(maxsim(torch.randn(2, 4, 8), torch.zeros(5, 0, 8)), torch.zeros(2, 5))


def test_bad_input():
    Q, D = torch.randn(2, 3, 4), torch.randn(5, 6, 4)
    with pytest.raises(ValueError, match="Q and D"):
        maxsim(Q, torch.randn(5, 6, 3))
    with pytest.raises(ValueError, match="Q"):
        maxsim(torch.randn(3, 4), D)
    with pytest.raises(TypeError, match="D"):
        maxsim(Q, torch.ones(5, 6, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="d_mask"):
        maxsim(Q, D, d_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="q_mask"):
        maxsim(Q, D, q_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="chunk_size"):
        maxsim(Q, D, chunk_size=0)
    with pytest.raises(ValueError, match="q_sign"):
        signed_maxsim(Q, D, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="q_sign"):
        signed_maxsim(Q, D, torch.ones(3, 2))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_hidden_query_token_is_never_read(bad):
    """A token hidden by ``q_mask`` adds 0: a NaN or inf in its vector made every score NaN
    (weight 0 times NaN; hostile audit, 2026-12-02), as ``d_mask`` already did not."""
    gen = torch.Generator().manual_seed(1)
    q, d = torch.randn(1, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    q[0, 2] = bad
    keep = torch.tensor([[True, True, False]])
    torch.testing.assert_close(maxsim(q, d, q_mask=keep), maxsim(q[:, :2], d))
    sign = torch.tensor([[1.0, -1.0, 1.0]])
    torch.testing.assert_close(signed_maxsim(q, d, sign, q_mask=keep),
                               signed_maxsim(q[:, :2], d, sign[:, :2]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_hidden_document_token_is_never_read_by_the_gradient(bad):
    """A NaN or inf in a token hidden by ``d_mask`` left the scores finite but made every
    query's gradient NaN (``dQ = dsim @ D``, zero weight times NaN; hostile audit, 2026-12-02)."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    d = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    d[0, 4] = bad
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[0, 4] = False
    clean = d.clone()
    clean[0, 4] = 0.0
    d.requires_grad_()
    clean.requires_grad_()
    for chunk_size in (1, 2, None):
        got = torch.autograd.grad(maxsim(q, d, d_mask=keep, chunk_size=chunk_size).sum(), (q, d))
        want = torch.autograd.grad(maxsim(q, clean, d_mask=keep, chunk_size=chunk_size).sum(), (q, clean))
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_empty_vector_size_gives_zeros():
    q = torch.zeros(2, 3, 0, requires_grad=True)
    out = maxsim(q, torch.zeros(4, 5, 0))
    assert torch.equal(out, torch.zeros(2, 4))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros(2, 3, 0))


def test_forward_mode_ad_equals_the_dense_formula():
    """``torch.func.jvp`` and ``forward_ad`` dual tensors: the ``out=`` buffer of the plain path has
    no forward derivative (NotImplementedError for mm_out)."""
    Q, D, q_mask, d_mask, q_sign = random_inputs(6, bq=2, lq=3, bd=5, ld=4, d=3)
    g = torch.Generator().manual_seed(7)
    tq, td = torch.randn(Q.shape, generator=g, dtype=Q.dtype), torch.randn(D.shape, generator=g, dtype=D.dtype)
    for ours, ref in ((lambda q, d: maxsim(q, d, q_mask, d_mask, chunk_size=2),
                       lambda q, d: dense_maxsim(q, d, q_mask, d_mask)),
                      (lambda q, d: signed_maxsim(q, d, q_sign, q_mask, d_mask, chunk_size=2),
                       lambda q, d: dense_maxsim(q, d, q_mask, d_mask, q_sign))):
        out, tangent = torch.func.jvp(ours, (Q, D), (tq, td))
        want, want_tangent = torch.func.jvp(ref, (Q, D), (tq, td))
        torch.testing.assert_close(out, ours(Q, D), rtol=0, atol=0)
        torch.testing.assert_close((out, tangent), (want, want_tangent), rtol=0, atol=1e-12)
        want_q = torch.func.jvp(ref, (Q, D), (tq, torch.zeros_like(D)))[1]
        with torch.autograd.forward_ad.dual_level():
            dual = ours(torch.autograd.forward_ad.make_dual(Q, tq), D)
            tangent_q = torch.autograd.forward_ad.unpack_dual(dual).tangent
        torch.testing.assert_close(tangent_q, want_q, rtol=0, atol=1e-12)


def test_vmap_equals_a_loop():
    """``torch.func.vmap`` over each argument: ``matmul(out=...)`` and the in-place mask fill of the
    plain path have no batching rule, and the +1/-1 check of ``q_sign`` branched on its values."""
    Q, D, q_mask, d_mask, q_sign = random_inputs(8, bq=2, lq=3, bd=5, ld=4, d=3)
    Qs, Ds = torch.stack([Q, -Q, 2 * Q]), torch.stack([D, D.flip(0), -D])
    masks, signs = torch.stack([d_mask, ~d_mask, d_mask.flip(1)]), torch.stack([q_sign, -q_sign, q_sign.flip(1)])

    def check(fn, batch):
        torch.testing.assert_close(torch.func.vmap(fn)(batch), torch.stack([fn(b) for b in batch]),
                                   rtol=0, atol=1e-12)

    check(lambda q: maxsim(q, D, q_mask, d_mask, chunk_size=2), Qs)
    check(lambda d: maxsim(Q, d, q_mask, d_mask, chunk_size=2), Ds)
    check(lambda m: maxsim(Q, D, q_mask, m, chunk_size=2), masks)
    check(lambda q: signed_maxsim(q, D, q_sign, q_mask, d_mask), Qs)
    check(lambda s: signed_maxsim(Q, D, s, q_mask, d_mask), signs)


def test_meta_tensors_give_the_shape():
    """Shape inference on the meta device: the +1/-1 check of ``q_sign`` read its values."""
    Q, D, q_mask, d_mask, q_sign = (t.to("meta") for t in random_inputs(9, bq=2, lq=3, bd=5, ld=4, d=3))
    out = signed_maxsim(Q, D, q_sign, q_mask, d_mask, chunk_size=2)
    assert out.device.type == "meta" and out.shape == (2, 5) and out.dtype == torch.float64
    assert maxsim(Q, D, q_mask, d_mask).shape == (2, 5)
