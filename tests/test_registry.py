"""The registry, normalize(), and the README table generated from it."""

from pathlib import Path

import pytest
import torch

import softmaxkit as sk
from softmaxkit import registry

README = Path(__file__).resolve().parents[1] / "README.md"
DESIGN_NAMES = ["softmax", "adaptive_softmax", "ssmax", "sa_softmax", "multimax", "sparse_softmax",
                "sparsemax", "entmax15", "entmax", "as_entmax", "softpick", "stablemax",
                "clipped_softmax", "sigmoid", "relu", "relu_l1", "softplus_l1"]


def test_every_design_name_is_registered_in_the_design_order():
    assert registry.names()[: len(DESIGN_NAMES)] == DESIGN_NAMES
    assert [s.name for s in sk.normalizers()] == registry.names()


def test_specs_are_complete():
    for spec in sk.normalizers():
        assert isinstance(spec, sk.NormalizerSpec)
        assert spec.formula and spec.reference
        assert spec.streaming in ("one pass", "2 passes", "threshold search", "dense")
        assert set(spec.learnable) <= set(spec.params)
    streamable = {s.name for s in sk.normalizers() if s.streamable}
    assert set(DESIGN_NAMES) - streamable == {"sparse_softmax"}  # DESIGN.md's streamable list


def test_normalize_dispatches_to_the_registered_function():
    x = torch.randn(3, 5)
    torch.testing.assert_close(sk.normalize(x, "softpick", eps=1e-3), sk.softpick(x, eps=1e-3))
    torch.testing.assert_close(sk.normalize(x, "softmax", dim=0), torch.softmax(x, 0))


def test_registering_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        sk.register_normalizer("softmax", family="elementwise", h=torch.relu, dh=torch.sign)


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match="name must be a str"):
        sk.normalize(torch.randn(3), 3)
