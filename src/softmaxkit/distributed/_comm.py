"""The few communication patterns softmaxkit.distributed uses, on torch.distributed.

Every function of the package talks to the other ranks through a :class:`Comm`:
:class:`TorchComm` wraps a ``torch.distributed`` process group (gloo on CPU, NCCL on GPU)
and uses only its own collectives and point-to-point operations (``batch_isend_irecv``,
``all_gather``, ``all_reduce``, ``all_to_all_single``): there is no transport of our own.
:class:`ThreadComm` runs the same patterns between threads of one process (queues and a
barrier); the tests use it as a fast in-process "fake ring" that exercises exactly the
code paths of the multi-process run.
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Sequence

import torch

from .._checks import check_dim, check_int_in_range

__all__ = [
    "LAYOUTS",
    "Comm",
    "ThreadComm",
    "TorchComm",
    "resolve",
    "ring_positions",
    "shard_sequence",
    "unshard_sequence",
]

#: Sequence layouts: ``"contiguous"`` (rank r holds the r-th contiguous piece; uneven pieces
#: allowed) and ``"zigzag"`` (the sequence cut into 2P equal chunks, rank r holds chunks r
#: and 2P - 1 - r, which balances causal work).
LAYOUTS = ("contiguous", "zigzag")


class Comm:
    """What the distributed functions need from a group of ``size`` ranks."""

    rank: int
    size: int

    def all_gather_ints(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values`` (same length on every rank), in rank order."""
        raise NotImplementedError

    def ring_start(self, send: Sequence[torch.Tensor], recv: Sequence[torch.Tensor], tag: int):
        """Send ``send`` to rank ``rank + 1`` and receive ``recv`` (filled in place) from
        ``rank - 1``, without blocking; returns a handle for :meth:`ring_wait`. The two lists
        may differ in length (blocks of unequal shards); the ``i``-th of each has tag ``tag + i``."""
        raise NotImplementedError

    def ring_wait(self, handle) -> None:
        raise NotImplementedError

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def all_reduce_max_(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def all_to_all(self, send: Sequence[torch.Tensor], recv: Sequence[torch.Tensor]) -> None:
        """``send[j]`` goes to rank ``j``; ``recv[i]`` (filled in place) comes from rank ``i``."""
        raise NotImplementedError


class TorchComm(Comm):
    """A ``torch.distributed`` process group.

    A collective or a receive that fails or times out (the group's ``timeout``, set by
    ``init_process_group(timeout=...)`` or ``new_group(timeout=...)``; typically because
    another rank raised before reaching it) raises ``RuntimeError`` naming this rank and
    the operation, instead of waiting forever.
    """

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("softmaxkit.distributed needs an initialised process group: call "
                             "torch.distributed.init_process_group('gloo' or 'nccl', ...) first (torchrun sets "
                             "the environment), or pass group=")
        self.dist = dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the process group passed as group=")
        self.size = dist.get_world_size(self.group)
        self._global = [dist.get_global_rank(self.group, r) if self.group is not dist.group.WORLD else r
                        for r in range(self.size)]

    def _fail(self, what: str, err: BaseException):
        return RuntimeError(
            f"softmaxkit.distributed: rank {self.rank} of {self.size}: {what} failed or timed out; another rank "
            f"probably raised before reaching it (see its error), or the process group's timeout is too short "
            f"(init_process_group(timeout=...)). Cause: {err}")

    def _run(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as err:
            raise self._fail(what, err) from err

    def all_gather_ints(self, values):
        t = torch.tensor(list(values), dtype=torch.int64, device=self._device())
        out = [torch.empty_like(t) for _ in range(self.size)]
        self._run("all_gather of the shard sizes", self.dist.all_gather, out, t, group=self.group)
        return [o.cpu().tolist() for o in out]

    def _device(self):
        backend = self.dist.get_backend(self.group)
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def ring_start(self, send, recv, tag):
        dist = self.dist
        nxt = self._global[(self.rank + 1) % self.size]
        prv = self._global[(self.rank - 1) % self.size]
        ops = [dist.P2POp(dist.isend, s.contiguous(), nxt, self.group, tag + i) for i, s in enumerate(send)]
        ops += [dist.P2POp(dist.irecv, r, prv, self.group, tag + i) for i, r in enumerate(recv)]
        return self._run("batch_isend_irecv around the ring", dist.batch_isend_irecv, ops) if ops else []

    def ring_wait(self, handle):
        for req in handle:
            self._run("a ring send/receive", req.wait)

    def all_reduce_sum_(self, t):
        self._run("all_reduce (sum)", self.dist.all_reduce, t, op=self.dist.ReduceOp.SUM, group=self.group)
        return t

    def all_reduce_max_(self, t):
        self._run("all_reduce (max)", self.dist.all_reduce, t, op=self.dist.ReduceOp.MAX, group=self.group)
        return t

    def all_to_all(self, send, recv):
        flat_send = torch.cat([s.reshape(-1) for s in send]) if send else torch.empty(0)
        flat_recv = torch.empty(sum(r.numel() for r in recv), dtype=flat_send.dtype, device=flat_send.device)
        self._run("all_to_all_single", self.dist.all_to_all_single, flat_recv, flat_send,
                  [r.numel() for r in recv], [s.numel() for s in send], group=self.group)
        for r, part in zip(recv, torch.split(flat_recv, [r.numel() for r in recv])):
            r.copy_(part.view(r.shape))


class _ThreadWorld:
    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list = [None] * size
        self.lock = threading.Lock()
        self.mail: dict = {}

    def box(self, key) -> queue.Queue:
        with self.lock:
            return self.mail.setdefault(key, queue.Queue())


class ThreadComm(Comm):
    """``size`` ranks as threads of one process (the in-process "fake ring" of the tests).

    Build one per thread with :meth:`group` and run the same code as with torch.distributed;
    every exchange copies the tensors, as a transport would. ``timeout`` (seconds) bounds
    every wait, so a thread that fails cannot hang the others.
    """

    def __init__(self, world: _ThreadWorld, rank: int):
        self.world, self.rank, self.size = world, rank, world.size

    @staticmethod
    def group(size: int, timeout: float = 60.0) -> list[ThreadComm]:
        """One communicator per rank of a new in-process group of ``size`` ranks."""
        size = check_int_in_range(size, "size", 1)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        world = _ThreadWorld(size, float(timeout))
        return [ThreadComm(world, r) for r in range(size)]

    def _gather(self, value):
        w = self.world
        try:
            w.barrier.wait()
            w.slots[self.rank] = value
            w.barrier.wait()
            out = list(w.slots)
            w.barrier.wait()
        except threading.BrokenBarrierError:
            raise RuntimeError(f"softmaxkit.distributed: rank {self.rank} of {self.size} timed out after "
                               f"{w.timeout} s in a collective; another rank probably failed (see its error)") from None
        return out

    def all_gather_ints(self, values):
        return [list(v) for v in self._gather(list(values))]

    def ring_start(self, send, recv, tag):
        nxt = (self.rank + 1) % self.size
        for i, s in enumerate(send):
            self.world.box((self.rank, nxt, tag + i)).put(s.detach().clone())
        return [(tag + i, r) for i, r in enumerate(recv)]

    def ring_wait(self, handle):
        prv = (self.rank - 1) % self.size
        for tag, r in handle:
            try:
                t = self.world.box((prv, self.rank, tag)).get(timeout=self.world.timeout)
            except queue.Empty:
                raise RuntimeError(f"softmaxkit.distributed: rank {self.rank} timed out after {self.world.timeout} s "
                                   f"waiting for rank {prv}; another rank probably failed (see its error)") from None
            r.copy_(t)

    def all_reduce_sum_(self, t):
        parts = self._gather(t.detach().clone())
        t.copy_(torch.stack(parts).sum(0))
        return t

    def all_reduce_max_(self, t):
        parts = self._gather(t.detach().clone())
        t.copy_(torch.stack(parts).amax(0))
        return t

    def all_to_all(self, send, recv):
        parts = self._gather([s.detach().clone() for s in send])
        for i, r in enumerate(recv):
            r.copy_(parts[i][self.rank].view(r.shape))


def resolve(group) -> Comm:
    """``group`` as a :class:`Comm`: a torch.distributed group (None: the default group) or a Comm."""
    if isinstance(group, Comm):
        return group
    return TorchComm(group)


def gather_lengths(comm: Comm, lengths: Sequence[int], agreed: dict) -> list[list[int]]:
    """Every rank's ``lengths`` (its shards' sequence lengths), after checking that the ranks
    agree on ``agreed`` (name -> int or str: batch, heads, head dims, dtype, causality,
    normalizer...), in the one exchange the lengths need anyway. A mismatch raises
    ``ValueError`` on every rank, naming what differs, where the collectives would abort the
    process (gloo: a size mismatch) or wait until the timeout."""
    codes = [v if isinstance(v, int) else zlib.crc32(str(v).encode()) for v in agreed.values()]
    rows = comm.all_gather_ints([*lengths, *codes])
    n = len(lengths)
    differ = [name for i, name in enumerate(agreed) if len({row[n + i] for row in rows}) > 1]
    if differ:
        raise ValueError(f"the ranks disagree on {', '.join(differ)}: every rank must call with the same "
                         f"{', '.join(agreed)} (only the shards differ)")
    return [row[:n] for row in rows]


def call_signature(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, layout: str,
                   normalizer: str, params: dict | None = None, scale: float | None = None, **extra) -> dict:
    """What every rank's attention call must share (for :func:`gather_lengths`): shapes, dtype,
    visibility, the normalizer and, when given, its parameters (numbers by value, tensors by
    whether they need a gradient: the backward sums those over the ranks), the scale, which
    inputs need a gradient (a rank without one skips the backward that the others run), and
    ``extra`` (the ring's tile sizes, which cut the blocks that travel)."""
    out = {"batch": q.shape[0], "heads": q.shape[1], "kv heads": k.shape[1], "head dim": q.shape[-1],
           "value dim": v.shape[-1], "dtype": str(q.dtype), "is_causal": int(is_causal), "layout": layout,
           "normalizer": normalizer}
    if params is not None:
        out["parameters"] = ";".join(f"{n}={_describe(val)}" for n, val in sorted(params.items()))
    if scale is not None:
        out["scale"] = repr(float(scale))
    grad = torch.is_grad_enabled()
    out["which inputs require grad"] = "".join(str(int(grad and t.requires_grad)) for t in (q, k, v))
    return {**out, **extra}


def _describe(value) -> str:
    """A parameter's value as the ranks compare it (a number by value; a tensor by whether it
    needs a gradient, its values are not exchanged)."""
    if isinstance(value, torch.Tensor):
        return f"tensor(grad={bool(value.requires_grad and torch.is_grad_enabled())})"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(float(value))
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_describe(x) for x in value) + ")"
    return type(value).__name__


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return layout


def ring_segments(layout: str, lengths: Sequence[int], what: str) -> list[list[tuple[int, int, int]]]:
    """Per rank, its pieces of the global sequence as ``(global_start, local_start, length)``.

    ``lengths`` are the local lengths of every rank. ``"zigzag"`` needs them equal and even."""
    size = len(lengths)
    if layout == "contiguous":
        out, start = [], 0
        for n in lengths:
            out.append([(start, 0, n)] if n else [])
            start += n
        return out
    if len(set(lengths)) != 1 or lengths[0] % 2:
        raise ValueError(f"layout='zigzag' needs the same even local length of {what} on every rank (the "
                         f"sequence cut into 2P equal chunks), got local lengths {list(lengths)}; use "
                         "layout='contiguous' for uneven shards")
    c = lengths[0] // 2
    return [[(r * c, 0, c), ((2 * size - 1 - r) * c, c, c)] if c else [] for r in range(size)]


def ring_positions(segments) -> torch.Tensor:
    """The global positions of a rank's local entries, in local order."""
    parts = [torch.arange(g, g + n) for g, _, n in segments]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _pieces(total: int, size: int, layout: str) -> list[list[tuple[int, int]]]:
    if layout == "contiguous":
        base, extra = divmod(total, size)
        bounds, start = [], 0
        for r in range(size):
            n = base + (r < extra)
            bounds.append([(start, start + n)])
            start += n
        return bounds
    if total % (2 * size):
        raise ValueError(f"layout='zigzag' needs a sequence length divisible by 2P = {2 * size}, got {total}")
    c = total // (2 * size)
    return [[(r * c, (r + 1) * c), ((2 * size - 1 - r) * c, (2 * size - r) * c)] for r in range(size)]


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, *, layout: str = "zigzag", dim: int = 2,
                   lengths: Sequence[int] | None = None) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` in ``layout`` (the inverse of :func:`unshard_sequence`).

    ``"contiguous"``: the r-th of ``world_size`` near-equal pieces, or of pieces of the
    given ``lengths``; ``"zigzag"``: chunks ``r`` and ``2P - 1 - r`` of ``2P`` equal chunks.
    """
    check_layout(layout)
    world_size = check_int_in_range(world_size, "world_size", 1)
    rank = check_int_in_range(rank, "rank", 0, world_size - 1)
    dim = check_dim(x, dim)
    total = x.shape[dim]
    if lengths is not None:
        lengths = [check_int_in_range(n, "lengths", 0) for n in lengths]
        if layout != "contiguous" or len(lengths) != world_size or sum(lengths) != total:
            raise ValueError(f"lengths must be {world_size} contiguous piece lengths summing to {total}, "
                             f"got {list(lengths)} with layout={layout!r}")
        start = sum(lengths[:rank])
        return x.narrow(dim, start, lengths[rank])
    return torch.cat([x.narrow(dim, a, b - a) for a, b in _pieces(total, world_size, layout)[rank]], dim=dim)


def unshard_sequence(shards: Sequence[torch.Tensor], *, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The whole sequence from every rank's shard (in rank order), undoing :func:`shard_sequence`."""
    check_layout(layout)
    if not shards:
        raise ValueError("unshard_sequence needs every rank's shard, got none")
    dim = check_dim(shards[0], dim)
    segs = ring_segments(layout, [s.shape[dim] for s in shards], "the shards")
    pieces = []
    for shard, seg in zip(shards, segs):
        pieces += [(g, shard.narrow(dim, loc, n)) for g, loc, n in seg]
    pieces.sort(key=lambda p: p[0])
    # (every shard empty: no piece, the empty sequence)
    return torch.cat([p for _, p in pieces] or [shards[0]], dim=dim)
