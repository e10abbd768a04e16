"""Checks every normalizer's test module runs on its own spec: the examples it carries, and
that each elementwise piece's derivative is the derivative of the piece."""

import math

import torch

import softmaxkit as sk
from softmaxkit import forms
from tests.conftest import learnable_tensors


def check_examples(name: str) -> None:
    """``normalize(example.x, name, **example.params) == example.expected``, float64 and float32."""
    spec = sk.registry.get(name)
    assert spec.examples or spec.user, f"{name} carries no examples"
    for example in spec.examples:
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
            x = torch.tensor(example.x, dtype=dtype)
            out = sk.normalize(x, name, **example.params)
            expected = torch.tensor(example.expected, dtype=dtype)
            torch.testing.assert_close(out, expected, rtol=0, atol=tol, msg=f"{name} {example}")
            batch = sk.normalize(torch.stack([x, x]), name, **example.params)
            torch.testing.assert_close(batch, torch.stack([expected, expected]), rtol=0, atol=tol)


def _piece_args(spec, piece) -> dict:
    values = dict(spec.params)
    values.update(learnable_tensors(spec.name))
    for pname in forms.piece_parameters(piece):
        if pname not in values and pname not in spec.params:
            values[pname] = 0.7  # a statistic the normalizer computes itself (adaptive beta, softpick's shift)
    return values


def check_pieces(name: str) -> None:
    """``dg`` (``dh``) equals the autograd derivative of ``g`` (``h``) at random scores."""
    spec = sk.registry.get(name)
    if spec.form is None:
        return
    piece, derivative = spec.form.pieces()
    x = torch.linspace(-3.1, 2.9, 41, dtype=torch.float64).requires_grad_()
    params = _piece_args(spec, piece)
    count = torch.tensor(float(x.numel()), dtype=torch.float64)
    value = forms.call(piece, x, params, count)
    assert value.shape == x.shape and bool(torch.isfinite(value).all()), name
    (grad,) = torch.autograd.grad(value.sum(), x)
    expected = forms.call(derivative, x.detach(), params, count)
    torch.testing.assert_close(expected.expand_as(grad), grad, rtol=1e-10, atol=1e-12, msg=name)


def check_form_matches_reference(name: str) -> None:
    """The form, computed generically, equals the reference on finite rows (masked too)."""
    spec = sk.registry.get(name)
    if spec.form is None or getattr(spec.form, "passes", 1) != 1 or getattr(spec.form, "signed", False):
        return
    from softmaxkit.normalizers._generic import from_form

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2
    mask = torch.rand(4, 9, generator=gen) > 0.3
    params = {**spec.params, **learnable_tensors(name)}
    sizes = {p.name: p.size for p in spec.param_specs}
    expected = sk.normalize(x, name, mask=mask, **params)
    torch.testing.assert_close(from_form(spec.form, x, -1, mask, params, sizes), expected, rtol=1e-9, atol=1e-12)


def check_spec(name: str) -> None:
    check_examples(name)
    check_pieces(name)
    check_form_matches_reference(name)
    assert math.isfinite(len(sk.registry.get(name).formula))
