"""The cache of large CPU output blocks (softmaxkit.kernels.memory): a block comes back when
its tensor and every view of it are gone, and only then; the limit holds; every dtype."""

import gc
import threading

import pytest
import torch

import softmaxkit as sk
from softmaxkit.kernels import memory

ROWS, COLS = 256, 32768          # 32 MiB of float32: the smallest cached output
BIG = (ROWS, COLS)


@pytest.fixture(autouse=True)
def fresh_cache():
    limit = memory.cache_limit()
    memory.set_cache_limit(1 << 30)
    memory.empty_cache()
    yield
    memory.set_cache_limit(limit)
    memory.empty_cache()


def test_a_freed_block_is_reused_and_a_live_view_keeps_it():
    a = memory.empty(BIG, torch.float32)
    address = a.data_ptr()
    view = a[5:7]
    del a
    gc.collect()
    assert memory.cached_bytes() == 0          # the view still holds the block
    b = memory.empty(BIG, torch.float32)
    assert b.data_ptr() != address
    del view
    assert memory.cached_bytes() == ROWS * COLS * 4
    c = memory.empty_like(torch.empty(BIG))
    assert c.data_ptr() == address and memory.cached_bytes() == 0
    del b, c
    assert memory.cached_bytes() == 2 * ROWS * COLS * 4


def test_a_block_serves_only_its_own_size_class():
    mib = 2**20
    a = memory.empty((33 * mib,), torch.uint8)         # a block of 34 MiB
    address = a.data_ptr()
    del a
    b = memory.empty((35 * mib,), torch.uint8)         # 36 MiB: another class
    assert b.data_ptr() != address and memory.cached_bytes() == 34 * mib
    c = memory.empty((34 * mib - 100,), torch.uint8)   # rounds up to 34 MiB
    assert c.data_ptr() == address


def test_the_limit_holds_and_drops_the_oldest_blocks_first():
    memory.set_cache_limit(2 * ROWS * COLS * 4)
    blocks = [memory.empty(BIG, torch.float32) for _ in range(3)]
    addresses = [b.data_ptr() for b in blocks]
    while blocks:
        blocks.pop(0)   # freed in order: the first is the oldest
    assert memory.cached_bytes() == 2 * ROWS * COLS * 4
    again = [memory.empty(BIG, torch.float32) for _ in range(2)]
    assert {t.data_ptr() for t in again} == set(addresses[1:])
    memory.set_cache_limit(0)
    del again
    assert memory.cached_bytes() == 0
    fresh = memory.empty(BIG, torch.float32)   # limit 0: plain torch memory, nothing kept
    del fresh
    assert memory.cached_bytes() == 0


def test_empty_cache_and_bad_limits():
    t = memory.empty(BIG, torch.float32)
    del t
    assert memory.cached_bytes() > 0
    memory.empty_cache()
    assert memory.cached_bytes() == 0
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="nbytes"):
            memory.set_cache_limit(bad)


def test_the_environment_variable_sets_the_limit(monkeypatch):
    monkeypatch.setenv("SOFTMAXKIT_CPU_CACHE_BYTES", "0")
    assert memory._default_limit() == 0
    monkeypatch.setenv("SOFTMAXKIT_CPU_CACHE_BYTES", "lots")
    with pytest.raises(ValueError, match="SOFTMAXKIT_CPU_CACHE_BYTES"):
        memory._default_limit()
    monkeypatch.delenv("SOFTMAXKIT_CPU_CACHE_BYTES")
    assert 0 < memory._default_limit() <= 1 << 30


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.bool, torch.complex64, torch.int64])
def test_every_dtype_is_an_ordinary_contiguous_tensor(dtype):
    n = ROWS * COLS * 4 // dtype.itemsize
    t = memory.empty((2, n // 2), dtype)
    assert t.shape == (2, n // 2) and t.dtype == dtype and t.is_contiguous() and t.is_cpu
    t.fill_(True if dtype == torch.bool else 3)
    assert bool((t == t.flatten()[0]).all())
    assert t.data_ptr() % memory.HUGE_PAGE == 0


def test_moving_to_shared_memory_gives_the_block_back():
    t = memory.empty(BIG, torch.float32).fill_(2.0)
    t.share_memory_()
    gc.collect()
    assert memory.cached_bytes() == ROWS * COLS * 4 and float(t[-1, -1]) == 2.0


def test_threads_never_share_a_live_block():
    errors = []

    def work(k):
        for _ in range(6):
            t = memory.empty(BIG, torch.float32).fill_(k)
            threading.Event().wait(0.001)
            if not bool((t == k).all()):
                errors.append(k)
            del t

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert memory.cached_bytes() <= 4 * ROWS * COLS * 4


def test_softmax_outputs_and_gradients_from_the_cache_stay_correct():
    """Two steps of a loop: the second step's outputs reuse the first's blocks, the leaf's
    gradient (which autograd may keep as the very tensor the backward made) included."""
    x = torch.randn(BIG).requires_grad_()
    for step in range(2):
        y = sk.softmax(x)
        torch.testing.assert_close(y, torch.softmax(x.detach(), -1))
        y.backward(torch.ones_like(y) * step)
        torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-6, rtol=0)
        x.grad = None
        del y
    p = sk.softmax(x.detach())
    q = sk.softmax(x.detach() * 2)
    assert p.data_ptr() != q.data_ptr()
    torch.testing.assert_close(p, torch.softmax(x.detach(), -1))
    torch.testing.assert_close(q, torch.softmax(x.detach() * 2, -1))


def test_an_output_from_the_cache_is_not_a_view():
    """A view would have a base: autograd refuses an in-place op on a view a custom Function
    returns, and a user's ``y.mul_(2)`` on a kernel's output must work as on torch's."""
    x = torch.randn(BIG).requires_grad_()
    y = sk.softmax(x)
    assert y._base is None and memory.empty(BIG, torch.bfloat16)._base is None
    y.mul_(2)   # (on a view: "a view created inside a custom Function" error here)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()   # as torch.softmax's: its backward reads the output


def test_the_memory_benchmark_counts_an_output_the_cache_would_hand_back():
    """``peak_memory_bytes`` empties the cache first: a reused block is already resident, and
    the output would not show in the figure (sk's memory against torch's looked smaller)."""
    from softmaxkit.bench._measure import peak_memory_bytes

    x = torch.randn(BIG)
    sk.softmax(x)   # its block goes to the cache
    assert memory.cached_bytes() > 0
    assert peak_memory_bytes(lambda: sk.softmax(x)) >= ROWS * COLS * 4 * 0.9
