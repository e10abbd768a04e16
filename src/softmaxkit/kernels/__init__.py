"""Fast implementations of the reference definitions, and the dispatch that picks them.

:mod:`.dispatch` decides (``use_backend``); :mod:`.cpu` holds the numba kernels,
:mod:`.gpu` the Triton ones. Kernels never change results beyond floating-point
tolerance; the references in :mod:`softmaxkit.functional` are the specification.
"""
