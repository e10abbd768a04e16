"""softmaxkit.cli (being written)."""
