"""softmaxkit.bench (in progress)."""
