"""Forward-mode AD (``torch.func.jvp`` and ``torch.autograd.forward_ad``) through every backend,
and gradcheck's undefined-gradient test on the aten log-softmax path.

Found by the function audit: under ``forward_ad.dual_level`` the numba kernels' autograd
functions (softmax, log-softmax, log-sum-exp, entmax) raised ``NotImplementedError``, the
fused top-k kernel silently returned no tangent, the entmax reference had no ``jvp`` at
all, and the aten log-softmax gradient hook crashed on an undefined gradient.
"""

import pytest
import torch
from torch.autograd import forward_ad
from torch.func import jvp

import softmaxkit as sk

F64 = torch.float64


def _scores(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _finite_difference(f, x, v, eps=1e-6):
    return (f(x + eps * v) - f(x - eps * v)) / (2 * eps)


OPS = {
    "softmax": sk.softmax,
    "softmax_T": lambda x: sk.softmax(x, temperature=0.5),
    "log_softmax": sk.log_softmax,
    "logsumexp": sk.logsumexp,
    "sparsemax": sk.sparsemax,
    "entmax15": sk.entmax15,
    "entmax": lambda x: sk.entmax(x, alpha=1.3),
    "softmax_topk": lambda x: sk.softmax_topk(x, 3)[0],
}


@pytest.mark.parametrize("backend", ["auto", "numba", "reference"])
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", list(OPS))
def test_dual_tensors_get_the_tangent_on_every_backend(name, requires_grad, backend):
    f = OPS[name]
    x = _scores(64, 300, seed=1)   # large enough for auto's kernels (logsumexp, sparse ops)
    x[0, :5] = 0.25                # ties inside the support
    v = _scores(64, 300, seed=2)
    with sk.use_backend("reference"):
        want = _finite_difference(f, x, v)
    with sk.use_backend(backend), forward_ad.dual_level():
        y = f(forward_ad.make_dual(x.requires_grad_(requires_grad), v))
        tangent = forward_ad.unpack_dual(y).tangent
    assert tangent is not None, "the tangent was dropped"
    torch.testing.assert_close(tangent, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.2, 3.0])
def test_entmax_jvp_in_scores(alpha):
    x = _scores(5, 9, seed=3)
    x[1, 4] = float("-inf")
    v = _scores(5, 9, seed=4)

    def f(t):
        return sk.entmax(t, alpha=alpha)

    _, tangent = jvp(f, (x,), (v,))
    torch.testing.assert_close(tangent, _finite_difference(f, x, v), atol=1e-6, rtol=1e-5)
    assert (tangent[1, 4] == 0).all()


def test_entmax_jvp_in_a_per_row_alpha():
    x = _scores(4, 7, seed=5)
    alpha = torch.tensor([[1.2], [1.5], [2.0], [2.7]], dtype=F64)
    dalpha = torch.tensor([[0.3], [-0.2], [0.5], [1.0]], dtype=F64)
    v = _scores(4, 7, seed=6)

    def f(t, a):
        return sk.entmax(t, alpha=a)

    _, tangent = jvp(f, (x, alpha), (v, dalpha))
    eps = 1e-6
    want = (f(x + eps * v, alpha + eps * dalpha) - f(x - eps * v, alpha - eps * dalpha)) / (2 * eps)
    torch.testing.assert_close(tangent, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_log_softmax_with_minus_inf_passes_gradgradcheck(backend):
    x = _scores(3, 7, seed=7)
    x[0, 3] = float("-inf")
    x.requires_grad_()
    with sk.use_backend(backend):
        assert torch.autograd.gradgradcheck(sk.log_softmax, (x,))


@pytest.mark.parametrize("shape", [(3, 9), (4, 2049)])
def test_auto_log_softmax_tangent_at_minus_inf_scores_is_the_references(shape):
    """The aten lane ran inside ``forward_ad.dual_level``, so aten's tangent ``t_j - <p, t>``
    reached ``-inf`` scores, where the reference (and reverse mode on ``auto``) gives 0."""
    x = _scores(*shape)
    x[:, 1] = float("-inf")
    t = _scores(*shape, seed=1)
    tangents = {}
    for backend in ("reference", "auto"):
        with sk.use_backend(backend), forward_ad.dual_level():
            out = sk.log_softmax(forward_ad.make_dual(x, t))
            tangents[backend] = forward_ad.unpack_dual(out).tangent
    assert (tangents["auto"][:, 1] == 0).all()
    torch.testing.assert_close(tangents["auto"], tangents["reference"])
