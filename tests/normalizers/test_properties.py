"""Property tests (hypothesis): simplex membership, non-negativity, permutation equivariance,
shift invariance where it holds (NormalizerSpec.shift_invariant), and the limits."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import softmaxkit as sk
from softmaxkit import registry
from tests.conftest import learnable_tensors, names_with_user, params_for

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
NAMES = names_with_user()
SUMS_TO_ONE = [s.name for s in registry.normalizers() if s.sums_to_one]
SHIFT_INVARIANT = [s.name for s in registry.normalizers() if s.shift_invariant]
NONNEGATIVE = [s.name for s in registry.normalizers() if not s.can_be_negative] + [names_with_user()[-1]]

rows = st.integers(1, 12).flatmap(
    lambda n: arrays(np.float64, (3, n), elements=st.floats(-30, 30, allow_nan=False, width=64)))


def call(name, x, **kw):
    x = torch.as_tensor(x)
    return registry.normalize(x, name, **{**params_for(name, x.shape[-1]), **kw})


@pytest.mark.parametrize("name", SUMS_TO_ONE)
@SETTINGS
@given(x=rows)
def test_simplex_membership(name, x):
    p = call(name, x)
    assert (p >= 0).all() and (p <= 1 + 1e-12).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("name", NONNEGATIVE)
@SETTINGS
@given(x=rows)
def test_nonnegative(name, x):
    assert (call(name, x) >= 0).all()


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(x=rows, seed=st.integers(0, 1000))
def test_permutation_equivariance(name, x, seed):
    x = torch.as_tensor(x)
    x = x + 1e-6 * torch.arange(x.shape[-1], dtype=x.dtype)  # no ties, so top-k is unambiguous
    perm = torch.randperm(x.shape[-1], generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(call(name, x[:, perm]), call(name, x)[:, perm])


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
@SETTINGS
@given(x=rows, c=st.floats(-50, 50))
def test_shift_invariance(name, x, c):
    x = torch.as_tensor(x) + 1e-6 * torch.arange(x.shape[-1], dtype=torch.float64)  # no ties for top-k
    torch.testing.assert_close(call(name, x + c), call(name, x), atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("name", sorted(set(NAMES) - set(SHIFT_INVARIANT)))
def test_shift_invariance_flags_are_honest(name):
    x = torch.tensor([[0.3, -1.2, 2.0, 0.1]], dtype=torch.float64)
    kw = learnable_tensors(name)  # away from the initial values (MultiMax's zeros are softmax)
    assert not torch.allclose(call(name, x + 3.0, **kw), call(name, x, **kw))


@SETTINGS
@given(x=rows)
def test_limits(x):
    x = torch.as_tensor(x)
    softmax = sk.softmax(x)
    torch.testing.assert_close(sk.clipped_softmax(x, gamma=0.0, zeta=1.0), softmax)
    torch.testing.assert_close(sk.sparse_softmax(x, k=x.shape[-1]), softmax)
    torch.testing.assert_close(sk.multimax(x), softmax)
    torch.testing.assert_close(sk.ssmax(x, s=1.0, n=np.e), softmax)
    torch.testing.assert_close(sk.entmax(x, alpha=1.0), softmax)
    torch.testing.assert_close(sk.entmax(x, alpha=1.0 + 1e-6), softmax, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sk.entmax(x, alpha=2.0), sk.sparsemax(x), atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(sk.entmax(x, alpha=1.5), sk.entmax15(x), atol=1e-9, rtol=1e-7)


@SETTINGS
@given(x=rows)
def test_adaptive_softmax_equals_softmax_at_low_entropy(x):
    x = torch.as_tensor(x)
    p = sk.softmax(x)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    low = entropy <= 0.5
    torch.testing.assert_close(sk.adaptive_softmax(x)[low], p[low])
