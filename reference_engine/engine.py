"""The step loop: requests in, one scheduler plan and one model step per `step()`, outputs out.

Stop conditions, checked after every sampled token: a stop token of the request or an
end-of-sequence token (unless `ignore_eos`), both only once `min_tokens` tokens exist (before
that they are masked out of sampling), and `max_tokens`.
"""

from __future__ import annotations

import itertools

import torch

from reference_engine.config import EngineConfig
from reference_engine.detokenizer import IncrementalText
from reference_engine.outputs import CompletionOutput, RequestOutput
from reference_engine.runner import DecodeLaunch, ModelRunner
from reference_engine.sampler import SamplingRow
from reference_engine.sampling_params import SamplingParams
from reference_engine.scheduler import Scheduler, SchedulerOutput
from reference_engine.sequence import Sequence, SequenceStatus


def default_num_blocks(model, config: EngineConfig) -> int:
    """Enough blocks for max_num_seqs sequences of max_model_len tokens, fewer when device memory is short.

    More would never be used: admission reserves each request's worst case and at most
    max_num_seqs requests run at once.
    """
    per_sequence = -(-config.max_model_len // config.block_size)
    wanted = config.max_num_seqs * per_sequence
    device = torch.device(model.device)
    if device.type != "cuda":
        return wanted
    from reference_engine.cache.tensors import ModelCaches

    free, total = torch.cuda.mem_get_info(device)
    budget = int(total * config.gpu_memory_utilization) - (total - free)
    budget -= (config.max_num_seqs + 1) * ModelCaches.bytes_per_state_slot(model.config, model.dtype)
    budget -= config.max_num_batched_tokens * model.config.hidden_size * 64 + config.max_num_seqs * model.config.vocab_size * 8
    affordable = budget // ModelCaches.bytes_per_block(model.config, config.block_size, model.dtype) - 1  # the runner's scratch block
    if affordable < per_sequence:
        raise ValueError(
            f"not enough device memory for one sequence of max_model_len={config.max_model_len}: "
            f"{max(budget, 0) / 1e9:.2f} GB left for the KV cache; lower max_model_len or max_num_seqs"
        )
    return int(min(wanted, affordable))


def _nvfp4_linears(model, lm_head: bool = True):
    """The model's NVFP4 projections the batch-1 GEMV reads: each layer's mixer linears (stacked ones included) and,
    with `lm_head`, an NVFP4 LM head."""
    for layer in model.layers:
        for value in vars(layer.mixer).values():
            if getattr(value, "weight_packed", None) is not None:
                yield value
    if lm_head and getattr(model.lm_head, "weight_packed", None) is not None:
        yield model.lm_head


def attach_tiled_copies(model, max_batch: int, decode_mode: str = "auto", use_triton: bool = True) -> int:
    """On CUDA with the Triton kernels, where the card's tuning asks for them: tile-major copies of every MoE block's
    experts for the grouped decode kernels (`moe_grouped_half.wants_tiled`, held by the blocks), and of the layers'
    NVFP4 projections for the batch-1 GEMV (`nvfp4_gemv.TILED_COPIES`, kept by that module) and for the decode-batch
    GEMM's tiles (`nvfp4_gemm.TILED_SMALL_M`, kept there too); not of an NVFP4 LM head, whose GEMV on a copy is untimed.
    Returns the bytes added."""
    device = torch.device(model.device)
    if decode_mode == "eager" or not use_triton or device.type != "cuda":
        return 0
    from reference_engine.ops.backend import select_ops

    if select_ops(str(device), use_triton=True).backends.get("moe_block_decode") != "triton":  # also applies the card's tuning
        return 0
    from reference_engine.kernels import moe_grouped_half, nvfp4_gemm, nvfp4_gemv

    added = 0
    if moe_grouped_half.wants_tiled(max_batch):
        before = model.nbytes()
        for layer in model.layers:
            layer.mlp.attach_tiled(moe_grouped_half.tile_experts)
        added += model.nbytes() - before
    if nvfp4_gemv.TILED_COPIES:  # not the NVFP4 LM head's: its GEMV on a copy is untimed (`time_gemv_tiled.py --lm-head`)
        added += sum(nvfp4_gemv.register_tiled_copy(linear.weight_packed, linear.weight_scale) for linear in _nvfp4_linears(model, lm_head=False))
    if nvfp4_gemm.TILED_SMALL_M and max_batch >= nvfp4_gemv.GEMM_MIN_TOKENS:
        added += sum(nvfp4_gemm.register_tiled_copies(linear.weight_packed, linear.weight_scale, max_batch) for linear in _nvfp4_linears(model, lm_head=False))
    return added


class LLMEngine:
    def __init__(self, model, tokenizer, config: EngineConfig, decode_mode: str = "auto", use_triton: bool = True,
                 prefill_graphs: bool | None = None) -> None:  # fmt: skip
        """decode_mode: "auto" (CUDA graphs on CUDA, eager on the CPU), "eager", "static" or "graphs" (see runner.py);
        use_triton: the static decode path calls Triton kernels on CUDA where they exist (ops/backend.py);
        prefill_graphs: a fresh prompt's prefill padded to a bucket and replayed from a graph (None: with "graphs")."""
        self.model, self.tokenizer, self.config = model, tokenizer, config
        attach_tiled_copies(model, config.max_num_seqs, decode_mode, use_triton)  # before the cache takes the memory left
        num_blocks = config.num_blocks if config.num_blocks is not None else default_num_blocks(model, config)
        self.runner = ModelRunner(model, config, num_blocks, decode_mode=decode_mode, use_triton=use_triton, prefill_graphs=prefill_graphs)
        self.scheduler = Scheduler(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            num_blocks=num_blocks,
            block_size=config.block_size,
        )
        self.eos_token_ids = tuple(getattr(tokenizer, "eos_token_ids", ()) or model.config.eos_token_ids)
        self._seed_generator = torch.Generator().manual_seed(config.seed)  # seeds of unseeded requests
        self._ids = itertools.count()
        self._texts: dict[str, IncrementalText] = {}  # request id -> its output text so far, until it finishes
        self.async_decode = config.async_decode  # see step(); a plain attribute, so a benchmark can time both ways
        self._ahead: tuple[SchedulerOutput, DecodeLaunch] | None = None  # a decode step launched before its inputs were read

    # Requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str | None = None, prompt: str | None = None, params: SamplingParams | None = None,
                    prompt_token_ids: list[int] | None = None) -> str:
        params = params or SamplingParams()
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompt (text) and prompt_token_ids")
        ids = tuple(self.tokenizer.encode(prompt)) if prompt is not None else tuple(int(i) for i in prompt_token_ids)
        vocab_size = self.model.config.vocab_size
        if any(not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"prompt token ids must lie in [0, {vocab_size}), got {[i for i in ids if not 0 <= i < vocab_size][:5]}")
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seed_generator))
        self.scheduler.add(Sequence(request_id, ids, params, seed=seed, prompt=prompt))
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> RequestOutput:
        """Stop a request now; its blocks and state slot return to the pools. Returns its final output."""
        return self._output(self.scheduler.abort(str(request_id)))

    # Steps -----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One model step; returns the outputs of the requests that produced a token (finished ones included).

        With `async_decode`, a decode step is followed at once by the next one for its sequences that go on (not
        finished, not at max_tokens), launched before this step's tokens reach the host (the device feeds them in): the
        host's scheduling and bookkeeping then run while the device computes. A step already launched that way is the
        one the next call returns. Prefill, logprobs, min_tokens bans and admissions run synchronously."""
        plan = None
        if self._ahead is not None:
            plan, launch = self._ahead
            self._ahead = None
            sampled = [self.scheduler.get(chunk.request_id) for chunk in plan.chunks]  # None: finished since the launch
            if not any(sampled):  # every request of the step launched ahead has finished: drop it
                self.runner.collect(launch)
                plan = None
        if plan is None:
            plan = self.scheduler.schedule()
            if not plan.chunks:
                if self.scheduler.has_unfinished():
                    raise RuntimeError("the scheduler planned nothing although requests are waiting (a scheduling bug)")
                return []
            sampled = [self.scheduler.get(chunk.request_id) for chunk in plan.chunks if chunk.samples]
            rows = [self._row(seq) for seq in sampled]
            if not (self.async_decode and self.runner.can_launch_decode(plan, rows)):
                tokens, logprobs = self.runner.execute(plan, rows)
                self.scheduler.commit(plan)
                return self._advance(sampled, tokens, logprobs)
            launch = self.runner.launch_decode(plan, rows)
        self.scheduler.commit(plan)
        live_rows = [row for row, seq in enumerate(sampled) if seq is not None and seq.status is SequenceStatus.RUNNING
                     and len(seq.output_token_ids) + 2 <= seq.params.max_tokens]  # runs on after its pending token  # fmt: skip
        if live_rows and self._can_go_ahead([sampled[row] for row in live_rows]):
            ahead = self.scheduler.schedule_decode_ahead(plan, live_rows)
            rows = [self._row(sampled[row], pending=1) for row in live_rows]
            remap = None if len(live_rows) == len(sampled) else live_rows  # rows of requests finished since the launch drop out
            self._ahead = (ahead, self.runner.launch_decode(ahead, rows, after=launch, after_rows=remap))
        tokens = self.runner.collect(launch)
        live = [(seq, token) for seq, token in zip(sampled, tokens) if seq is not None and seq.status is SequenceStatus.RUNNING]
        return self._advance([seq for seq, _ in live], [token for _, token in live], [None] * len(live))

    def _can_go_ahead(self, seqs: list[Sequence]) -> bool:
        """Whether the decode step after a launched one may start before its tokens are read, for these running
        sequences, which continue after their pending token: min_tokens bans nothing in it, none asks for logprobs, and
        no waiting request would join it."""
        for seq in seqs:
            if len(seq.output_token_ids) + 1 < seq.params.min_tokens or seq.params.logprobs is not None:
                return False
        return not self.scheduler.admits_next()

    def _advance(self, sampled: list[Sequence], tokens: list[int], logprobs: list) -> list[RequestOutput]:
        """Append each sampled token, apply the stop conditions; the outputs of these requests."""
        outputs = []
        for seq, token, logprob in zip(sampled, tokens, logprobs):
            seq.output_token_ids.append(int(token))
            if logprob is not None:
                seq.logprobs.append(logprob)
            reason = seq.stop_reason_after(int(token), self.eos_token_ids)
            if reason is not None:
                self.scheduler.finish(seq, reason)
            outputs.append(self._output(seq))
        return outputs

    def _row(self, seq: Sequence, pending: int = 0) -> SamplingRow:
        """The sampling settings of `seq`'s next token; pending: tokens sampled but not yet read (async decoding)."""
        params = seq.params
        generated = len(seq.output_token_ids) + pending
        banned: tuple[int, ...] = ()
        if generated < params.min_tokens:
            banned = tuple(params.stop_token_ids or ()) + (() if params.ignore_eos else self.eos_token_ids)
        return SamplingRow(
            temperature=float(params.temperature),
            top_k=params.top_k_or_disabled,
            top_p=float(params.top_p),
            seed=(seq.seed + generated) % 2**63,
            banned_token_ids=banned,
            num_logprobs=params.logprobs,
        )

    def _output(self, seq: Sequence) -> RequestOutput:
        texts = self._texts.get(seq.request_id)
        if texts is None:
            texts = self._texts[seq.request_id] = IncrementalText(self.tokenizer)
        finished = seq.status is SequenceStatus.FINISHED
        if finished:
            del self._texts[seq.request_id]
        completion = CompletionOutput(
            index=0,
            text=texts.text(seq.output_token_ids),  # tokenizer.decode(output ids), without decoding them all each step
            token_ids=tuple(seq.output_token_ids),
            finish_reason=seq.finish_reason if finished else None,
            logprobs=tuple(seq.logprobs) if seq.params.logprobs is not None else None,
            stop_reason=seq.stop_reason if seq.finish_reason == "stop" else None,
        )
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [completion])
