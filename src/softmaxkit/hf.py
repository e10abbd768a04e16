"""softmaxkit.hf (being written)."""
