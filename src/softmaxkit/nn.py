"""softmaxkit.nn (being written)."""
