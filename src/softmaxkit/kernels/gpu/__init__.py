"""Triton GPU kernels (need the ``gpu`` extra; tested on CPU with ``TRITON_INTERPRET=1``)."""

import torch as _torch

_F32 = _torch.finfo(_torch.float32)
#: The temperatures the Triton softmax takes: those whose reciprocal, the scale the kernel
#: multiplies by in float32, is a normal float32 (beyond, 1 / T is inf or a subnormal that a
#: GPU flushes to 0; the dispatcher sends such calls to the reference, which rounds x / T once).
TEMPERATURE_RANGE = (1.0 / _F32.max, 1.0 / _F32.tiny)
