"""Decode steps with static shapes, replayed from CUDA graphs captured per bucketed batch size.

A decode step (every sequence brings one token) of B sequences runs at the smallest bucket >= B
(1, 2, 4, 8, ..., max_num_seqs). Its inputs live in buffers preallocated once for max_num_seqs rows;
rows B..bucket are padding: token 0 at position 0, one cached token, the runner's scratch KV block
(its slot 0) and scratch state slot, so they write nothing that a real sequence reads.

The model sees a `StaticDecodeBatch` (a ForwardBatch carrying an `ops.backend.OpSet`) and calls the
OpSet's ops: the capturable torch variants (`ops/static_*.py`) or the Triton kernels that
`select_ops` swaps in on CUDA; no host sync, shapes fixed by the bucket and by `max_blocks_per_seq`. The greedy tokens (argmax of the logits) are computed inside
the step, so a greedy decode step reads back only B token ids. Modes:
- "static": the same step run eagerly (CPU tests, profiling: a profiler sees every kernel);
- "graphs": captured once per bucket on first use (the first step at that bucket runs eagerly and
  is the real step; capture only records), then replayed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.scheduler import SchedulerOutput

DECODE_MODES = ("eager", "static", "graphs")


@dataclass(frozen=True)
class StaticDecodeBatch(ForwardBatch):
    ops: Any = None  # ops.backend.OpSet: the capturable decode ops (torch static variants or Triton kernels) the model calls
    prefetch: Any = None  # kernels.l2_prefetch.LayerPrefetch or None: the next layer's weights warmed in L2 on a side stream
    side: Any = None  # kernels.side_stream.SideStream or None: the GDN b/a projection beside q/k/v/z at small batches


def bucket_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Powers of two below max_num_seqs, then max_num_seqs itself."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be positive, got {max_num_seqs}")
    sizes, size = [], 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return (*sizes, max_num_seqs)


def bucket_for(num_seqs: int, buckets: tuple[int, ...]) -> int:
    for size in buckets:
        if size >= num_seqs:
            return size
    raise ValueError(
        f"{num_seqs} sequences exceed the largest decode bucket {buckets[-1]}"
    )


class CaptureFailed(Exception):
    """Graph capture raised `error`; `result` is the real step's result from the run before it."""

    def __init__(self, error: RuntimeError, result) -> None:
        super().__init__(str(error))
        self.error, self.result = error, result


