"""softmaxkit.losses (being written)."""
