"""softmaxkit.distributed: attention and cross-entropy past one device, on torch.distributed.

* :func:`context_parallel_attention`: ring attention over sequence shards for every
  streamable normalizer (the threshold family through Ulysses);
* :func:`ulysses_attention`: all-to-all to head shards, any normalizer;
* :func:`vocab_parallel_linear_cross_entropy`: the output layer's vocabulary sharded,
  logits never materialised;
* :func:`shard_sequence` / :func:`unshard_sequence`: the ``"contiguous"`` and
  ``"zigzag"`` layouts.

Communication is torch.distributed's own (gloo on CPU, NCCL on GPU; launch with
``torchrun``); see docs/distributed.md. ``torch.distributed`` itself is only touched
when a function runs with a process group.
"""

from ._comm import LAYOUTS, ThreadComm, shard_sequence, unshard_sequence
from .cross_entropy import vocab_parallel_linear_cross_entropy
from .ring import context_parallel_attention
from .ulysses import ulysses_attention

__all__ = [
           "LAYOUTS",
           "ThreadComm",
           "context_parallel_attention",
           "shard_sequence",
           "ulysses_attention",
           "unshard_sequence",
           "vocab_parallel_linear_cross_entropy",
]
