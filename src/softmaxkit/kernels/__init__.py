"""softmaxkit.kernels (in progress)."""
