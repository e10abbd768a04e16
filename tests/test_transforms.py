"""``torch.func`` over the functions outside the normalizers and attention (losses, scores,
sampling, algorithms, the temperature product): each batch element equals its own call, and
``grad`` equals autograd. They raised vmap's data-dependent control-flow error (value checks
on a batched target or input) or "must override the setup_context staticmethod"."""

import pytest
import torch
from torch.func import functional_call, grad, jvp, vmap

import softmaxkit as sk


def _per_sample_gradients_equal_a_loop(loss, targets):
    model = torch.nn.Linear(5, 4)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))

    def one(p, xi, yi):
        return loss(functional_call(model, p, (xi[None],)), yi[None])

    batched = vmap(grad(one), in_dims=(None, 0, 0))(params, x, targets)
    for i in range(x.shape[0]):
        for name, value in grad(one)(params, x[i], targets[i]).items():
            torch.testing.assert_close(batched[name][i], value)


@pytest.mark.parametrize("target_kind", ["index", "distribution"])
def test_fenchel_young_per_sample_gradients(target_kind):
    g = torch.Generator().manual_seed(1)
    targets = (torch.randint(0, 4, (6,), generator=g) if target_kind == "index"
               else torch.softmax(torch.randn(6, 4, generator=g), -1))
    _per_sample_gradients_equal_a_loop(sk.losses.fenchel_young_loss, targets)


def test_spherical_z_loss_per_sample_gradients():
    _per_sample_gradients_equal_a_loop(sk.losses.spherical_z_loss,
                                       torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(1)))


def test_soften_and_centroid_distance_under_vmap():
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(3, 5, generator=g), -1)
    torch.testing.assert_close(vmap(lambda q: sk.soften(q, 2.0))(p), torch.stack([sk.soften(q, 2.0) for q in p]))
    logits = torch.randn(2, 3, 5, generator=g)
    centroids = torch.eye(5)
    torch.testing.assert_close(vmap(lambda t: sk.scores.centroid_distance(t, centroids))(logits),
                               torch.stack([sk.scores.centroid_distance(t, centroids) for t in logits]))


@pytest.mark.parametrize("name", ["three_pass_softmax", "two_pass_softmax", "online_softmax"])
def test_softmax_algorithms_under_vmap(name):
    fn = getattr(sk.algorithms, name)
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3))
    x[1, 2, 3] = float("inf")
    x[2, 0] = 2e10   # past two_pass's exponent range: its three-pass fallback
    torch.testing.assert_close(vmap(fn)(x), torch.stack([fn(row) for row in x]))


@pytest.mark.parametrize("temperature", [1e39, 1e-39])
def test_a_temperature_past_float32s_range_under_grad_vmap_and_jvp(temperature):
    """``1 / T`` overflows (or rounds to a denormal in) float32: the float64 product's
    autograd Function, in the form torch.func takes."""
    x = torch.tensor([3.0, 4.0, 0.0, -1.0], requires_grad=True)
    sk.softmax(x, temperature=temperature)[0].backward()
    got = grad(lambda v: sk.softmax(v, temperature=temperature)[0])(x.detach())
    torch.testing.assert_close(got, x.grad)
    batch = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(vmap(lambda v: sk.softmax(v, temperature=temperature))(batch),
                               sk.softmax(batch, temperature=temperature))
    tangent = torch.randn(4, generator=torch.Generator().manual_seed(5))
    _, out = jvp(lambda v: sk.softmax(v, temperature=temperature), (x.detach(),), (tangent,))
    want = torch.autograd.functional.jvp(lambda v: sk.softmax(v, temperature=temperature), x.detach(), tangent)[1]
    torch.testing.assert_close(out, want)
