"""softmaxkit.algorithms (being written)."""
class OnlineSoftmaxState:  # being written
    pass
