"""Fixtures shared by the normalizer tests."""

import pytest
import torch


@pytest.fixture
def x():
    return torch.randn(6, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2
