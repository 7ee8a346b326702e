"""Host copies of the small device tensors that the ops of one forward validate over and over.

A prefill of the 40-layer model passes the same `cu_seqlens`, `seq_lens` and `block_tables` to every
layer's ops, and each op checks them on the host (`tolist()`), which waits for the GPU to drain its
queue: about two waits per layer, each exposing the launch latency of what follows. Inside
`one_forward()` (the runner wraps each eager forward in it) `host_list` reads each tensor once and serves
the same values to later callers; the copies are dropped when the block ends. Batch metadata does not
change within a forward, so the cache needs no invalidation (inference tensors have no version counter
to check anyway); outside the block `host_list` is a plain `tolist()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

_SCOPE: ContextVar[dict | None] = ContextVar("reference_engine_host_values", default=None)


@contextlib.contextmanager
def one_forward() -> Iterator[None]:
    """Within the block, each tensor passed to `host_list` is read from the device once."""
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def host_list(tensor: torch.Tensor) -> list:
    """`tensor.tolist()`; inside `one_forward()` read once per tensor (a fresh outer list each call, so a caller
    that edits it cannot change what the next caller sees)."""
    scope = _SCOPE.get()
    if scope is None:
        return tensor.tolist()
    entry = scope.get(id(tensor))
    if entry is None or entry[0] is not tensor:  # the tensor is held by the entry: its id is not reused meanwhile
        entry = (tensor, tensor.tolist())
        scope[id(tensor)] = entry
    return list(entry[1])
