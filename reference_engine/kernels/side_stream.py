"""A Gated DeltaNet layer's small b/a projection on a second stream, beside its large q/k/v/z projection (CUDA-graph decode).

Why: at batch 1 a decode kernel's time is mostly its own ramp and tail, not its bytes (benchmarks/NOTES.md, run21 and
run59). A GDN layer's normed input feeds two independent launches: the stacked q/k/v/z GEMV (NVFP4, 14.2 MB; 384
programs, one partial wave) and the stacked b/a GEMV (dense bfloat16, 64 x 2048; 2.25 us a call in run60's batch-1
table, 30 calls). Issued on one stream they run one after the other. Here, at decode batches up to `BA_MAX_BATCH`,
the b/a launch goes to a side stream forked from the decode stream just before the big GEMV. Inside a captured graph
that makes the two launches parallel branches: the small one can run on multiprocessors the big one leaves idle. The
decode stream waits for the side stream before the GDN step that reads b and a, so the order of everything else is
unchanged, and the results are the same bits (the same kernels on the same inputs).

Memory: b and a are allocated while the side stream is current, so their block belongs to the side stream's pool and is
reused only by later side-stream allocations. Each of those is issued after the next fork, which waits for the decode
stream's work up to that point, including the GDN step that read the block.

`BA_MAX_BATCH` (tuning key `gdn_ba_side_max_batch`): `benchmarks/kernels/time_side_stream.py` times the decode graph
with and without it (run61, H100, batch 1: -2.2%, logits bit-equal; on at batch 1 in the tuning file). Off CUDA there
is no side stream: `for_device` returns None.

Tried and removed: the MoE block's shared expert as a branch forked before the router (its own two launches, joined
before the routed down launch; bit-equal, commit ece7445). It made the batch-1 graph 8.5% slower (run62, H100).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import torch

BA_MAX_BATCH = 0  # decode batches up to this run the GDN b/a projection on the side stream (0: never)

First = TypeVar("First")
Second = TypeVar("Second")


@dataclasses.dataclass(frozen=True)
class SideStream:
    """The second stream of one device's static decode (see the module docstring)."""

    stream: torch.cuda.Stream

    def branches(self, main_work: Callable[[], First], side_work: Callable[[], Second]) -> tuple[First, Second]:
        """(main_work(), side_work()): side_work is issued on the side stream after everything the current stream has
        issued so far, main_work on the current stream; then the current stream waits for the side stream."""
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            side_result = side_work()
        main_result = main_work()
        current.wait_stream(self.stream)
        return main_result, side_result


def for_device(device: torch.device | str) -> SideStream | None:
    """A side stream on `device` when it is a CUDA device and `BA_MAX_BATCH` is on, else None."""
    device = torch.device(device)
    if device.type != "cuda" or BA_MAX_BATCH <= 0:
        return None
    return SideStream(torch.cuda.Stream(device))


def ba_on_side(side: SideStream | None, num_tokens: int) -> bool:
    """Whether a decode step of `num_tokens` rows runs the b/a projection on `side`."""
    return side is not None and 0 < num_tokens <= BA_MAX_BATCH
