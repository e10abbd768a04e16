"""Every built-in normalizer, one module each: its reference function (formula and paper),
parameters, properties, form and examples, registered in :mod:`softmaxkit.registry` on import.

Add a normalizer: one module here (copy the closest one), its name in :data:`BUILTIN`, and
one test module in ``tests/normalizers/``; nothing else changes. :data:`BUILTIN` is the
registry order. The functions are public as ``softmaxkit.<name>`` and in
:mod:`softmaxkit.functional`.
"""

from importlib import import_module

BUILTIN = ("softmax", "adaptive_softmax", "ssmax", "sa_softmax", "multimax", "sparse_softmax", "sparsemax",
           "entmax15", "entmax", "as_entmax", "softpick", "stablemax", "clipped_softmax", "sigmoid", "relu",
           "relu_l1", "softplus_l1")

for _name in BUILTIN:
    import_module(f"{__name__}.{_name}")
