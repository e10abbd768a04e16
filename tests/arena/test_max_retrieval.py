"""Arena b: max-retrieval at tiny sizes."""

import torch

from softmaxkit.arena import max_retrieval as mr

TINY = mr.Config(train_sizes=(2, 4), test_sizes=(4, 16), classes=4, width=16, steps=80, batch=32, lr=2e-2,
                 test_sets=128)


def test_sample_targets_the_class_of_the_largest_visible_priority():
    gen = torch.Generator().manual_seed(0)
    priority, labels, mask, target = mr.sample(50, 8, 5, gen, min_items=2)
    for i in range(50):
        visible = mask[i].nonzero().flatten()
        best = visible[priority[i, visible].argmax()]
        assert target[i] == labels[i, best]
    assert mask.sum(1).min() >= 2


def test_training_learns_well_above_chance_and_is_deterministic():
    model = mr.train("softmax", TINY, seed=0)
    first = mr.accuracy(model, 4, TINY, seed=0)
    assert first > 0.6  # chance is 0.25
    short = mr.Config(**{**TINY.__dict__, "steps": 3})
    assert mr.accuracy(mr.train("softmax", short, seed=1), 4, short, seed=0) == \
        mr.accuracy(mr.train("softmax", short, seed=1), 4, short, seed=0)


def test_run_table_with_inference_only_normalizer_and_learned_parameters():
    normalizers = (("softmax", "softmax", None), ("adaptive_softmax (at inference)", "softmax", "adaptive_softmax"),
                   ("ssmax", "ssmax", None))
    cfg = mr.Config(train_sizes=(2, 4), test_sizes=(4, 16), classes=3, width=8, steps=5, batch=16, test_sets=16)
    results, skipped, learned = mr.measure(cfg, seed=0, normalizers=normalizers, workers=1)
    assert list(results) == ["softmax", "adaptive_softmax (at inference)", "ssmax"] and not skipped
    assert all(0.0 <= a <= 1.0 for values in results.values() for a in values)
    assert learned["ssmax"].startswith("s=") and "softmax" not in learned


def test_run_returns_table_with_claim_and_plot(monkeypatch):
    monkeypatch.setattr(mr, "NORMALIZERS", (("softmax", "softmax", None),))
    cfg = mr.Config(train_sizes=(2, 4), test_sizes=(4, 8), classes=3, width=8, steps=3, batch=8, test_sets=8)
    [table] = mr.run(config=cfg, workers=1, show_progress=False)
    assert table.columns == ["normalizer", "4 items", "8 items", "learned parameters"]
    assert table.claim == mr.CLAIM and table.verdict and table.figures


def test_a_broken_normalizer_fails_alone(monkeypatch):
    real = mr.train

    def train(name, cfg, seed):
        if name == "ssmax":
            raise RuntimeError("kernel exploded")
        return real(name, cfg, seed)

    monkeypatch.setattr(mr, "train", train)
    normalizers = (("softmax", "softmax", None), ("ssmax", "ssmax", None))
    monkeypatch.setattr(mr, "NORMALIZERS", normalizers)
    cfg = mr.Config(train_sizes=(2, 4), test_sizes=(4,), classes=3, width=8, steps=2, batch=8, test_sets=8)
    [table] = mr.run(config=cfg, workers=1, show_progress=False)
    rows = {row[0]: row for row in table.rows}
    assert rows["ssmax"][1] == "failed" and "ssmax: failed: RuntimeError: kernel exploded" in table.notes
    assert isinstance(rows["softmax"][1], float)
