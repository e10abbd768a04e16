"""softmaxkit.arena (in progress)."""
