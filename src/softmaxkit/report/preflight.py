"""What ``softmaxkit report`` checks before it runs a single benchmark.

A report takes minutes; finding out at the end that matplotlib is missing (a core install
has only torch, numpy and numba) or that ``--out`` cannot be written wastes all of them.
:func:`preflight` returns a one-line reason, or None when the report can be written.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

#: The modules the report needs that a core install does not have, and how to get them.
REQUIRED_MODULES = ("matplotlib", "matplotlib.figure")
INSTALL_COMMAND = "pip install 'softmaxkit[report]'"

__all__ = ["INSTALL_COMMAND", "REQUIRED_MODULES", "check_out_dir", "missing_modules", "preflight"]


def missing_modules(names=REQUIRED_MODULES) -> list[str]:
    """The top-level packages among ``names`` that cannot be imported."""
    missing: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            top = name.split(".")[0]
            if top not in missing:
                missing.append(top)
    return missing


def check_out_dir(out) -> str | None:
    """Create ``out`` (a directory, parents included) and check a file can be written in it;
    a one-line reason when not."""
    if not str(out).strip():
        return "--out is empty; give a directory to write the report into (an empty path is the current one)"
    path = Path(out)
    if path.exists() and not path.is_dir():
        return f"--out {str(out)!r} exists and is not a directory; give a directory to write the report into"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        return f"--out {str(out)!r} cannot be written: {err.strerror or err}"
    return None


def preflight(out) -> str | None:
    """The reason the report cannot be written (missing extra or bad ``--out``), or None."""
    missing = missing_modules()
    if missing:
        return (f"softmaxkit report needs {', '.join(missing)}, which is not installed; "
                f"install the report extra: {INSTALL_COMMAND}")
    return check_out_dir(out)
