"""EarlyExitCascade: threshold search against brute force and by hand."""

import itertools
import math

import numpy as np
import pytest
import torch

from softmaxkit.scores import EarlyExitCascade


def _binary_logits(conf, predicted):
    """Logits whose softmax puts ``conf`` on class ``predicted`` (two classes)."""
    margin = torch.log(torch.tensor(conf, dtype=torch.float64) / (1 - torch.tensor(conf, dtype=torch.float64)))
    z = torch.zeros(len(conf), 2, dtype=torch.float64)
    z[torch.arange(len(conf)), torch.tensor(predicted)] = margin
    return z


# stage 0 confidences .9 .8 .7 .6 on class 0, right except the third; stage 1 always right
LABELS = torch.tensor([0, 0, 1, 0])
STAGES = [_binary_logits([0.9, 0.8, 0.7, 0.6], [0, 0, 0, 0]), _binary_logits([0.99] * 4, [0, 0, 1, 0])]


@pytest.mark.parametrize("search", ["exact", "coordinate", "auto"])
def test_two_stages_by_hand(search):
    cascade = EarlyExitCascade([1, 10]).fit(STAGES, LABELS, delta=0.0, search=search)
    assert cascade.thresholds_ == pytest.approx([0.8])       # exits the two sure, right ones
    out = cascade.predict(STAGES)
    assert out.exit_stage.tolist() == [0, 0, 1, 1]
    assert out.macs.tolist() == [1, 1, 11, 11]
    assert out.mean_macs == 6 and out.savings == pytest.approx(1 - 6 / 11)
    assert out.accuracy(LABELS) == 1.0
    # a budget of one mistake in four lets everyone leave at stage 0
    loose = EarlyExitCascade([1, 10]).fit(STAGES, LABELS, delta=0.25, search=search)
    assert loose.thresholds_ == pytest.approx([0.6]) and loose.predict(STAGES).mean_macs == 1


def test_per_stage_rule_by_hand():
    # accuracy of stage 0 above t: .9 -> 1, .8 -> 1, .7 -> 2/3, .6 -> 3/4
    assert EarlyExitCascade([1, 10]).fit(STAGES, LABELS, 0.0, "per_stage").thresholds_ == pytest.approx([0.8])
    assert EarlyExitCascade([1, 10]).fit(STAGES, LABELS, 0.25, "per_stage").thresholds_ == pytest.approx([0.6])


def _random_problem(seed, n=24, k=3, c=3):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, c, (n,), generator=gen)
    stages = []
    for stage in range(k):
        z = torch.randn(n, c, generator=gen, dtype=torch.float64)
        z[torch.arange(n), labels] += 0.8 * stage + 0.5     # later stages more accurate
        stages.append(torch.round(z * 2) / 2)                # ties in confidences
    return stages, labels


def _brute_force(stages, labels, costs, delta):
    conf = np.stack([torch.softmax(z, 1).amax(1).numpy() for z in stages])
    correct = np.stack([(z.argmax(1) == labels).numpy() for z in stages])
    cum = np.cumsum(costs)
    required = correct[-1].sum() - delta * len(labels) - 1e-9
    best = math.inf
    options = [np.r_[np.unique(conf[k]), math.inf] for k in range(len(stages) - 1)]
    for thresholds in itertools.product(*options):
        stage = np.full(len(labels), len(stages) - 1)
        for k in reversed(range(len(thresholds))):
            stage[conf[k] >= thresholds[k]] = k
        if correct[stage, np.arange(len(labels))].sum() >= required:
            best = min(best, cum[stage].sum())
    return best / len(labels)


@pytest.mark.parametrize("seed", range(4))
def test_exact_search_matches_brute_force(seed):
    stages, labels = _random_problem(seed)
    costs = [1.0, 3.0, 10.0]
    for delta in (0.0, 0.05, 0.2):
        want = _brute_force(stages, labels, costs, delta)
        exact = EarlyExitCascade(costs).fit(stages, labels, delta=delta, search="exact")
        out = exact.predict(stages)
        assert out.mean_macs == pytest.approx(want)
        last = (stages[-1].argmax(1) == labels).double().mean().item()
        assert out.accuracy(labels) >= last - delta - 1e-12
        coord = EarlyExitCascade(costs).fit(stages, labels, delta=delta, search="coordinate").predict(stages)
        assert coord.accuracy(labels) >= last - delta - 1e-12
        assert want - 1e-12 <= coord.mean_macs <= 14.0   # never above running every stage


