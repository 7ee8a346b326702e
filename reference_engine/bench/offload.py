"""Move every weight of our model to another device in place, so the bench's peer fits beside it.

At full size our NVFP4 model holds about 20 GB and transformers' bf16 peer about 70 GB: both together do
not fit an 80 GB card (run55 ran out of memory on an H100). The bench therefore parks our weights on the
host while the peer is built and timed, then brings them back for the profiles.

The move works storage by storage: every tensor reachable from the model (dataclass fields, the plain
attributes a block sets after construction, tuples, lists and dicts of them) is grouped by the storage it
views; each storage is copied once to the target device and every tensor of its group is re-pointed at
the copy (a view with its offset, shape and strides built there with `Tensor.set_`, swapped in through
`Tensor.data`, which unlike `set_` may change a tensor's device). So views stay views (the stacked
linears and their parts share one copy, as before) and every object keeps its identity: nothing that holds
a weight has to be rebuilt. Anything that recorded raw device addresses of the weights (a captured CUDA
graph, a prefetch table) is stale afterwards: the bench moves the weights only once its engine is gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MoveReport:
    storages: int  # distinct storages copied
    tensors: int  # tensors re-pointed
    bytes: int  # bytes copied


def _is_ours(value: object) -> bool:
    return type(value).__module__.startswith("reference_engine.")


def reachable_tensors(root: object) -> list[torch.Tensor]:
    """Every tensor reachable from `root` through our own objects and builtin containers (each tensor once)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.setdefault(id(value), value)
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, (tuple, list)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif _is_ours(value) and hasattr(value, "__dict__"):
            stack.extend(vars(value).values())
    return list(found.values())


def move_weights(root: object, device: torch.device | str) -> MoveReport:
    """Copy every storage under `root` to `device` (always a fresh copy) and re-point its tensors there."""
    device = torch.device(device)
    groups: dict[tuple[str, int], list[torch.Tensor]] = {}
    for tensor in reachable_tensors(root):
        storage = tensor.untyped_storage()
        groups.setdefault((str(tensor.device), storage.data_ptr()), []).append(tensor)
    copied = 0
    with torch.inference_mode():  # the weights may be inference tensors; re-pointing them is allowed only here
        for tensors in groups.values():
            source = tensors[0].untyped_storage()
            whole = torch.empty(0, dtype=torch.uint8, device=tensors[0].device).set_(source)  # [nbytes] uint8
            target = whole.to(device, copy=True).untyped_storage()
            copied += source.nbytes()
            for tensor in tensors:
                # `set_` refuses a storage on another device (torch 2.11 and later); build the same view on the
                # target device and swap it in through `.data`, as `Module.to` moves its parameters.
                moved = torch.empty(0, dtype=tensor.dtype, device=device)
                moved.set_(target, tensor.storage_offset(), tensor.size(), tensor.stride())
                tensor.data = moved
            del whole, source, target
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return MoveReport(
        storages=len(groups),
        tensors=sum(len(group) for group in groups.values()),
        bytes=copied,
    )


@contextlib.contextmanager
def weights_parked_on_host(model) -> Iterator[MoveReport | None]:
    """While inside, `model`'s weights live in host memory and its device memory is released; then they come back.

    Yields the report of the move out, or None when the model already lives on the host (nothing is moved)."""
    home = model.device
    if home.type == "cpu":
        yield None
        return
    report = move_weights(model, "cpu")
    torch.cuda.empty_cache()
    try:
        yield report
    finally:
        move_weights(model, home)
