"""Triton GPU kernels (need the ``gpu`` extra; tested on CPU with ``TRITON_INTERPRET=1``)."""