def test_four_stages_auto_uses_coordinate_when_large():
    stages, labels = _random_problem(7, n=60, k=4)
    cascade = EarlyExitCascade([1, 2, 4, 8]).fit(stages, labels, delta=0.05, max_sweeps=10)
    assert cascade.search_ == "coordinate" and len(cascade.thresholds_) == 3
    exact = EarlyExitCascade([1, 2, 4, 8]).fit(stages, labels, delta=0.05, search="exact")
    assert exact.predict(stages).mean_macs <= cascade.predict(stages).mean_macs + 1e-12


def test_bad_input():
    with pytest.raises(ValueError, match="costs"):
        EarlyExitCascade([1, -2])
    with pytest.raises(TypeError, match="costs"):
        EarlyExitCascade(5)
    with pytest.raises(ValueError, match="thresholds"):
        EarlyExitCascade([1, 2], thresholds=[0.5, 0.5])
    cascade = EarlyExitCascade([1, 10])
    with pytest.raises(RuntimeError, match="fit"):
        cascade.predict(STAGES)
    with pytest.raises(ValueError, match="delta"):
        cascade.fit(STAGES, LABELS, delta=1.5)
    with pytest.raises(ValueError, match="search"):
        cascade.fit(STAGES, LABELS, search="greedy")
    with pytest.raises(ValueError, match="stage_logits"):
        cascade.fit(STAGES[:1], LABELS)
    with pytest.raises(ValueError, match=r"stage_logits\[1\]"):
        cascade.fit([STAGES[0], STAGES[1][:2]], LABELS)
    with pytest.raises(ValueError, match="labels"):
        cascade.fit(STAGES, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(TypeError, match="stage_logits"):
        cascade.fit(torch.stack(STAGES), LABELS)


def test_run_matches_predict_and_skips_exited_rows():
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    blocks = [torch.nn.Linear(6, 6).double() for _ in range(3)]
    heads = [torch.nn.Linear(6, 4).double() for _ in range(3)]
    seen = []

    def make_stage(block, head):
        def stage(h):
            seen.append(h.shape[0])
            h = torch.relu(block(h))
            return h, 3 * head(h)
        return stage

    stages = [make_stage(b, h) for b, h in zip(blocks, heads)]
    x = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        all_logits, h = [], x
        for stage in stages:
            h, z = stage(h)
            all_logits.append(z)
    labels = all_logits[-1].argmax(1)
    cascade = EarlyExitCascade([1, 1, 1]).fit(all_logits, labels, delta=0.1)
    seen.clear()
    with torch.no_grad():
        lazy = cascade.run(x, stages)
    eager = cascade.predict(all_logits)
    assert torch.equal(lazy.predictions, eager.predictions) and torch.equal(lazy.exit_stage, eager.exit_stage)
    assert lazy.mean_macs == eager.mean_macs
    reached = [int((eager.exit_stage >= k).sum()) for k in range(3)]
    assert seen == reached[: len(seen)] and reached[0] == 50 and reached[1] < 50
    with pytest.raises(TypeError, match="stages"):
        cascade.run(x, stages[:2])
    logits_only = [lambda h, s=s: s(h)[1] for s in stages]   # a stage that forgets the next state
    with pytest.raises(TypeError, match=r"stages\[0\] must return a pair \(next_state, logits\), got Tensor"):
        cascade.run(x, logits_only)


def test_accuracy_and_thresholds_check_their_arguments():
    """Hostile sweep: accuracy(labels[:, None]) broadcast (N,) against (N, 1) and returned a wrong
    accuracy; a list or a short tensor raised AttributeError / RuntimeError; thresholds=0.5 raised
    "'float' object is not iterable", and a tensor of thresholds was refused (costs takes one)."""
    cascade = EarlyExitCascade(costs=[1.0, 2.0], thresholds=[0.6])
    logits = [torch.tensor([[2.0, 0.0], [0.0, 0.1], [0.0, 3.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])]
    labels = torch.tensor([0, 1, 1])
    out = cascade.predict(logits)
    assert out.accuracy(labels) == 1.0
    assert out.accuracy(labels.to(torch.uint8)) == 1.0
    with pytest.raises(ValueError, match="labels must have shape"):
        out.accuracy(labels[:, None])
    with pytest.raises(ValueError, match="labels must have shape"):
        out.accuracy(labels[:2])
    with pytest.raises(TypeError, match="labels"):
        out.accuracy([0, 1, 1])
    with pytest.raises(TypeError, match="labels"):
        out.accuracy(labels.float())
    with pytest.raises(TypeError, match="thresholds must be a sequence"):
        EarlyExitCascade(costs=[1.0, 2.0], thresholds=0.5)
    assert EarlyExitCascade(costs=[1.0, 2.0], thresholds=torch.tensor([0.5])).thresholds_ == [0.5]
    assert EarlyExitCascade(costs=[1.0, 2.0], thresholds=np.array([0.5])).thresholds_ == [0.5]
