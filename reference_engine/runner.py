"""The model runner: the only owner of device tensors (caches, step buffers); turns a scheduler plan into a step.

Per step it fills preallocated buffers (sized for `max_num_batched_tokens` tokens and
`max_num_seqs` sequences) with the plan's integers, calls `model.forward`, and samples the rows
whose chunk reaches the end of its known tokens.

Decode steps (one new token per sequence) go through `cuda_graphs.StaticDecoder` unless
`decode_mode="eager"`: "graphs" (the default on CUDA) replays a CUDA graph per bucketed batch size,
"static" runs the same static-shape step eagerly (for tests on the CPU and for profiling). The
caches hold one extra KV block and one extra state slot beyond what the scheduler hands out: the
scratch space that the padding rows of a bucket write into. A fresh prompt's prefill (one sequence, no cached
prefix) goes through `prefill_graphs.PrefillGraphs` in "graphs" mode (padded to a bucket of prompt lengths,
a graph per bucket); other prefill and mixed steps stay eager.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.config import EngineConfig
from reference_engine.cuda_graphs import DECODE_MODES, ScratchSpace, StaticDecoder
from reference_engine.forward_batch import ForwardBatch
from reference_engine.model.eager_ops import forced_backend
from reference_engine.ops.backend import select_ops
from reference_engine.ops.host_values import one_forward
from reference_engine.prefill_graphs import PrefillGraphs
from reference_engine.sampler import Sampler, SamplingRow
from reference_engine.scheduler import SchedulerOutput


@dataclass(frozen=True)
class DecodeLaunch:
    """A decode step in flight: its sampled tokens are on their way to `host` (pinned on CUDA) until `event`."""

    num_seqs: int
    tokens: torch.Tensor  # [B] int64 on the device: this step's sampled tokens (a following step's input ids)
    host: torch.Tensor  # [B] int64 on the host, valid once `event` has completed
    event: torch.cuda.Event | None  # None on the CPU (the copy has run)


class ModelRunner:
    def __init__(
        self, model, config: EngineConfig, num_blocks: int, decode_mode: str = "auto", use_triton: bool = True, prefill_graphs: bool | None = None
    ) -> None:
        """prefill_graphs: one fresh prompt's prefill through `PrefillGraphs` (None: when decode_mode is "graphs";
        True with decode_mode "static" runs its padded forward eagerly, for tests)."""
        self.model = model
        self.config = config
        self.device = torch.device(model.device)
        if decode_mode == "auto":
            decode_mode = "graphs" if self.device.type == "cuda" else "eager"
        if decode_mode not in DECODE_MODES:
            raise ValueError(
                f"decode_mode must be 'auto' or one of {DECODE_MODES}, got {decode_mode!r}"
            )
        self.decode_mode = decode_mode
        self.use_triton = use_triton  # False: torch ops everywhere, the eager prefill too (the accuracy gate's plain path)
        # one more block and slot than the scheduler owns: the scratch space of padding rows
        self.caches = ModelCaches.allocate(
            model.config,
            num_blocks + 1,
            config.block_size,
            config.max_num_seqs + 1,
            device=self.device,
            dtype=model.dtype,
        )
        self.decoder: StaticDecoder | None = None
        self.ops = None  # ops.backend.OpSet of the static decode path
        if decode_mode != "eager":
            self.ops = select_ops(str(self.device), use_triton=use_triton)  # Triton kernels on CUDA where they import
            self.decoder = StaticDecoder(
                model, self.caches, config.max_num_seqs, -(-config.max_model_len // config.block_size),
                ScratchSpace(block=num_blocks, slot=config.max_num_seqs, block_size=config.block_size), use_graphs=decode_mode == "graphs", ops=self.ops,
            )  # fmt: skip
        if prefill_graphs is None:
            prefill_graphs = decode_mode == "graphs"
        self.prefill_graphs: PrefillGraphs | None = None
        if prefill_graphs:
            if decode_mode == "eager":
                raise ValueError("prefill_graphs needs decode_mode 'static' or 'graphs' (they own the scratch block and slot)")
            self.prefill_graphs = PrefillGraphs(
                model, self.caches, config.max_num_batched_tokens, -(-config.max_model_len // config.block_size),
                ScratchSpace(block=num_blocks, slot=config.max_num_seqs, block_size=config.block_size), use_graphs=decode_mode == "graphs",
            )  # fmt: skip
        self.last_logits: torch.Tensor | None = (
            None  # [S, V] float32 of the last step (tests and accuracy gates read it)
        )
        tokens, seqs = config.max_num_batched_tokens, config.max_num_seqs
        self._input_ids = torch.zeros(
            tokens, dtype=torch.int64, device=self.device
        )  # [T_max]
        self._positions = torch.zeros(
            tokens, dtype=torch.int64, device=self.device
        )  # [T_max]
        self._slot_mapping = torch.zeros(
            tokens, dtype=torch.int64, device=self.device
        )  # [T_max]
        self._cu_seqlens = torch.zeros(
            seqs + 1, dtype=torch.int32, device=self.device
        )  # [B_max + 1]
        self._seq_lens = torch.zeros(
            seqs, dtype=torch.int32, device=self.device
        )  # [B_max]
        self._state_slots = torch.zeros(
            seqs, dtype=torch.int64, device=self.device
        )  # [B_max]
        self._has_initial_state = torch.zeros(
            seqs, dtype=torch.bool, device=self.device
        )  # [B_max]
        self.sampler = Sampler(self.device, seqs, graphs=decode_mode == "graphs")  # sampler graphs for the decode graphs' logits
        # sampled tokens of launched decode steps, two host buffers used in turn (a step's tokens are read while the
        # next step, launched before that read, copies its own)
        self._token_hosts = tuple(torch.zeros(seqs, dtype=torch.int64, pin_memory=self.device.type == "cuda") for _ in range(2))
        self._token_turn = 0

    def _fill(self, buffer: torch.Tensor, values: list) -> torch.Tensor:
        view = buffer[: len(values)]
        view.copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
        return view

    def prepare(self, plan: SchedulerOutput) -> ForwardBatch:
        chunks = plan.chunks
        if not chunks:
            raise ValueError("the plan schedules no tokens")
        if (
            plan.num_tokens > self._input_ids.shape[0]
            or len(chunks) > self._seq_lens.shape[0]
        ):
            raise ValueError(
                f"the plan ({plan.num_tokens} tokens, {len(chunks)} sequences) exceeds the runner's buffers"
            )
        input_ids, positions, slots, cu_seqlens, logits_indices = [], [], [], [0], []
        for chunk in chunks:
            input_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, chunk.seq_len))
            slots.extend(chunk.slot_mapping)
            cu_seqlens.append(cu_seqlens[-1] + len(chunk.token_ids))
            if chunk.samples:
                logits_indices.append(cu_seqlens[-1] - 1)
        width = max(len(chunk.block_table) for chunk in chunks)
        tables = [
            list(chunk.block_table) + [-1] * (width - len(chunk.block_table))
            for chunk in chunks
        ]
        return ForwardBatch(
            input_ids=self._fill(self._input_ids, input_ids),  # [T]
            positions=self._fill(self._positions, positions),  # [T]
            cu_seqlens_q=self._fill(self._cu_seqlens, cu_seqlens),  # [B + 1]
            seq_lens=self._fill(
                self._seq_lens, [chunk.seq_len for chunk in chunks]
            ),  # [B]
            block_tables=torch.tensor(
                tables, dtype=torch.int32, device=self.device
            ),  # [B, max_blocks]
            slot_mapping=self._fill(self._slot_mapping, slots),  # [T]
            state_slots=self._fill(
                self._state_slots, [chunk.state_slot for chunk in chunks]
            ),  # [B]
            has_initial_state=self._fill(
                self._has_initial_state, [chunk.has_initial_state for chunk in chunks]
            ),  # [B]
            logits_indices=torch.tensor(
                logits_indices, dtype=torch.int64, device=self.device
            ),  # [S]
            is_decode=plan.is_decode,
        )

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write: copy whole KV blocks (src -> dst) in every attention layer."""
        if not copies:
            return
        source = torch.tensor(
            [s for s, _ in copies], dtype=torch.int64, device=self.device
        )
        destination = torch.tensor(
            [d for _, d in copies], dtype=torch.int64, device=self.device
        )
        for layer in self.caches.k_cache:
            self.caches.k_cache[layer].index_copy_(
                0, destination, self.caches.k_cache[layer].index_select(0, source)
            )
            self.caches.v_cache[layer].index_copy_(
                0, destination, self.caches.v_cache[layer].index_select(0, source)
            )

    @torch.inference_mode()
    def execute(
        self, plan: SchedulerOutput, rows: list[SamplingRow]
    ) -> tuple[list[int], list[dict[int, float] | None]]:
        """Run one step; `rows` holds the sampling settings of the sampled chunks, in plan order."""
        if len(rows) != sum(chunk.samples for chunk in plan.chunks):
            raise ValueError(
                f"{len(rows)} sampling rows for {sum(c.samples for c in plan.chunks)} sampled chunks"
            )
        self.copy_blocks(plan.block_copies)
        if self.decoder is not None and self.decoder.accepts(plan):
            logits, greedy_tokens = self.decoder.run(plan)  # [B, V] float32, [B] int64
            self.last_logits = logits
            if all(
                row.temperature == 0
                and not row.banned_token_ids
                and row.num_logprobs is None
                for row in rows
            ):
                return greedy_tokens.tolist(), [None] * len(
                    rows
                )  # the only host sync of a greedy decode step
            return self.sampler(logits, rows, static=self.decoder.use_graphs)
        if self.prefill_graphs is not None and self.prefill_graphs.accepts(plan):  # one fresh prompt: a bucket's graph
            with forced_backend("torch") if not self.use_triton else contextlib.nullcontext():
                logits = self.prefill_graphs.run(plan)  # [1, V] float32
            self.last_logits = logits
            return self.sampler(logits, rows)
        batch = self.prepare(plan)
        with forced_backend("torch") if not self.use_triton else contextlib.nullcontext(), one_forward():  # Triton on CUDA unless use_triton
            logits = self.model.forward(batch, self.caches)  # [S, V] float32; batch metadata read to the host once (ops/host_values.py)
        self.last_logits = logits
        return self.sampler(logits, rows)

    def can_launch_decode(self, plan: SchedulerOutput, rows: list[SamplingRow]) -> bool:
        """Whether `launch_decode` takes this step: a static decode step whose rows ask for no logprobs and ban no ids."""
        return (
            self.decoder is not None
            and self.decoder.accepts(plan)
            and len(rows) == len(plan.chunks)
            and all(not row.banned_token_ids and row.num_logprobs is None for row in rows)
        )

    @torch.inference_mode()
    def launch_decode(self, plan: SchedulerOutput, rows: list[SamplingRow], after: DecodeLaunch | None = None,
                      after_rows: list[int] | None = None) -> DecodeLaunch:  # fmt: skip
        """Queue a decode step and its sampling without waiting for them; `collect` returns its tokens.

        after: the step in flight whose sampled tokens are this step's input ids (the plan's token ids are then
        placeholders): the copy runs on the device in stream order, so the host need not know them. after_rows: which
        rows of `after` feed this step's rows, in order (default: all of them, row for row), where `after` held
        sequences that have since finished. `last_logits` becomes this step's logits buffer, which the next decode step
        overwrites."""
        if after is not None:
            feeding = range(after.num_seqs) if after_rows is None else after_rows
            if len(feeding) != len(plan.chunks):
                raise ValueError(f"a step of {len(plan.chunks)} sequences cannot take its input ids from {len(feeding)} rows of a step")
            if not all(0 <= row < after.num_seqs for row in feeding):
                raise ValueError(f"after_rows {after_rows} must lie in [0, {after.num_seqs})")
        elif after_rows is not None:
            raise ValueError("after_rows needs the step `after`")
        if not self.can_launch_decode(plan, rows):
            raise ValueError("launch_decode takes static decode steps whose rows ask for no logprobs and ban no ids (check can_launch_decode)")
        self.copy_blocks(plan.block_copies)
        input_ids = None
        if after is not None:
            input_ids = after.tokens
            if after_rows is not None:  # a gather on the device, its index through pinned memory (no stream sync)
                index = torch.tensor(after_rows, dtype=torch.int64)
                if self.device.type == "cuda":
                    index = index.pin_memory().to(self.device, non_blocking=True)
                input_ids = input_ids.index_select(0, index)
        logits, tokens = self.decoder.run(plan, input_ids=input_ids)  # [B, V], [B]
        self.last_logits = logits
        if any(row.temperature != 0 for row in rows):
            tokens = self.sampler.launch(logits, rows, static=self.decoder.use_graphs)  # [B] on the device, no host read
        host = self._token_hosts[self._token_turn][: len(plan.chunks)]
        self._token_turn ^= 1
        host.copy_(tokens, non_blocking=host.is_pinned())
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return DecodeLaunch(len(plan.chunks), tokens, host, event)

    def collect(self, launch: DecodeLaunch) -> list[int]:
        """The sampled tokens of a launched decode step (waits for that step only)."""
        if launch.event is not None:
            launch.event.synchronize()
        return launch.host.tolist()
