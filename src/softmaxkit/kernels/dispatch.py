"""The one place that picks a backend (being written; see issue 3)."""
import contextlib


@contextlib.contextmanager
def use_backend(name):
    raise NotImplementedError("use_backend is being written")
    yield


def softmax_topk(x, k, dim=-1):
    raise NotImplementedError("softmax_topk is being written")


def log_softmax_topk(x, k, dim=-1):
    raise NotImplementedError("log_softmax_topk is being written")
