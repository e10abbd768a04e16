"""Spawned gloo processes on 127.0.0.1 (2 and 3 ranks, uneven shards) against one process.

Each spawn runs many checks (see ``_workers.py``): outputs and gradients within 1e-10 in
float64 and 1e-5 in float32; cross-entropy over uneven vocabulary shards with 20% ignored
tokens; clear errors for bad input; a rank that raises does not hang the others.
"""

import pytest
import torch.distributed as dist

from ._workers import FAILURE_TIMEOUT_S, spawn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

TOL = {"float64": 1e-10, "float32": 1e-5}

TWO_RANKS = [
    # ring, zigzag layout (equal shards), one or two passes, causal or not, GQA, padding, learnable parameters
    {"check": "attention", "normalizer": "softmax", "causal": True},
    {"check": "attention", "normalizer": "softmax", "causal": True, "dtype": "float32", "shape": (1, 4, 1, 32, 16)},
    {"check": "attention", "normalizer": "ssmax", "causal": True, "learn": ("s", 0.5), "padding": True},
    {"check": "attention", "normalizer": "multimax", "params": {"r": (-1.0, 0.5, -2.0, 2.0), "t": (0.3, 0.2, 0.1, 0.1)}},
    {"check": "attention", "normalizer": "softpick", "causal": True, "padding": True},
    {"check": "attention", "normalizer": "sigmoid", "causal": True},
    {"check": "attention", "normalizer": "relu_l1", "additive": True},
    {"check": "attention", "normalizer": "adaptive_softmax", "causal": True, "shape": (1, 4, 4, 16, 8)},
    {"check": "attention", "normalizer": "clipped_softmax", "padding": True},
    {"check": "attention", "normalizer": "sa_softmax", "causal": True, "params": {"normalized": True}},
    # threshold family: delegated to Ulysses
    {"check": "attention", "normalizer": "sparsemax", "causal": True},
    {"check": "attention", "normalizer": "entmax15", "padding": True},
    # Ulysses: any normalizer, uneven head split (3 heads on 2 ranks), one key/value head
    {"check": "attention", "normalizer": "sparse_softmax", "ulysses": True, "params": {"k": 3}, "causal": True,
     "layout": "contiguous", "shape": (1, 3, 1, 12, 8)},
    {"check": "attention", "normalizer": "as_entmax", "ulysses": True, "padding": True},
    # vocabulary-parallel cross-entropy, uneven shards
    {"check": "cross_entropy", "shards": [37, 21], "label_smoothing": 0.1, "z_penalty": 1e-3, "vocab_block": 8},
    {"check": "cross_entropy", "shards": [30, 29], "reduction": "none"},
    {"check": "cross_entropy", "shards": [13, 40], "dtype": "float32"},
    {"check": "cross_entropy", "shards": [13, 40], "reduction": "sum", "label_smoothing": 0.05},
    # a tiny Llama through the Hugging Face integration, context-parallel
    {"check": "llama", "normalizer": "softpick"},
    {"check": "error", "kind": "unequal_zigzag"},
    {"check": "error", "kind": "not_distributable"},
    {"check": "error", "kind": "too_few_heads"},
    {"check": "error", "kind": "one_rank_fails"},
]

UNEVEN = [5, 7, 6]
THREE_RANKS = [
    {"check": "attention", "normalizer": "softmax", "layout": "contiguous", "lengths": UNEVEN, "causal": True,
     "shape": (2, 4, 2, 18, 8)},
    {"check": "attention", "normalizer": "softpick", "layout": "contiguous", "lengths": UNEVEN, "padding": True,
     "shape": (2, 4, 2, 18, 8)},
    {"check": "attention", "normalizer": "adaptive_softmax", "layout": "contiguous", "lengths": UNEVEN,
     "causal": True, "shape": (1, 2, 1, 18, 8)},
    {"check": "attention", "normalizer": "stablemax", "layout": "zigzag", "causal": True, "shape": (1, 2, 2, 18, 4)},
    # blocks travelling in several regions: uneven blocks with different region counts (empty
    # regions send nothing), and equal ones through the pool's spare region buffer
    {"check": "attention", "normalizer": "softmax", "layout": "contiguous", "lengths": UNEVEN, "causal": True,
     "shape": (2, 4, 2, 18, 8), "block_size": (2, 2)},
    {"check": "attention", "normalizer": "softpick", "layout": "zigzag", "causal": True, "padding": True,
     "shape": (1, 4, 2, 24, 8), "block_size": (3, 2)},
    {"check": "attention", "normalizer": "entmax15", "layout": "contiguous", "lengths": UNEVEN, "causal": True,
     "shape": (1, 4, 2, 18, 8)},
    {"check": "attention", "normalizer": "sparse_softmax", "ulysses": True, "layout": "contiguous",
     "lengths": UNEVEN, "params": {"k": 4}, "shape": (1, 4, 4, 18, 8), "padding": True},
    {"check": "cross_entropy", "shards": [11, 30, 7], "label_smoothing": 0.2, "vocab_block": 5},
    {"check": "llama", "normalizer": "entmax15", "layout": "contiguous", "length": 15},
    {"check": "error", "kind": "one_rank_fails"},
]


def _assert_close(results, cases):
    for rank, per_rank in enumerate(results):
        for case, res in zip(cases, per_rank):
            assert "crash" not in res, f"rank {rank}, case {case}:\n{res['crash']}"
            if case["check"] == "error":
                continue
            tol = TOL[case.get("dtype", "float64")]
            for label, err in res.items():
                assert err <= tol, f"rank {rank}, case {case}: max error of {label} = {err:.3g} > {tol}"


def _assert_errors(results, cases, size):
    for case_index, case in enumerate(cases):
        if case["check"] != "error":
            continue
        got = [results[r][case_index] for r in range(size)]
        kind = case["kind"]
        if kind == "unequal_zigzag":
            assert all(g["type"] == "ValueError" and "zigzag" in g["message"] for g in got), got
        elif kind == "not_distributable":
            assert all(g["type"] == "ValueError" and "ulysses_attention" in g["message"] for g in got), got
        elif kind == "too_few_heads":
            assert all(g["type"] == "ValueError" and "heads" in g["message"] for g in got), got
        elif kind == "one_rank_fails":
            assert got[-1]["type"] == "ValueError", got
            for g in got[:-1]:  # the others time out (or see the peer leave) with a clear error
                assert g["type"] == "RuntimeError" and f"rank {got.index(g)} of {size}" in g["message"], got


def test_two_ranks(tmp_path):
    results = spawn(2, TWO_RANKS, str(tmp_path))
    _assert_close(results, TWO_RANKS)
    _assert_errors(results, TWO_RANKS, 2)


def test_three_ranks_uneven(tmp_path):
    results = spawn(3, THREE_RANKS, str(tmp_path))
    _assert_close(results, THREE_RANKS)
    _assert_errors(results, THREE_RANKS, 3)


def test_failure_timeout_is_short():
    assert FAILURE_TIMEOUT_S <= 10
