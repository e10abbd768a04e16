"""softmaxkit.arena: small experiments that test published claims about normalizers.

Each task is a module ``softmaxkit.arena.<task>`` exposing ``CLAIM: str`` and
``run(quick=False, seed=0) -> list[Table]``; each table carries the claim it tests and
a verdict saying what was measured, matching the claim or not. Fixed seeds throughout.

Run them with ``softmaxkit arena [TASK ...] [--quick]``. A task whose subject is not
installed yet is reported as skipped with the reason.
"""

from __future__ import annotations

from .._plugins import Outcome, expand_names
from .._plugins import run as _run_producer

TASKS: dict[str, str] = {
    "dispersion": "a. weight on a planted maximum among n = 16 ... 65536 logits (analytic)",
    "max_retrieval": "b. one attention layer trained on <= 16 items, tested on up to 4096",
    "tiny_lm": "c. 2-layer byte-level decoder on the standard library's .py files, one run per normalizer",
    "ood": "d. OOD detection, calibration and early exit on scikit-learn's digits",
    "soft_nms": "e. Soft-NMS against NMS, AP@0.5 on synthetic crowded scenes",
    "negation": "f. MaxSim against Signed MaxSim, nDCG@10 on negation queries",
    "linear": "g. linear / softmax-free attention: error vs exact attention, InLine's and MALA's claims",
}

__all__ = ["TASKS", "run_task", "run"]


def check_tasks(names) -> list[str]:
    """``names`` in order (all tasks when empty); ``ValueError`` naming the accepted tasks."""
    return expand_names(names, TASKS, "arena task")


def run_task(name: str, quick: bool = False, seed: int = 0) -> Outcome:
    """Run one task; a missing or unfinished task comes back as skipped with the reason."""
    check_tasks([name])
    return _run_producer("arena", name, f"{__name__}.{name}", lambda module: module.run(quick=quick, seed=seed))


def run(tasks=(), quick: bool = False, seed: int = 0) -> list[Outcome]:
    """Run ``tasks`` (all when empty) in order."""
    return [run_task(name, quick=quick, seed=seed) for name in check_tasks(tasks)]
