"""softmaxkit.scores (in progress)."""
