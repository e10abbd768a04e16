r"""A softmax-confidence early-exit cascade with thresholds chosen under an accuracy budget.

Berestizshevsky & Even (2018), "Dynamically sacrificing accuracy for reduced computation:
cascaded inference based on softmax confidence", arXiv 1805.10982 (ICANN 2019).

A cascade of ``K`` stages (exits of one network, or networks of growing size) answers
with the first stage whose maximum softmax probability (MSP) reaches that stage's
threshold; the last stage always answers. ``costs[k]`` is the *extra* cost (MACs) of
running stage ``k`` after stages ``0..k-1`` (its trunk block plus its exit head), so a
sample that exits at stage ``k`` costs ``costs[0] + ... + costs[k]``.

Choosing the thresholds (:meth:`EarlyExitCascade.fit`) on a calibration set of N samples
with K stages:

.. math:: \min_{t_0..t_{K-2}} \frac1N\sum_i \mathrm{cost}_i(t)
          \quad\text{s.t.}\quad \mathrm{acc}(t) \ge \mathrm{acc}_{K-1} - \delta

where :math:`\mathrm{acc}_{K-1}` is the last stage's accuracy on the same set. On a
finite set only the *exit sets* matter, and the exit set of stage ``k`` changes only when
``t_k`` crosses one of the stage's observed confidences, so the candidates for ``t_k``
are those confidences plus :math:`+\infty` (never exit): every threshold vector is
equivalent to one built from candidates. Two searches use that:

* **sweep** (one coordinate, exact): with every other threshold fixed, the samples that
  reach stage ``k`` and where each would end if it did not exit at ``k`` are fixed; sorting
  them by confidence, every candidate ``t_k`` is a prefix, and cumulative sums give the
  cost and the number correct of all of them in O(N log N). The best feasible one wins
  (ties: more correct, then the higher threshold).
* ``search="exact"``: enumerates every candidate of stages ``0..K-3`` and sweeps stage
  ``K-2``: the exact optimum on the calibration set, in
  :math:`O(\prod_{k<K-2} (n_k + 1) \cdot N \log N)` for ``n_k`` distinct confidences; for
  the common 2- and 3-stage cascades this is ``O(N log N)`` and ``O(N^2 log N)``.
* ``search="coordinate"``: starts from "every sample runs to the end" (feasible, since it
  *is* the last stage's accuracy) and sweeps each stage in turn until no sweep improves.
  Every step is exact in its coordinate and never leaves the feasible set, so the cost
  never increases; the result is a coordinate-wise optimum, not necessarily global.
* ``search="auto"`` (default): exact when at most ``max_sweeps`` sweeps are needed,
  coordinate descent otherwise.
* ``search="per_stage"``: the rule of thumb of setting each stage's threshold alone, to
  the lowest confidence at which that stage's accuracy on the calibration samples above
  it is still ``>= acc_{K-1} - delta``. It ignores how stages interact, so it neither
  guarantees the budget nor minimises the cost; kept for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real

import numpy as np
import torch

from .._checks import check_int_in_range
from ._inputs import check_labels, check_logits_2d
from .confidence import msp

SEARCHES = ("auto", "exact", "coordinate", "per_stage")
_INF = math.inf


@dataclass
class CascadeOutput:
    """What a cascade did on a batch.

    Attributes:
        predictions: (N,) class predicted by the stage each sample exited at.
        exit_stage: (N,) index of that stage.
        macs: (N,) float64, MACs spent on each sample (cumulative costs up to its exit).
        total_macs: cost of running every stage (the last stage alone, uncascaded).
    """

    predictions: torch.Tensor
    exit_stage: torch.Tensor
    macs: torch.Tensor
    total_macs: float

    @property
    def mean_macs(self) -> float:
        return float(self.macs.mean())

    @property
    def savings(self) -> float:
        """Fraction of MACs saved against always running every stage: ``1 - mean / total``."""
        return 1.0 - self.mean_macs / self.total_macs

    def accuracy(self, labels: torch.Tensor) -> float:
        """Fraction of ``predictions`` equal to ``labels``, an integer tensor of shape (N,)."""
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex() \
                or labels.dtype == torch.bool:
            got = labels.dtype if isinstance(labels, torch.Tensor) else type(labels).__name__
            raise TypeError(f"labels must be an integer tensor of class indices, got {got}")
        if labels.shape != self.predictions.shape:   # (an (N, 1) tensor broadcast to (N, N): a wrong accuracy)
            raise ValueError(f"labels must have shape {tuple(self.predictions.shape)} to match the predictions, "
                             f"got {tuple(labels.shape)}")
        return float((self.predictions == labels.to(self.predictions.device, torch.int64)).double().mean())


class EarlyExitCascade:
    """Exit at the first stage whose maximum softmax probability reaches its threshold.

    Example::

        cascade = EarlyExitCascade(costs=[2e6, 5e6, 4e7])
        cascade.fit([logits0, logits1, logits2], labels, delta=0.01)   # calibration set
        out = cascade.predict([t0, t1, t2])                             # test set
        out.accuracy(test_labels), out.savings

    Args:
        costs: extra MACs of each stage (> 0), in order.
        thresholds: optional ``K - 1`` thresholds for stages ``0..K-2`` (``inf`` = never
            exit there); otherwise set by :meth:`fit`.
    """

    def __init__(self, costs: Sequence[float], thresholds: Sequence[float] | None = None):
        if isinstance(costs, (torch.Tensor, np.ndarray)):
            costs = costs.tolist()
        if not isinstance(costs, Sequence) or len(costs) == 0:
            raise TypeError(f"costs must be a non-empty sequence of numbers, got {costs!r}")
        for c in costs:
            if isinstance(c, bool) or not isinstance(c, Real) or not (c > 0 and math.isfinite(c)):
                raise ValueError(f"costs must be finite numbers > 0 (MACs of each stage), got {list(costs)}")
        self.costs = [float(c) for c in costs]
        self.cumulative_costs = np.cumsum(self.costs)
        self.thresholds_: list[float] | None = None
        self.search_: str | None = None
        if thresholds is not None:
            self.thresholds_ = self._check_thresholds(thresholds)

    @property
    def num_stages(self) -> int:
        return len(self.costs)

    # ------------------------------------------------------------------ public
    def fit(self, stage_logits: Sequence[torch.Tensor], labels: torch.Tensor, delta: float = 0.01,
            search: str = "auto", max_sweeps: int = 20000) -> EarlyExitCascade:
        """Choose the thresholds on a calibration set (see the module docstring).

        Args:
            stage_logits: ``K`` tensors of shape (N, C), one per stage.
            labels: (N,) class indices.
            delta: accuracy budget in [0, 1] (0.01 = one percentage point).
            search: ``"auto"``, ``"exact"``, ``"coordinate"`` or ``"per_stage"``.
            max_sweeps: the largest exact enumeration ``"auto"`` accepts.
        """
        if isinstance(delta, bool) or not isinstance(delta, Real) or not 0 <= delta <= 1:
            raise ValueError(f"delta must be a number in [0, 1] (an accuracy drop), got {delta!r}")
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {', '.join(map(repr, SEARCHES))}, got {search!r}")
        max_sweeps = check_int_in_range(max_sweeps, "max_sweeps", 1)
        conf, pred, num_classes = self._stage_confidences(stage_logits)
        y = check_labels(labels, conf.shape[1], num_classes).cpu().numpy()
        problem = _Problem(conf, pred == y[None, :], self.cumulative_costs, float(delta))
        if search == "auto":
            search = "exact" if problem.exact_sweeps() <= max_sweeps else "coordinate"
        solve = {"exact": problem.exact, "coordinate": problem.coordinate, "per_stage": problem.per_stage}[search]
        self.thresholds_ = [float(t) for t in solve()]
        self.search_ = search
        return self

    def predict(self, stage_logits: Sequence[torch.Tensor]) -> CascadeOutput:
        """Run the cascade on precomputed per-stage logits and account for the MACs spent."""
        if self.thresholds_ is None:
            raise RuntimeError("EarlyExitCascade has no thresholds: call fit(...) or pass thresholds=")
        conf, pred, _ = self._stage_confidences(stage_logits)
        stage = _exit_stage(conf, self.thresholds_)
        rows = np.arange(conf.shape[1])
        return CascadeOutput(
            predictions=torch.as_tensor(pred[stage, rows]),
            exit_stage=torch.as_tensor(stage),
            macs=torch.as_tensor(self.cumulative_costs[stage], dtype=torch.float64),
            total_macs=float(self.cumulative_costs[-1]),
        )

    def run(self, x: torch.Tensor, stages: Sequence[Callable]) -> CascadeOutput:
        """Run a real cascade: stage ``k`` only sees the rows that have not exited yet.

        ``stages[k]`` is a callable ``state -> (next_state, logits)``; the first state is
        ``x`` and each state's first axis indexes the rows still running (for a network with
        exits, the state is the trunk's hidden activation). Gives the same answers as
        :meth:`predict` on every stage's logits, without computing the stages nobody reaches.
        """
        if self.thresholds_ is None:
            raise RuntimeError("EarlyExitCascade has no thresholds: call fit(...) or pass thresholds=")
        if not isinstance(stages, Sequence) or len(stages) != self.num_stages or not all(map(callable, stages)):
            raise TypeError(f"stages must be a sequence of {self.num_stages} callables state -> (state, logits)")
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise TypeError("x must be a tensor whose first axis indexes the inputs")
        n = x.shape[0]
        predictions = torch.zeros(n, dtype=torch.long)
        exit_stage = torch.zeros(n, dtype=torch.long)
        running = torch.arange(n)
        state = x
        for k, stage in enumerate(stages):
            result = stage(state)
            if not isinstance(result, tuple) or len(result) != 2:
                got = type(result).__name__ + (f" of {len(result)}" if isinstance(result, tuple) else "")
                raise TypeError(f"stages[{k}] must return a pair (next_state, logits), got {got}")
            state, logits = result
            check_logits_2d(logits, f"the logits of stages[{k}]")
            if logits.shape[0] != len(running):
                raise ValueError(
                    f"stages[{k}] returned {logits.shape[0]} rows of logits for {len(running)} running inputs")
            z = logits.detach().to(torch.float64)
            done = (msp(z) >= self.thresholds_[k] if k < self.num_stages - 1
                    else torch.ones(len(running), dtype=torch.bool))
            done = done.cpu()
            predictions[running[done]] = z.argmax(1).cpu()[done]
            exit_stage[running[done]] = k
            running = running[~done]
            if len(running) == 0:
                break
            state = state[~done.to(state.device)]
        return CascadeOutput(
            predictions=predictions, exit_stage=exit_stage,
            macs=torch.as_tensor(self.cumulative_costs[exit_stage.numpy()], dtype=torch.float64),
            total_macs=float(self.cumulative_costs[-1]),
        )

    # ----------------------------------------------------------------- helpers
    def _check_thresholds(self, thresholds) -> list[float]:
        if isinstance(thresholds, (torch.Tensor, np.ndarray)):
            thresholds = thresholds.tolist()
        if isinstance(thresholds, (str, bytes)) or not isinstance(thresholds, Sequence):
            raise TypeError(f"thresholds must be a sequence of {self.num_stages - 1} numbers (one per stage but "
                            f"the last), got {type(thresholds).__name__}")
        values = list(thresholds)
        if len(values) != self.num_stages - 1:
            raise ValueError(f"thresholds must have {self.num_stages - 1} values (one per stage but the last), "
                             f"got {len(values)}")
        for t in values:
            if isinstance(t, bool) or not isinstance(t, Real) or math.isnan(t):
                raise ValueError(f"thresholds must be numbers (inf = never exit), got {values}")
        return [float(t) for t in values]

    def _stage_confidences(self, stage_logits) -> tuple[np.ndarray, np.ndarray, int]:
        """(K, N) MSP confidences, (K, N) predictions and the number of classes."""
        if isinstance(stage_logits, torch.Tensor) or not isinstance(stage_logits, Sequence):
            raise TypeError("stage_logits must be a list with one (N, C) tensor per stage")
        if len(stage_logits) != self.num_stages:
            raise ValueError(
                f"stage_logits must have one tensor per stage ({self.num_stages}), got {len(stage_logits)}")
        shape = None
        conf, pred = [], []
        for k, z in enumerate(stage_logits):
            check_logits_2d(z, f"stage_logits[{k}]")
            if shape is not None and z.shape != shape:
                raise ValueError(f"stage_logits[{k}] has shape {tuple(z.shape)}, stage 0 has {tuple(shape)}")
            shape = z.shape
            z64 = z.detach().to(torch.float64)
            conf.append(msp(z64).cpu().numpy())
            pred.append(z64.argmax(1).cpu().numpy())
        assert shape is not None  # one tensor per stage, and a cascade has at least one
        return np.stack(conf), np.stack(pred), shape[1]


def _exit_stage(conf: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """Index of the first stage whose confidence reaches its threshold (the last otherwise)."""
    k_last = conf.shape[0] - 1
    stage = np.full(conf.shape[1], k_last)
    undecided = np.ones(conf.shape[1], dtype=bool)
    for k, t in enumerate(thresholds):
        hit = undecided & (conf[k] >= t)
        stage[hit] = k
        undecided &= ~hit
    return stage


class _Problem:
    """The calibration-set optimisation: costs and correctness of every (stage, sample)."""

    def __init__(self, conf: np.ndarray, correct: np.ndarray, cumulative_costs: np.ndarray, delta: float):
        self.conf, self.correct, self.cum = conf, correct.astype(np.int64), cumulative_costs
        self.K, self.N = conf.shape
        self.rows = np.arange(self.N)
        # counts are integers; the tolerance only absorbs the rounding of delta * N
        self.required = self.correct[-1].sum() - delta * self.N - 1e-9
        self.target_accuracy = self.correct[-1].mean() - delta

    def evaluate(self, thresholds) -> tuple[float, int]:
        stage = _exit_stage(self.conf, thresholds)
        return float(self.cum[stage].sum()), int(self.correct[stage, self.rows].sum())

    def sweep(self, k: int, thresholds: list[float]):
        """Best feasible ``t_k`` with the others fixed: ``(cost, correct, t)`` or None."""
        others = list(thresholds)
        others[k] = _INF
        stage = _exit_stage(self.conf, others)
        base_cost = self.cum[stage].sum()
        base_correct = self.correct[stage, self.rows].sum()
        reach = np.flatnonzero(stage > k)
        c = self.conf[k, reach]
        order = np.argsort(-c, kind="stable")
        c, reach = c[order], reach[order]
        gained_cost = self.cum[k] - self.cum[stage[reach]]
        gained_correct = self.correct[k, reach] - self.correct[stage[reach], reach]
        ends = np.flatnonzero(np.r_[c[1:] != c[:-1], True]) if len(c) else np.zeros(0, dtype=np.int64)
        cost = base_cost + np.r_[0.0, np.cumsum(gained_cost)[ends]]
        correct = base_correct + np.r_[0, np.cumsum(gained_correct)[ends]]
        candidates = np.r_[_INF, c[ends]]
        feasible = np.flatnonzero(correct >= self.required)
        if len(feasible) == 0:
            return None
        # lexsort: last key first -> min cost, then max correct, then the earliest (highest) threshold
        best = feasible[np.lexsort((feasible, -correct[feasible], cost[feasible]))[0]]
        return float(cost[best]), int(correct[best]), float(candidates[best])

    def _candidates(self, k: int, thresholds: list[float]) -> np.ndarray:
        earlier = list(thresholds[:k]) + [_INF] * (self.K - 1 - k)
        reach = _exit_stage(self.conf, earlier) >= k
        return np.r_[_INF, np.unique(self.conf[k, reach])[::-1]]

    def exact_sweeps(self) -> int:
        count = 1
        for k in range(self.K - 2):
            count *= len(np.unique(self.conf[k])) + 1
        return count

    def exact(self) -> list[float]:
        if self.K == 1:
            return []
        best: list = [None, None]   # (cost, -correct), thresholds

        def search(k: int, thresholds: list[float]) -> None:
            if k == self.K - 2:
                found = self.sweep(k, thresholds)
                if found is not None:
                    key = (found[0], -found[1])
                    if best[0] is None or key < best[0]:
                        best[0], best[1] = key, thresholds[:k] + [found[2]]
                return
            for t in self._candidates(k, thresholds):
                search(k + 1, thresholds[:k] + [float(t)] + [_INF] * (self.K - 2 - k))

        search(0, [_INF] * (self.K - 1))
        return best[1]

    def coordinate(self, max_rounds: int = 50) -> list[float]:
        thresholds = [_INF] * (self.K - 1)
        current = self.evaluate(thresholds)
        for _ in range(max_rounds):
            improved = False
            for k in range(self.K - 1):
                found = self.sweep(k, thresholds)
                if found is not None and (found[0], -found[1]) < (current[0], -current[1]):
                    thresholds[k] = found[2]
                    current = (found[0], found[1])
                    improved = True
            if not improved:
                break
        return thresholds

    def per_stage(self) -> list[float]:
        thresholds = []
        for k in range(self.K - 1):
            order = np.argsort(-self.conf[k], kind="stable")
            c = self.conf[k, order]
            ends = np.flatnonzero(np.r_[c[1:] != c[:-1], True])
            accuracy = np.cumsum(self.correct[k, order])[ends] / (ends + 1)
            ok = np.flatnonzero(accuracy >= self.target_accuracy - 1e-12)
            thresholds.append(float(c[ends[ok[-1]]]) if len(ok) else _INF)
        return thresholds
