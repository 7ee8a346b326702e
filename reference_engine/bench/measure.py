"""This engine's latency and throughput: TTFT, TPOT at batch 1, decode output tokens/s at several batch sizes.

Each engine step ends by reading the sampled tokens to the host, so a host clock around
`runner.execute` (synchronised before the start) times whole steps. A `StepRecorder` wraps the
runner and records (decode?, sequences, seconds) per step.
- TTFT: one request of `prompt_tokens` random ids, max_tokens 1: the prefill step(s); median of repeats.
- TPOT at batch 1: median seconds of the decode steps of one request (prompt `prompt_tokens`).
- Output tokens/s at batch B: B requests of `batch_prompt_tokens` ids generating `output_tokens`
  each (ignore_eos): decode tokens over the time of the decode steps that ran all B sequences.
Each batch size is warmed up first (a short run at that size), so graph capture is not timed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from reference_engine.bench.timing import synchronize
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepRecord:
    is_decode: bool
    num_seqs: int
    seconds: float


class StepRecorder:
    def __init__(self, runner, device: torch.device) -> None:
        self.runner, self.device = runner, device
        self.records: list[StepRecord] = []

    def execute(self, plan, rows):
        synchronize(self.device)
        begin = time.perf_counter()
        result = self.runner.execute(
            plan, rows
        )  # ends with the sampled tokens on the host
        self.records.append(
            StepRecord(plan.is_decode, len(plan.chunks), time.perf_counter() - begin)
        )
        return result

    def __getattr__(self, name):
        return getattr(self.runner, name)


@dataclass(frozen=True)
class EngineFigures:
    ttft_seconds: float
    ttft_samples: list
    tpot_seconds: float
    tpot_samples: int
    throughput: dict  # batch size -> {"tokens_per_second", "decode_steps", "step_seconds_median", "end_to_end_tokens_per_second"}
    prompt_tokens: int
    batch_prompt_tokens: int
    output_tokens: int
    decode_mode: str
    ttft_last_logits: torch.Tensor | None = (
        None  # [V] float32 on the CPU, the last prompt token's logits
    )

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("ttft_last_logits")
        return data


def _random_prompt(vocab: int, length: int, generator: torch.Generator) -> list[int]:
    return torch.randint(1, vocab, (length,), generator=generator).tolist()


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    begin = time.perf_counter()
    for prompt in prompts:
        engine.add_request(prompt_token_ids=prompt, params=params)
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - begin


def measure_engine(
    model,
    tokenizer,
    decode_mode: str,
    prompt_tokens: int = 1024,
    batch_prompt_tokens: int = 128,
    output_tokens: int = 256,
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64),
    ttft_repeats: int = 3,
    seed: int = 0,
    ttft_prompt: list[int] | None = None,
) -> EngineFigures:
    device = torch.device(model.device)
    dtype = str(model.dtype).removeprefix("torch.")
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    block_size = 16
    max_model_len = max(prompt_tokens, batch_prompt_tokens) + output_tokens + 1
    max_num_seqs = max(batch_sizes)
    num_blocks = max_num_seqs * -(-max_model_len // block_size)
    config = EngineConfig(
        device=str(device),
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=max(2048, prompt_tokens),
    )
    engine = LLMEngine(model, tokenizer, config, decode_mode=decode_mode)
    recorder = StepRecorder(engine.runner, device)
    engine.runner = recorder

    # TTFT (first run warms up kernels and allocator; not counted)
    ttft_samples, last_logits = [], None
    prompt = (
        list(ttft_prompt)
        if ttft_prompt is not None
        else _random_prompt(vocab, prompt_tokens, generator)
    )
    prompt_tokens = len(prompt)
    for repeat in range(ttft_repeats + 1):
        recorder.records.clear()
        _run(engine, [prompt], max_tokens=1)
        if repeat:
            ttft_samples.append(sum(r.seconds for r in recorder.records))
    last_logits = recorder.runner.last_logits[-1].detach().float().cpu()

    # TPOT at batch 1 (graph at bucket 1 captured by a 3-token warm-up)
    _run(engine, [prompt[:16]], max_tokens=3)
    recorder.records.clear()
    _run(engine, [prompt], max_tokens=output_tokens)
    decode_steps = [r.seconds for r in recorder.records if r.is_decode]
    tpot = statistics.median(decode_steps) if decode_steps else float("nan")

    throughput = {}
    for batch in batch_sizes:
        prompts = [
            _random_prompt(vocab, batch_prompt_tokens, generator) for _ in range(batch)
        ]
        _run(
            engine, [p[:16] for p in prompts], max_tokens=3
        )  # warm-up: capture this bucket's graph
        recorder.records.clear()
        wall = _run(engine, prompts, max_tokens=output_tokens)
        full = [
            r.seconds for r in recorder.records if r.is_decode and r.num_seqs == batch
        ]
        throughput[str(batch)] = {
            "tokens_per_second": batch * len(full) / sum(full)
            if full
            else float("nan"),
            "decode_steps": len(full),
            "step_seconds_median": statistics.median(full) if full else float("nan"),
            "end_to_end_tokens_per_second": batch * output_tokens / wall,
        }
    decoder = recorder.runner.decoder
    if decoder is not None and decoder.capture_error:
        decode_mode = f"static (graph capture failed: {decoder.capture_error})"
    elif decoder is not None and decoder.use_graphs:
        decode_mode = f"graphs (buckets captured: {list(decoder.captured_buckets)})"
    del engine, recorder, decoder
    return EngineFigures(
        statistics.median(ttft_samples),
        ttft_samples,
        tpot,
        len(decode_steps),
        throughput,
        prompt_tokens,
        batch_prompt_tokens,
        output_tokens,
        decode_mode,
        last_logits,
    )
