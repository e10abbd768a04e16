"""Every built-in normalizer, one module each: its reference function (formula and paper),
parameters, properties, form and examples, registered in :mod:`softmaxkit.registry` on import.

Add a normalizer: one module here (copy the closest one) and one test module in
``tests/normalizers/``; nothing else changes. Every public module of this package is
imported and registered, those of :data:`DESIGN_ORDER` first in that order, then the
others alphabetically. The functions are public as ``softmaxkit.<name>`` and in
:mod:`softmaxkit.functional`.
"""

import pkgutil
from importlib import import_module

#: The order of DESIGN.md's table; later additions follow alphabetically.
DESIGN_ORDER = ("softmax", "adaptive_softmax", "ssmax", "sa_softmax", "multimax", "sparse_softmax", "sparsemax",
                "entmax15", "entmax", "as_entmax", "softpick", "stablemax", "clipped_softmax", "sigmoid", "relu",
                "relu_l1", "softplus_l1")

MODULES = tuple(sorted((info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")),
                       key=lambda name: (DESIGN_ORDER.index(name) if name in DESIGN_ORDER else len(DESIGN_ORDER),
                                         name)))

for _name in MODULES:
    import_module(f"{__name__}.{_name}")
