"""softmaxkit.kernels.cpu (in progress)."""
