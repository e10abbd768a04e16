"""softmaxkit.ops (in progress)."""
