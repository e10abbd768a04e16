"""Every registered normalizer follows the package conventions: mask, -inf, dtype, dim, NaN,
extreme and degenerate inputs, and passes gradcheck in float64 (learnable parameters included)."""


import pytest
import torch

import softmaxkit as sk
from softmaxkit import registry
from tests.conftest import learnable_tensors, names_with_user, params_for

NAMES = names_with_user()


def elementwise(name):
    """Each weight depends on its own score (and the count) only."""
    return registry.get(name).family == "elementwise"


def call(name, x, **kw):
    return registry.normalize(x, name, **{**params_for(name), **kw})


def scores(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def row_mask(shape, seed=1):
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[..., 0] = True
    mask[0] = False  # one row with nothing visible
    return mask


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck(name, masked):
    x = scores(4, 6).requires_grad_()
    mask = row_mask((4, 6)) if masked else None
    params = {k: v.clone().requires_grad_() for k, v in learnable_tensors(name).items()}
    keys = list(params)

    def f(x, *values):
        return call(name, x, mask=mask, **dict(zip(keys, values)))

    assert torch.autograd.gradcheck(f, (x, *params.values()), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_masked_entries_are_exactly_zero_and_all_masked_rows_are_zero(name):
    x = scores(5, 7).requires_grad_()
    mask = row_mask((5, 7))
    out = call(name, x, mask=mask)
    assert torch.isfinite(out).all()
    assert (out[~mask] == 0).all()
    assert (out[0] == 0).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[0] == 0).all()
    assert (x.grad[~mask] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_mask_equals_dropping_the_entries(name):
    x = scores(7)
    keep = torch.tensor([True, False, True, True, False, True, True])
    out = call(name, x, mask=keep)
    torch.testing.assert_close(out[keep], call(name, x[keep]))


@pytest.mark.parametrize("name", NAMES)
def test_minus_inf_behaves_like_a_mask(name):
    x = scores(3, 6)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[:, 2] = False
    mask[1, 4] = False
    with_inf = x.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(call(name, with_inf), call(name, x, mask=mask))
    all_inf = torch.full((2, 5), float("-inf"), dtype=torch.float64)
    assert torch.equal(call(name, all_inf), torch.zeros_like(all_inf))


@pytest.mark.parametrize("name", NAMES)
def test_mask_broadcasts(name):
    x = scores(2, 3, 5)
    mask = torch.tensor([True, True, False, True, False])
    torch.testing.assert_close(call(name, x, mask=mask), call(name, x, mask=mask.expand(2, 3, 5)))


@pytest.mark.parametrize("name", NAMES)
def test_any_dim(name):
    x = scores(3, 5, 4)
    torch.testing.assert_close(call(name, x, dim=1), call(name, x.transpose(1, 2)).transpose(1, 2))
    torch.testing.assert_close(call(name, x, dim=0), call(name, x.movedim(0, -1)).movedim(-1, 0))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_is_computed_in_float32(name, dtype):
    x = scores(4, 33, dtype=torch.float32) * 3
    out = call(name, x.to(dtype))
    assert out.dtype == dtype
    expected = call(name, x.to(dtype).float()).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_nan_stays_in_its_row(name):
    x = scores(3, 6)
    x[1, 2] = float("nan")
    out = call(name, x)
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()
    torch.testing.assert_close(out[[0, 2]], call(name, x[[0, 2]]))
    if elementwise(name):
        assert torch.isnan(out[1, 2]) and torch.isfinite(out[1, [0, 1, 3, 4, 5]]).all()
    else:
        assert torch.isnan(out[1]).all(), "a NaN must not be silently dropped from its row"
    masked = torch.ones_like(x, dtype=torch.bool)
    masked[1, 2] = False
    assert torch.isfinite(call(name, x, mask=masked)).all(), "a masked NaN is invisible"


@pytest.mark.parametrize("name", NAMES)
def test_extreme_scores_give_finite_outputs(name):
    x = torch.tensor([[1e4, -1e4, 0.0, 5.0], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4, 1e4, 1e4]],
                     dtype=torch.float32, requires_grad=True)
    out = call(name, x)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_positive_infinity_gives_the_limit_or_stays_in_its_row(name):
    x = torch.tensor([[0.5, float("inf"), 1.0], [0.1, 0.2, 0.3]], dtype=torch.float64)
    out = call(name, x)
    torch.testing.assert_close(out[1], call(name, x[1]))
    spec = registry.get(name)
    if spec.sums_to_one and torch.isfinite(out[0]).all():
        torch.testing.assert_close(out[0], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("name", NAMES)
def test_a_nan_beside_a_positive_infinity_keeps_its_row_nan(name):
    """A visible NaN makes its row NaN even when a ``+inf`` would make the row its limit (softpick,
    stablemax, the sum-normalized rectifiers and softmax_sink returned the limit and hid the NaN)."""
    x = torch.tensor([[float("inf"), 1.0, float("nan")], [0.1, 0.2, 0.3]], dtype=torch.float64)
    out = call(name, x)
    assert torch.isnan(out[0, 2]), out
    if not elementwise(name):
        assert torch.isnan(out[0]).all(), out
    torch.testing.assert_close(out[1], call(name, x[1]))


@pytest.mark.parametrize("name", NAMES)
def test_rows_of_length_one_and_empty_dims(name):
    one = scores(4, 1)
    out = call(name, one, **params_for(name, 1))
    assert out.shape == one.shape and torch.isfinite(out).all()
    if registry.get(name).sums_to_one:
        torch.testing.assert_close(out, torch.ones_like(one))
    empty_rows = scores(0, 5)
    assert call(name, empty_rows).shape == (0, 5)
    empty_dim = scores(3, 0)
    assert call(name, empty_dim, **params_for(name, 0)).shape == (3, 0)


@pytest.mark.parametrize("name", NAMES)
def test_a_row_of_a_million_entries(name):
    x = scores(1_000_000, dtype=torch.float32) * 4
    out = call(name, x)
    assert torch.isfinite(out).all()
    if registry.get(name).sums_to_one:
        assert abs(out.double().sum().item() - 1.0) < 1e-4


def test_logsumexp_and_log_softmax_edges():
    x = torch.tensor([[1.0, 2.0, float("-inf")], [float("-inf")] * 3], dtype=torch.float64, requires_grad=True)
    lse = sk.logsumexp(x)
    assert lse[1] == float("-inf")
    torch.testing.assert_close(lse[0], torch.logsumexp(x[0, :2], 0))
    lse[0].backward()
    assert torch.isfinite(x.grad).all()
    ls = sk.log_softmax(x)
    assert ls[0, 2] == float("-inf") and (ls[1] == float("-inf")).all()
    assert sk.logsumexp(x, keepdim=True).shape == (2, 1)
    assert sk.logsumexp(torch.empty(2, 0)).eq(float("-inf")).all()


def test_scalar_input():
    assert sk.softmax(torch.tensor(3.0)).item() == 1.0


class TestBadInput:
    def test_unknown_name_lists_registered_names(self):
        with pytest.raises(ValueError, match="softpick"):
            sk.normalize(torch.randn(3), "softmaxx")

    def test_unknown_parameter_is_named(self):
        with pytest.raises(TypeError, match="temprature"):
            sk.normalize(torch.randn(3), "softmax", temprature=2.0)

    def test_integer_input(self):
        with pytest.raises(TypeError, match="x must be a floating-point"):
            sk.softmax(torch.arange(3))

    def test_not_a_tensor(self):
        with pytest.raises(TypeError, match="x must be a torch.Tensor"):
            sk.softmax([1.0, 2.0])

    @pytest.mark.parametrize("t", [0.0, -1.0, float("nan")])
    def test_temperature(self, t):
        with pytest.raises(ValueError, match="temperature"):
            sk.softmax(torch.randn(3), temperature=t)

    def test_alpha_below_one(self):
        with pytest.raises(ValueError, match="alpha"):
            sk.entmax(torch.randn(3), alpha=0.5)

    @pytest.mark.parametrize("k", [0, 6])
    def test_k_out_of_range(self, k):
        with pytest.raises(ValueError, match="k must be between 1 and 5"):
            sk.sparse_softmax(torch.randn(2, 5), k=k)

    def test_mask_that_does_not_broadcast(self):
        with pytest.raises(ValueError, match="mask of shape"):
            sk.softmax(torch.randn(2, 5), mask=torch.ones(3, dtype=torch.bool))

    def test_mask_must_be_bool(self):
        with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
            sk.softmax(torch.randn(2, 5), mask=torch.ones(5))

    def test_dim_out_of_range(self):
        with pytest.raises(ValueError, match="dim=2"):
            sk.softmax(torch.randn(2, 5), dim=2)

    def test_clipped_softmax_stretch(self):
        with pytest.raises(ValueError, match="zeta must be > gamma"):
            sk.clipped_softmax(torch.randn(3), gamma=1.0, zeta=0.5)

    def test_ssmax_n(self):
        with pytest.raises(ValueError, match="n must be >= 1"):
            sk.ssmax(torch.randn(3), n=0)


@pytest.mark.parametrize("name", NAMES)
def test_a_mask_or_parameter_without_data_is_named(name):
    """Hostile sweep 2026-12-05: a mask (or a tensor parameter) left on the meta device beside a
    CPU input raised torch's NotImplementedError "Cannot copy out of meta tensor; no data!"."""
    x = scores(2, 5)
    with pytest.raises(ValueError, match="mask is a meta tensor without data"):
        call(name, x, mask=torch.ones(2, 5, dtype=torch.bool, device="meta"))
    for pname, value in learnable_tensors(name).items():
        with pytest.raises(ValueError, match=rf"{pname}(\[\d\])? is a meta tensor without data"):
            call(name, x, **{pname: value.to("meta")})
