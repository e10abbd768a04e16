"""Autograd Functions that ``torch.compile`` can trace.

dynamo refuses an autograd Function that defines a custom ``jvp`` (forward mode): "Unsupported
custom jvp", a graph break, and an error under ``fullgraph=True``. :func:`without_forward_mode`
makes the Function's twin without its ``jvp``; the caller applies the twin while dynamo traces
(a compiled graph serves no forward-mode AD) and the Function itself in eager code
(``torch.func.jvp``, ``forward_ad``)::

    _SolveTraced = without_forward_mode(_Solve)
    ...
    (_SolveTraced if torch.compiler.is_compiling() else _Solve).apply(z)

(Both held in module globals: dynamo does not trace an attribute read on a Function class.)
"""

from __future__ import annotations

from typing import TypeVar, cast

import torch

__all__ = ["without_forward_mode"]

_F = TypeVar("_F", bound=type[torch.autograd.Function])


def without_forward_mode(function: _F) -> _F:
    """The autograd Function ``function`` with the base class's ``jvp``, which dynamo accepts."""
    twin = type(function.__name__ + "WithoutForwardMode", (function,),
                {"jvp": staticmethod(torch.autograd.Function.jvp),
                 "__doc__": f":class:`{function.__name__}` without its forward mode, for torch.compile."})
    return cast(_F, twin)
