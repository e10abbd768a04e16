"""Progress for long work: tqdm bars when tqdm is installed, plain prints otherwise.

Everything goes to stderr so that stdout carries only results.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

try:
    from tqdm.auto import tqdm as _tqdm
except ImportError:  # tqdm is in the `report` extra; fall back to prints
    _tqdm = None


def progress(items: Iterable[T], desc: str, total: int | None = None, leave: bool = True,
             enabled: bool = True) -> Iterator[T]:
    """Iterate ``items`` showing a progress bar labelled ``desc``.

    Without tqdm, prints ``desc i/total`` about ten times over the loop. ``enabled=False``
    iterates silently (for tests and nested loops that are too short to matter).
    """
    if not enabled:
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if _tqdm is not None:
        yield from _tqdm(items, desc=desc, total=total, leave=leave, file=sys.stderr, dynamic_ncols=True)
        return
    every = max((total or 0) // 10, 1)
    for i, item in enumerate(items):
        if i % every == 0:
            shown = f"{i}/{total}" if total else str(i)
            print(f"{desc}: {shown}", file=sys.stderr, flush=True)
        yield item
    print(f"{desc}: done", file=sys.stderr, flush=True)


def say(message: str) -> None:
    """One status line on stderr, that does not break a running tqdm bar."""
    if _tqdm is not None:
        _tqdm.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr, flush=True)
