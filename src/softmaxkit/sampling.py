"""softmaxkit.sampling (being written)."""


def soften(p, T):
    raise NotImplementedError("soften is being written")