def run_then_capture(forward, device: torch.device, pool):
    """(the real result, the graph, the captured call's outputs) of `forward()`: run once on a side stream (the
    real step; library handles and workspaces are created off the capture), its tensors cloned, then recorded
    into a new graph in `pool` (recording runs nothing). CaptureFailed when the capture raises."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        result = forward()
        result = tuple(t.clone() for t in result) if isinstance(result, tuple) else result.clone()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool):
            outputs = forward()
    except RuntimeError as error:
        raise CaptureFailed(error, result) from error
    return result, graph, outputs


@dataclass(frozen=True)
class ScratchSpace:
    block: int  # a KV block no sequence owns
    slot: int  # a GDN state slot no sequence owns
    block_size: int


class StaticDecoder:
    """Static decode buffers, per-bucket graphs and their outputs for one model and one set of caches."""

    def __init__(
        self,
        model,
        caches: ModelCaches,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        scratch: ScratchSpace,
        use_graphs: bool,
        ops,
    ) -> None:
        device = torch.device(model.device)
        if use_graphs and device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need a CUDA device, the model is on {device}"
            )
        self.model, self.caches, self.scratch, self.use_graphs = model, caches, scratch, use_graphs
        self.ops = ops  # ops.backend.OpSet
        self.device = device
        self.prefetch = None  # kernels.l2_prefetch.LayerPrefetch: set where the Triton ops run on CUDA and the tuning turns it on
        self.side = None  # kernels.side_stream.SideStream: likewise
        if device.type == "cuda" and "triton" in getattr(ops, "backends", {}).values():
            from reference_engine.kernels import l2_prefetch, side_stream

            self.prefetch = l2_prefetch.for_model(model)
            self.side = side_stream.for_device(device)
        self.buckets = bucket_sizes(max_num_seqs)
        self.max_blocks_per_seq = max_blocks_per_seq
        rows = max_num_seqs
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)  # [S]
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)  # [S]
        self.slot_mapping = torch.zeros(rows, dtype=torch.int64, device=device)  # [S]
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)  # [S]
        self.state_slots = torch.full(
            (rows,), scratch.slot, dtype=torch.int64, device=device
        )  # [S]
        self.block_tables = torch.full(
            (rows, max_blocks_per_seq), scratch.block, dtype=torch.int32, device=device
        )  # [S, MB]
        self.cu_seqlens = torch.arange(
            rows + 1, dtype=torch.int32, device=device
        )  # [S + 1], one token each
        self.has_initial_state = torch.ones(
            rows, dtype=torch.bool, device=device
        )  # [S]
        self.logits_indices = torch.arange(
            rows, dtype=torch.int64, device=device
        )  # [S]
        staged = rows * (5 + max_blocks_per_seq)
        self.staging = torch.zeros(staged, dtype=torch.int64, device=device)  # the step's integers, unpacked by the step
        # two pinned host buffers (on CUDA: async copies), used in turn: with async decoding the host stages step n + 1
        # while step n's copy may not have run yet, so step n + 1 must not write the buffer that step n reads
        self._hosts = tuple(torch.zeros(staged, dtype=torch.int64, pin_memory=device.type == "cuda") for _ in range(2))
        self._turn = 0
        self._last_values: dict[int, list[int]] = {}  # bucket -> the integers last staged for it
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool = None
        self.capture_error: str | None = (
            None  # set when a capture failed (then use_graphs is False)
        )

    def accepts(self, plan: SchedulerOutput) -> bool:
        chunks = plan.chunks
        return (
            bool(chunks)
            and plan.is_decode
            and len(chunks) <= self.buckets[-1]
            and all(
                c.samples
                and len(c.token_ids) == 1
                and len(c.block_table) <= self.max_blocks_per_seq
                for c in chunks
            )
        )

    def batch(self, bucket: int) -> StaticDecodeBatch:
        return StaticDecodeBatch(
            input_ids=self.input_ids[:bucket],  # [b]
            positions=self.positions[:bucket],  # [b]
            cu_seqlens_q=self.cu_seqlens[: bucket + 1],  # [b + 1]
            seq_lens=self.seq_lens[:bucket],  # [b]
            block_tables=self.block_tables[:bucket],  # [b, MB]
            slot_mapping=self.slot_mapping[:bucket],  # [b]
            state_slots=self.state_slots[:bucket],  # [b]
            has_initial_state=self.has_initial_state[:bucket],  # [b]
            logits_indices=self.logits_indices[:bucket],  # [b]
            is_decode=True,
            ops=self.ops,
            prefetch=self.prefetch,
            side=self.side,
        )

    def fill(self, plan: SchedulerOutput) -> int:
        """Stage the plan's integers (and the padding rows) for the step; returns the bucket.

        One host-to-device copy of a pinned buffer into `staging`; the step itself (`_forward`, so also
        the captured graph) unpacks `staging` into the static input buffers, so a replayed step costs
        one copy and one graph launch on the host.
        """
        chunks = plan.chunks
        bucket = bucket_for(len(chunks), self.buckets)
        padding = bucket - len(chunks)
        scratch = self.scratch
        width = self.max_blocks_per_seq
        values = (
            [c.token_ids[0] for c in chunks] + [0] * padding
            + [c.start for c in chunks] + [0] * padding
            + [c.slot_mapping[0] for c in chunks] + [scratch.block * scratch.block_size] * padding
            + [c.start + 1 for c in chunks] + [1] * padding
            + [c.state_slot for c in chunks] + [scratch.slot] * padding
        )  # fmt: skip
        for c in chunks:
            values += c.block_table
            values += [scratch.block] * (width - len(c.block_table))
        values += [scratch.block] * (width * padding)
        count = len(values)  # 5 * bucket + bucket * width
        host = self._hosts[self._turn]
        self._turn ^= 1
        host[:count] = torch.tensor(values, dtype=torch.int64)
        self.staging[:count].copy_(host[:count], non_blocking=host.is_pinned())
        self._last_values[bucket] = values
        return bucket

    def restage(self, bucket: int) -> None:
        """Stage again the last inputs staged for `bucket` (timing replays of that bucket's graph: `staging`
        may since hold another bucket's layout, which that graph would misread)."""
        if bucket not in self._last_values:
            raise ValueError(f"no step of bucket {bucket} has been staged with ids the host knows (async steps take theirs on the device)")
        values = self._last_values[bucket]
        self.staging[: len(values)].copy_(torch.tensor(values, dtype=torch.int64))

    def _unpack(self, bucket: int) -> None:
        """staging -> the static input buffers (inside the graph when captured)."""
        parts = self.staging[: 5 * bucket].view(5, bucket)
        self.input_ids[:bucket].copy_(parts[0])
        self.positions[:bucket].copy_(parts[1])
        self.slot_mapping[:bucket].copy_(parts[2])
        self.seq_lens[:bucket].copy_(parts[3])
        self.state_slots[:bucket].copy_(parts[4])
        self.block_tables[:bucket].copy_(self.staging[5 * bucket : 5 * bucket + bucket * self.max_blocks_per_seq].view(bucket, self.max_blocks_per_seq))

    def _forward(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._unpack(bucket)
        logits = self.model.forward(self.batch(bucket), self.caches)  # [b, V] float32
        return logits, logits.argmax(
            dim=-1
        )  # greedy tokens [b]: first maximum, ties to the lowest id

    @torch.inference_mode()
    def run(self, plan: SchedulerOutput, input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: (logits [B, V] float32, greedy tokens [B] int64), views of this step's outputs.

        input_ids: [B] int64 on the device, this step's input tokens where the host does not know them yet (async
        decoding: the previous step's sampled tokens, copied in stream order before this step reads them); the plan's
        token ids are then placeholders."""
        num_seqs = len(plan.chunks)
        bucket = self.fill(plan)
        if input_ids is not None:
            if input_ids.shape != (num_seqs,):
                raise ValueError(f"input_ids must have shape ({num_seqs},), got {tuple(input_ids.shape)}")
            self.staging[:num_seqs].copy_(input_ids)  # staging's first bucket entries are the input ids
            self._last_values.pop(bucket, None)  # the host holds placeholders for them: nothing `restage` may repeat
        if not self.use_graphs:
            logits, tokens = self._forward(bucket)
        elif bucket in self._graphs:
            self._graphs[bucket].replay()
            logits, tokens = self._outputs[bucket]
        else:
            logits, tokens = self._warm_up_and_capture(bucket)
        return logits[:num_seqs], tokens[:num_seqs]

    def _capture_failed(self, error: Exception) -> None:
        """Record why capture failed and carry on with the static path run eagerly (benchmarks report it)."""
        self.capture_error = f"{type(error).__name__}: {error}"
        self.use_graphs = False
        warnings.warn(
            f"CUDA graph capture failed, decode runs the static path eagerly: {self.capture_error}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _warm_up_and_capture(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the real step eagerly on a side stream (lazy initialisation happens there), then record a graph."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            (logits, tokens), graph, self._outputs[bucket] = run_then_capture(lambda: self._forward(bucket), self.device, self._pool)
        except CaptureFailed as failure:
            self._capture_failed(failure.error)
            return failure.result
        self._graphs[bucket] = graph
        return logits, tokens

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))
