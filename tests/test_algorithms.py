"""The three softmax algorithms and OnlineSoftmaxState."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxkit as sk
from softmaxkit.algorithms import OnlineSoftmaxState, online_softmax, three_pass_softmax, two_pass_softmax

ALGORITHMS = [three_pass_softmax, two_pass_softmax, online_softmax]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("scale", [1.0, 30.0, 1e4])
def test_agrees_with_torch_to_float32_precision(algorithm, scale):
    x = torch.randn(16, 3000, generator=torch.Generator().manual_seed(0)) * scale
    torch.testing.assert_close(algorithm(x), torch.softmax(x, -1), rtol=1.3e-6, atol=1e-7)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_float64_exact(algorithm):
    x = torch.randn(8, 777, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 10
    torch.testing.assert_close(algorithm(x), torch.softmax(x, -1), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_conventions(algorithm):
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[0] = False
    assert torch.autograd.gradcheck(lambda t: algorithm(t, mask=mask), (x,))
    torch.testing.assert_close(algorithm(x, mask=mask), sk.softmax(x, mask=mask))
    special = torch.tensor([[float("-inf")] * 3, [1.0, float("inf"), float("inf")], [1e4, -1e4, 0.0]])
    torch.testing.assert_close(algorithm(special), sk.softmax(special))
    assert algorithm(torch.randn(2, 5).half()).dtype == torch.float16
    assert algorithm(torch.randn(3, 0)).shape == (3, 0)
    torch.testing.assert_close(algorithm(x, dim=0), torch.softmax(x, 0))
    with_nan = torch.tensor([[0.5, float("nan"), 1.0], [0.1, 0.2, 0.3]])
    out = algorithm(with_nan)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()
    # a NaN row's masked entries (and -inf scores) stay exactly 0, as in sk.softmax
    for row in ([float("nan"), 1.0, 2.0, 3.0], [float("nan"), float("inf"), 2.0, 3.0]):
        x_nan = torch.tensor([row, [0.0, 1.0, 2.0, float("-inf")]])
        visible = torch.tensor([[True, True, False, True], [True, False, True, True]])
        torch.testing.assert_close(algorithm(x_nan, mask=visible), sk.softmax(x_nan, mask=visible), equal_nan=True)
        assert algorithm(x_nan, mask=visible)[0, 2] == 0 and algorithm(x_nan, mask=visible)[1, 3] == 0


def test_two_pass_never_overflows_its_sum():
    x = torch.full((1, 100_000), 88.0)  # exp(88) * 1e5 overflows float32
    torch.testing.assert_close(two_pass_softmax(x), torch.full_like(x, 1e-5))


def test_online_softmax_does_not_depend_on_block_size():
    x = torch.randn(3, 1001, dtype=torch.float64)
    for block in (1, 7, 1000, 5000):
        torch.testing.assert_close(online_softmax(x, block_size=block), torch.softmax(x, -1))
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(x, block_size=0)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(cuts=st.lists(st.integers(0, 200), min_size=0, max_size=6), seed=st.integers(0, 10_000),
       order=st.permutations(range(7)))
def test_state_merge_agrees_over_random_splits(cuts, seed, order):
    x = torch.randn(5, 200, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 20
    x[0, :50] = float("-inf")
    edges = sorted({0, 200, *cuts})
    blocks = [OnlineSoftmaxState.from_block(x[:, a:b]) for a, b in zip(edges, edges[1:])]
    blocks += [OnlineSoftmaxState.empty((5,), torch.float64)] * (7 - len(blocks))
    state = OnlineSoftmaxState.empty((5,), torch.float64)
    for i in order:
        state = state.merge(blocks[i])
    torch.testing.assert_close(state.logsumexp(), torch.logsumexp(x, -1))
    torch.testing.assert_close(state.probs(x), torch.softmax(x, -1))


def test_state_is_associative():
    a, b, c = (OnlineSoftmaxState.from_block(torch.randn(4, 9, dtype=torch.float64) * 5) for _ in range(3))
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    torch.testing.assert_close(left.logsumexp(), right.logsumexp())


def test_state_edges_and_gradient():
    empty = OnlineSoftmaxState.from_block(torch.full((2, 3), float("-inf")))
    assert (empty.logsumexp() == float("-inf")).all() and (empty.d == 0).all()
    inf = OnlineSoftmaxState.from_block(torch.tensor([[1.0, float("inf"), float("inf")]]))
    assert inf.logsumexp().item() == float("inf")
    torch.testing.assert_close(inf.probs(torch.tensor([[1.0, float("inf"), float("inf")]])),
                               torch.tensor([[0.0, 0.5, 0.5]]))
    x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)

    def lse(t):
        return OnlineSoftmaxState.from_block(t[:, :4]).update(t[:, 4:]).logsumexp()

    assert torch.autograd.gradcheck(lse, (x,))
    with pytest.raises(TypeError, match="other"):
        empty.merge((1, 2))
