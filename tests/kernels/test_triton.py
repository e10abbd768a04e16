"""Triton softmax, run by the Triton interpreter on CPU (skipped when triton is missing)."""

import os

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402


def test_triton_softmax_matches_reference_in_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from softmaxkit.kernels.gpu import softmax as gpu

    assert os.environ["TRITON_INTERPRET"] == "1"
    x = torch.randn(5, 37)
    x[1, 3] = float("-inf")
    x[2] = float("-inf")
    out = gpu.softmax(x, temperature=0.5)
    expected = torch.softmax(x / 0.5, -1)
    expected[2] = 0
    torch.testing.assert_close(out, expected)
