"""Triton softmax: compiled on CUDA, or run by the Triton interpreter on CPU (``tests/conftest.py``
sets ``TRITON_INTERPRET=1`` before triton is imported when there is no GPU)."""

import os

import pytest

pytest.importorskip("triton")

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


def test_interpreter_is_active_without_gpu():
    if DEVICE == "cuda":
        pytest.skip("a GPU runs the kernels compiled")
    import triton

    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert triton.knobs.runtime.interpret


def test_triton_softmax_matches_reference():
    from softmaxkit.kernels.gpu import softmax as gpu

    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    x[1, 3] = float("-inf")
    x[2] = float("-inf")
    out = gpu.softmax(x, temperature=0.5)
    expected = torch.softmax(x / 0.5, -1)
    expected[2] = 0
    torch.testing.assert_close(out, expected)
