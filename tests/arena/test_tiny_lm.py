"""Arena c: the tiny LM's data, model pieces and metrics at tiny sizes."""

import math
import os
from pathlib import Path

import pytest
import torch

from softmaxkit import nn as sknn
from softmaxkit.arena import tiny_lm

TINY = tiny_lm.Config(context=16, width=16, heads=2, layers=2, steps=4, batch=4, corpus_bytes=60_000,
                      eval_windows=4)


def test_corpus_is_the_standard_library_in_sorted_order():
    files = tiny_lm.corpus_files()
    assert files == sorted(files) and all(f.parent == Path(os.__file__).parent for f in files)
    tokens = tiny_lm.load_corpus(5000)
    assert len(tokens) == 5000 and tokens.dtype == torch.int64
    assert bytes(tokens.tolist()) == files[0].read_bytes()[:5000] or len(files[0].read_bytes()) < 5000
    assert torch.equal(tokens, tiny_lm.load_corpus(5000))
    train, val = tiny_lm.split(tokens, 0.1)
    assert len(train) == 4500 and torch.equal(torch.cat([train, val]), tokens)


def test_rotary_scores_depend_only_on_the_offset():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 8), torch.randn(1, 8)
    seq_q = tiny_lm.rotary(q.expand(6, 8).clone())
    seq_k = tiny_lm.rotary(k.expand(6, 8).clone())
    scores = seq_q @ seq_k.T
    assert torch.allclose(scores[3, 1], scores[5, 3], atol=1e-5)
    assert torch.allclose(seq_q.norm(dim=-1), q.norm().expand(6), atol=1e-5)


def test_dense_attention_is_causal_and_normalised():
    q, k, v = (torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    out, weights = tiny_lm.attend(q, k, v, sknn.Normalizer("softmax"), keep_weights=True)
    assert out.shape == (2, 3, 5, 4)
    assert torch.all(weights.triu(1) == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5))


def test_fake_quantise_uses_at_most_2_to_the_bits_levels_per_row():
    model = tiny_lm.build("softmax", TINY, seed=0)
    quantised = tiny_lm.fake_quantise(model, 4)
    w = quantised.blocks[0].qkv.weight
    assert max(len(row.unique()) for row in w) <= 15
    assert torch.equal(model.embed.weight, quantised.embed.weight)  # only linear layers
    assert not torch.equal(model.blocks[0].qkv.weight, w)


def test_sink_rate_counts_heads_that_dump_weight_on_the_first_token(monkeypatch):
    model = tiny_lm.build("softmax", TINY, seed=0)
    windows = tiny_lm.fixed_windows(tiny_lm.load_corpus(10_000), 2, 16)

    def sink_on_head_zero(q, k, v, normalizer, keep_weights=False):
        weights = torch.full(q.shape[:-1] + (q.shape[-2],), 0.0)
        weights[:, 0, :, 0] = 1.0                      # head 0: everything on the first token
        weights[:, 1] = torch.eye(q.shape[-2])         # head 1: on itself
        return weights @ v, weights

    monkeypatch.setattr(tiny_lm, "attend", sink_on_head_zero)
    stats = tiny_lm.attention_stats(model, windows)
    assert stats["sink rate"] == 0.5
    assert stats["zero weights"] == pytest.approx(1 - 2 * 16 / (16 * 17))  # 2 nonzeros per query row pair


@pytest.mark.parametrize("name", ["softmax", "sparsemax"])
def test_run_one_reports_every_metric(name):
    result = tiny_lm.run_one(name, TINY, seed=0)
    assert set(tiny_lm.METRICS) <= set(result)
    assert all(math.isfinite(result[m]) for m in tiny_lm.METRICS)
    assert result["val loss"] < math.log(256) + 0.5
    if name == "softmax":
        assert result["zero weights"] == 0.0
    else:
        assert result["zero weights"] > 0.0


def test_run_skips_unfinished_normalizer(monkeypatch):
    real = tiny_lm.run_one

    def unfinished(normalizer, cfg, seed):
        if normalizer == "entmax15":
            return "not implemented yet: entmax15 is being written"
        return real(normalizer, cfg, seed)

    monkeypatch.setattr(tiny_lm, "run_one", unfinished)
    [table] = tiny_lm.run(config=TINY, normalizers=("softmax", "entmax15"), workers=1, show_progress=False)
    rows = {row[0]: row for row in table.rows}
    assert rows["entmax15"][1] == "skipped" and "entmax15 is being written" in table.notes
    assert isinstance(rows["softmax"][1], float) and table.figures


@pytest.mark.parametrize("name", ["ssmax", "multimax", "softpick"])
def test_softmaxkit_attention_path_matches_the_dense_path(name, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=gen) for _ in range(3))
    norm = sknn.Normalizer(name, param_shape=(3, 1, 1))
    dense, _ = tiny_lm.attend(q, k, v, norm, keep_weights=True)
    monkeypatch.setattr(tiny_lm, "USE_SOFTMAXKIT_ATTENTION", True)
    fast, weights = tiny_lm.attend(q, k, v, norm)
    assert weights is None and torch.allclose(fast, dense, atol=1e-5)
