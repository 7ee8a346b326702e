"""Warm the L2 cache with the next decoder layer's weights while the current layer runs (CUDA-graph decode).

Why: at batch 1 every decode kernel is short and latency-bound. Nsight Compute on the H200 (benchmarks/NOTES.md, run21)
saw the layer's GEMVs and MoE launches use 11 to 26% of the HBM bandwidth; most of their time is the first bytes'
latency and the tail. The weights a layer reads do not depend on the activations, except for the routed experts, so
they can be fetched before the kernels that read them start. Here a second stream, forked from the decode stream
inside the captured graph, issues Hopper's bulk L2 prefetch (`cp.async.bulk.prefetch.L2.global`, PTX ISA 8.0, sm_90)
over layer l + 1's weights while layer l runs. The kernel only starts the copies (it does not wait for them) and
exits, so it holds no SM for long. Results do not change: only the L2 cache is touched.

What is fetched (`layer_spans`): every tensor of the layer's mixer (projections, conv weight, norms, gates) and of
its MoE block except the routed experts (their ids are known only after the router): the router and the shared
expert's gate row, the shared expert, the layer norms. Overlapping views (the stacked projections and the views of
their parts) are merged into disjoint spans. `chunk_spans` cuts the spans into 16-byte-aligned chunks of at most
`CHUNK_BYTES` (the bulk prefetch takes a 16-byte-aligned address and a size that is a multiple of 16; bytes at an
unaligned edge of a span are left out).

When (`POINT`, the tuning file's `l2_prefetch`): None leaves it off; "mixer" issues layer l + 1's chunks as layer l
begins; "moe" issues them as layer l's MoE block begins (after the mixer, so layer l's own weights are read first).
`benchmarks/kernels/time_l2_prefetch.py` times the batch-1 decode graph with each setting and checks that the
logits do not change. Off CUDA there is nothing to prefetch: `for_model` returns None.

Measured (benchmarks/NOTES.md, runs 57 and 58 on an H100): "moe" -1.3% and -0.65% per batch-1 step, "mixer" +0.9% and
+2.1%; off in the tuning file. The batch-1 kernels are mostly not waiting on HBM (their hot/cold timings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import cdiv

CHUNK_BYTES = 1 << 16  # bytes per prefetch instruction (a multiple of 16)
ALIGN = 16  # the bulk prefetch's address and size granule
POINTS = ("mixer", "moe")
POINT: str | None = None  # None: off; else where in layer l the chunks of layer l + 1 are issued (module docstring)
BLOCK = 128  # chunks per program


@triton.jit
def _l2_prefetch_kernel(table_ptr, n, BLOCK: tl.constexpr):
    """Chunk table int64 [n, 2] (address, bytes): one bulk L2 prefetch per chunk, not waited for."""
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = index < n
    address = tl.load(table_ptr + 2 * index, mask=ok, other=0)
    size = tl.load(table_ptr + 2 * index + 1, mask=ok, other=0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [address, size], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, bytes) spans -> disjoint spans covering the same bytes, in address order (empty spans dropped)."""
    merged: list[list[int]] = []
    for start, size in sorted((s, n) for s, n in spans if n > 0):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], start + size)
        else:
            merged.append([start, start + size])
    return [(start, end - start) for start, end in merged]


def chunk_spans(spans: Iterable[tuple[int, int]], chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """Disjoint (address, bytes) spans -> chunks of at most `chunk_bytes`, each starting at a multiple of 16 and a
    multiple of 16 long, covering every 16-byte granule that lies wholly inside a span."""
    if chunk_bytes <= 0 or chunk_bytes % ALIGN:
        raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}, got {chunk_bytes}")
    chunks = []
    for start, size in spans:
        first = -(-start // ALIGN) * ALIGN
        end = (start + size) // ALIGN * ALIGN
        for address in range(first, end, chunk_bytes):
            chunks.append((address, min(chunk_bytes, end - address)))
    return chunks


def _tensors(value, skip: tuple[type, ...]) -> Iterator[torch.Tensor]:
    """Every tensor reachable from `value` through dataclass attributes (fields and attributes set after construction,
    such as `SparseMoeBlock`'s fused form), tuples and lists, not entering `skip` types."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, skip):
        return
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item, skip)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in vars(value).values():
            yield from _tensors(item, skip)


def _extent(tensor: torch.Tensor) -> int:
    """Bytes from the tensor's first element to one past its last (any strides; non-negative strides assumed)."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return (last + 1) * tensor.element_size()


def layer_spans(layer) -> list[tuple[int, int]]:
    """Disjoint (address, bytes) spans of one decoder layer's weights, the routed experts and tile-major copies (read
    only by batches of many tokens, `ops.tiled_experts`) left out."""
    from reference_engine.model.experts import RoutedExperts
    from reference_engine.ops.tiled_experts import TiledWeights

    spans = []
    for tensor in _tensors(layer, skip=(RoutedExperts, TiledWeights)):
        if tensor.numel():
            spans.append((tensor.data_ptr(), _extent(tensor)))
    return merge_spans(spans)


def launch(table: torch.Tensor) -> None:
    """One prefetch launch over a chunk table int64 [n, 2] on the current stream (CUDA)."""
    n = table.shape[0]
    if n:
        _l2_prefetch_kernel[(cdiv(n, BLOCK),)](table, n, BLOCK=BLOCK, num_warps=4)


@dataclasses.dataclass(frozen=True)
class LayerPrefetch:
    """Per-layer chunk tables and the side stream that issues them (see the module docstring)."""

    tables: tuple[torch.Tensor, ...]  # layer l: int64 [n_l, 2] (address, bytes) on the device
    stream: torch.cuda.Stream
    point: str  # one of POINTS

    def at(self, layer_index: int, point: str) -> None:
        """Called by decoder layer `layer_index` at `point`: issue layer layer_index + 1's chunks when that is this
        object's point. The side stream first waits for everything the decode stream has issued so far."""
        target = layer_index + 1
        if point != self.point or target >= len(self.tables):
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            launch(self.tables[target])

    def join(self) -> None:
        """The decode stream waits for the side stream (a captured graph must end on the stream it began on)."""
        torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)

    @property
    def nbytes(self) -> int:
        return int(sum(int(table[:, 1].sum()) for table in self.tables if table.numel()))


def for_model(model, point: str | None = None) -> LayerPrefetch | None:
    """The prefetch plan of `model`'s decoder layers at `point` (default `POINT`); None when off or off CUDA."""
    point = POINT if point is None else point
    if point is None or point == "off":
        return None
    if point not in POINTS:
        raise ValueError(f"l2_prefetch point must be one of {POINTS}, 'off' or None, got {point!r}")
    device = torch.device(model.device)
    if device.type != "cuda":
        return None
    tables = []
    for layer in model.layers:
        chunks = chunk_spans(layer_spans(layer))
        tables.append(torch.tensor(chunks, dtype=torch.int64).reshape(-1, 2).to(device))
    return LayerPrefetch(tables=tuple(tables), stream=torch.cuda.Stream(device), point=point)
