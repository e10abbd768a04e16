"""softmaxkit.kernels.gpu (in progress)."""
