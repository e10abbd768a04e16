"""softmaxkit.bench: speed and memory of softmaxkit against torch and peer packages.

Each suite is a module ``softmaxkit.bench.<suite>`` exposing ``run(quick=False) ->
list[Table]``; every figure in it is a ratio to a baseline measured in the same run
(torch, a peer package such as ``entmax`` or ``ensemble-boxes``, or a plain copy of the
same bytes), as medians over repeated runs (:mod:`softmaxkit.bench._measure`).

Run them with ``softmaxkit bench [SUITE ...] [--quick]`` or ``python -m softmaxkit.bench``.
A suite that is not installed yet is reported as skipped with the reason.
"""

from __future__ import annotations

from .._plugins import Outcome, expand_names
from .._plugins import run as _run_producer
from ._measure import machine_header

SUITES: dict[str, str] = {
    "kernels": "softmax kernels (numba / Triton) against torch, the entmax package and the copy bound",
    "attention": "attention with any normalizer against torch scaled_dot_product_attention",
    "losses": "linear cross-entropy and Fenchel-Young losses against plain torch",
    "ops": "soft-NMS, MaxSim and SoftPool against ensemble-boxes and plain torch",
    "distributed": "ring attention on 1, 2, 4 gloo processes: memory per rank, communication, time; modelled scaling",
    "linear": "linear and softmax-free attention (chunked causal) against torch SDPA: time, memory, crossover L",
    "dispatch": "the default auto backend against torch and the numba kernel; page faults and THP",
}

__all__ = ["SUITES", "run_suite", "run", "machine_header"]


def check_suites(names) -> list[str]:
    """``names`` in order, ``"all"`` expanded; ``ValueError`` naming the accepted suites."""
    return expand_names(names, SUITES, "bench suite")


def run_suite(name: str, quick: bool = False, device: str = "cpu") -> Outcome:
    """Run one suite; a missing or unfinished suite comes back as skipped with the reason.
    ``device="cuda"`` runs the suites that have a GPU variant (the others are skipped)."""
    check_suites([name])
    if device == "cpu":
        return _run_producer("bench", name, f"{__name__}.{name}", lambda module: module.run(quick=quick))

    def on_device(module):
        import inspect

        if "device" not in inspect.signature(module.run).parameters:
            raise NotImplementedError(f"bench {name} has no {device} variant")
        return module.run(quick=quick, device=device)

    return _run_producer("bench", name, f"{__name__}.{name}", on_device)


def run(suites=("all",), quick: bool = False) -> list[Outcome]:
    """Run ``suites`` (names or ``"all"``) in order."""
    return [run_suite(name, quick=quick) for name in check_suites(suites)]
