"""``make_fx`` and other ``TorchDispatchMode``s see the torch ops a call makes: the numba kernels,
whose work happens outside them, step aside, and so do branches on values.

(entmax with another alpha is left out: its branch-free bisection traces a graph of thousands
of ops, a minute at these shapes.) Before (2026-12-04) a ``make_fx`` trace of ``sk.softmax`` on 8 x 50257 scores recorded an
``empty_like`` and nothing else (the kernel filled it unseen), and sparsemax, entmax, the
fused top-k and the losses raised "trying to get value out of a tracing tensor". Each graph
here is run on other scores than it was traced on, hostile rows included: a branch on the
traced values would be baked into it.
"""

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

import softmaxkit as sk

_G = torch.Generator().manual_seed(0)
_K, _V = torch.randn(2, 2, 96, 16, generator=_G), torch.randn(2, 2, 96, 16, generator=_G)
_TARGETS = torch.randint(0, 300, (8,), generator=_G)

CALLS = {
    "softmax": lambda x: sk.softmax(x),
    "log_softmax": lambda x: sk.log_softmax(x),
    "logsumexp": lambda x: sk.logsumexp(x),
    "softmax temperature": lambda x: sk.softmax(x, temperature=0.7),
    "sparsemax": lambda x: sk.sparsemax(x),
    "entmax15": lambda x: sk.entmax15(x),
    "softmax_topk": lambda x: sk.softmax_topk(x, 5)[0],
    "fenchel_young sparsemax": lambda x: sk.losses.fenchel_young_loss(x, _TARGETS, "sparsemax"),
    "attention sigmoid": lambda x: sk.attention(x.reshape(-1)[:2048].reshape(2, 2, 32, 16), _K, _V, "sigmoid"),
    "soft_pool2d": lambda x: sk.ops.soft_pool2d(x[:, :256].reshape(8, 1, 16, 16), 2),
}
#: (rows, n): the kernels' sizes (one long row, many entries) and a small one
SHAPES = [(8, 20000), (8, 300)]


def _scores(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


def _hostile(shape):
    x = _scores(shape, 2)
    x[1] = -math.inf                 # nothing visible
    x[2, 3] = math.inf
    x[3, ::2] = torch.finfo(torch.float32).min
    x[4, 5:] = -1e9
    return x


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", CALLS)
def test_make_fx_records_every_op(name, shape):
    fn = CALLS[name]
    graph = make_fx(fn)(_scores(shape, 1))
    for x in (_scores(shape, 3), _hostile(shape)):
        torch.testing.assert_close(graph(x), fn(x), equal_nan=True, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "sparsemax"])
def test_a_dispatch_mode_sees_the_ops_and_gets_the_same_values(name):
    x = _scores((8, 20000), 4)
    with FlopCounterMode(display=False) as counter:
        got = CALLS[name](x)
    torch.testing.assert_close(got, CALLS[name](x))
    assert counter.get_total_flops() >= 0   # (it ran; softmax has no flop formula in torch)
