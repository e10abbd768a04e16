"""What the training tasks of the arena share: seeding and running one job per core.

The models of the arena are tiny: a single training step is a few milliseconds of small
matrix products, where several intra-op threads cost more in synchronisation than they
gain (and slow down by an order of magnitude when the cores are shared). So each
training run uses one thread, and the runs of different normalizers go to separate
worker processes, one per core of the machine.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import torch


def machine_threads() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: each task draws its data from its own generator."""
    return torch.Generator().manual_seed(seed)


def why_skipped(err: BaseException) -> str:
    """The reason a normalizer's row is missing: not implemented yet, or the error it raised."""
    if isinstance(err, NotImplementedError):
        return f"not implemented yet: {err}"
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"failed: {type(err).__name__}: {first_line}"


def skipped_note(skipped: dict) -> str:
    """The sentence a table's notes end with when some normalizers were skipped ("" if none)."""
    if not skipped:
        return ""
    return " Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + "."


def cell_for(reason: str) -> str:
    """What a table cell shows for a missing row: ``"failed"`` or ``"skipped"``."""
    return "failed" if reason.startswith("failed") else "skipped"


def _single_thread() -> None:
    torch.set_num_threads(1)


def map_jobs(fn: Callable, jobs: Sequence[tuple], desc: str, workers: int | None = None,
             show_progress: bool = True) -> list:
    """``[fn(*job) for job in jobs]``, on ``workers`` processes (default: one per core).

    ``fn`` must be a module-level function and its arguments and results picklable. With
    one worker (or one job) everything runs here, single-threaded, without new processes.
    """
    from ..report.progress import progress

    workers = min(workers or machine_threads(), len(jobs))
    if workers <= 1:
        before = torch.get_num_threads()
        _single_thread()
        try:
            return [fn(*job) for job in progress(jobs, desc=desc, enabled=show_progress)]
        finally:
            torch.set_num_threads(before)
    context = multiprocessing.get_context("spawn")  # fork is unsafe once torch has started threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_single_thread) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        done = progress(_completed(futures), desc=desc, total=len(futures), enabled=show_progress)
        for _ in done:
            pass
        return [f.result() for f in futures]


def _completed(futures):
    from concurrent.futures import as_completed

    yield from as_completed(futures)
