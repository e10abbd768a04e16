"""Shared test fixtures: parameters some normalizers need, and a seeded generator."""

import pytest
import torch

#: Parameters without a default that the registry loops must pass.
REQUIRED_PARAMS = {"sparse_softmax": {"k": 3}}


def params_for(name: str, length: int | None = None) -> dict:
    """Parameters ``name`` needs; ``k`` is capped at the row ``length`` when given."""
    params = dict(REQUIRED_PARAMS.get(name, {}))
    if "k" in params and length is not None:
        params["k"] = max(1, min(params["k"], length))
    return params


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)
