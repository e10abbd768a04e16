"""Attention with any normalizer (being written)."""


def attention(*args, **kwargs):
    raise NotImplementedError("softmaxkit.attention is being written")
