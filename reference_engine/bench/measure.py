"""This engine's latency and throughput: TTFT, TPOT at batch 1, decode output tokens/s at several batch sizes.

Each engine step ends by reading the sampled tokens to the host, so a host clock around
`runner.execute` (synchronised before the start) times whole steps. A `StepRecorder` wraps the
runner and records (decode?, sequences, seconds) per step. `EngineBench` holds one engine sized for
the largest batch and measures one figure per call, so a caller can save results as they come:
- TTFT: one request of the prompt, max_tokens 1: the prefill step(s); median of repeats after a warm-up.
- TPOT at batch 1: median seconds of the decode steps of one request (the same prompt).
- Output tokens/s at batch B: B requests of `batch_prompt_tokens` ids generating `output_tokens`
  each (ignore_eos): decode tokens over the time of the decode steps that ran all B sequences.
Each measurement is warmed up first (a short run at that batch size), so graph capture is not timed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from reference_engine.bench.timing import synchronize
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.sampling_params import SamplingParams

SAMPLED = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "seed": 0}  # the sampled TPOT: the settings the Qwen3 model cards suggest without thinking


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def graph_replay_seconds(decoder, bucket: int, replays: int = 50) -> float | None:
    """GPU time of one replay of `decoder`'s captured graph of `bucket` rows (CUDA events; None without that graph).

    Replays repeat the last step's inputs (the same cache rows are rewritten), so this is the device time of a step
    with no host work between steps: an engine step minus this is host overhead.
    """
    if decoder is None or decoder.device.type != "cuda" or bucket not in getattr(decoder, "_graphs", {}):
        return None
    graph = decoder._graphs[bucket]
    decoder.restage(bucket)  # the last step may have staged a smaller bucket's inputs
    for _ in range(3):
        graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / replays


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


class EngineBench:
    def __init__(self, model, tokenizer, decode_mode: str, prompt_tokens: int, batch_prompt_tokens: int, output_tokens: int,
                 max_batch: int, seed: int = 0, use_triton: bool = True) -> None:  # fmt: skip
        self.model, self.output_tokens, self.batch_prompt_tokens = (
            model,
            output_tokens,
            batch_prompt_tokens,
        )
        self.device = torch.device(model.device)
        self.generator = torch.Generator().manual_seed(seed)
        block_size = 16
        max_model_len = max(prompt_tokens, batch_prompt_tokens) + output_tokens + 1
        config = EngineConfig(
            device=str(self.device), dtype=str(model.dtype).removeprefix("torch."), max_num_seqs=max_batch, max_model_len=max_model_len,
            block_size=block_size, num_blocks=max_batch * -(-max_model_len // block_size), max_num_batched_tokens=max(2048, prompt_tokens),
        )  # fmt: skip
        self.engine = LLMEngine(model, tokenizer, config, decode_mode=decode_mode, use_triton=use_triton)
        self.recorder = StepRecorder(self.engine.runner, self.device)
        self.engine.runner = self.recorder

    def _random_prompt(self, length: int) -> list[int]:
        return torch.randint(
            1, self.model.config.vocab_size, (length,), generator=self.generator
        ).tolist()

    def _run(self, prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        begin = time.perf_counter()
        for prompt in prompts:
            self.engine.add_request(prompt_token_ids=prompt, params=params)
        while self.engine.has_unfinished():
            self.engine.step()
        return time.perf_counter() - begin

    def ttft(self, prompt: list[int], repeats: int = 3) -> tuple[dict, torch.Tensor]:
        """TTFT figures and the last prompt token's logits [V] float32 (CPU)."""
        samples = []
        for repeat in range(
            repeats + 1
        ):  # the first run warms up kernels and the allocator
            self.recorder.records.clear()
            self._run([prompt], max_tokens=1)
            if repeat:
                samples.append(sum(r.seconds for r in self.recorder.records))
        last_logits = self.recorder.runner.last_logits[-1].detach().float().cpu()
        return {
            "seconds": statistics.median(samples),
            "samples": samples,
            "prompt_tokens": len(prompt),
        }, last_logits

    def tpot(self, prompt: list[int]) -> dict:
        """Median decode step of one request: the runner's step (inputs, graph replay, token to host), the whole
        engine step (plus scheduler and output bookkeeping), and the GPU time of the batch-1 graph alone."""
        self._run([prompt[:16]], max_tokens=3)  # warm-up: captures the batch-1 graph
        self.recorder.records.clear()
        params = SamplingParams(temperature=0, max_tokens=self.output_tokens, ignore_eos=True)
        self.engine.add_request(prompt_token_ids=prompt, params=params)
        engine_steps = []
        while self.engine.has_unfinished():
            before = len(self.recorder.records)
            begin = time.perf_counter()
            self.engine.step()
            elapsed = time.perf_counter() - begin
            if len(self.recorder.records) > before and self.recorder.records[-1].is_decode:
                engine_steps.append(elapsed)
        steps = [r.seconds for r in self.recorder.records if r.is_decode]
        replay = self.graph_replay_seconds(1)  # before the async runs: their steps leave placeholder ids on the host
        sampled = SamplingParams(**SAMPLED, max_tokens=self.output_tokens, ignore_eos=True)
        return {"seconds": statistics.median(steps) if steps else float("nan"), "decode_steps": len(steps), "prompt_tokens": len(prompt),
                "output_tokens": self.output_tokens, "engine_step_seconds": statistics.median(engine_steps) if engine_steps else float("nan"),
                "async_engine_step_seconds": _median(self._engine_steps([prompt])),
                "sampled_engine_step_seconds": _median(self._engine_steps([prompt], sampled, async_decode=False)),
                "async_sampled_engine_step_seconds": _median(self._engine_steps([prompt], sampled)),
                "sampling": SAMPLED, "graph_replay_seconds": replay}  # fmt: skip

    def _engine_steps(self, prompts: list[list[int]], params: SamplingParams | None = None, async_decode: bool = True) -> list[float]:
        """Seconds of each engine step that returned a decode token for every prompt, with async decoding unless told
        (each step is launched before the previous one's tokens are read, so a step's time is the interval between
        tokens); greedy unless `params`; empty where the engine has no static decode path."""
        engine = self.engine
        if engine.runner.decoder is None:
            return []
        params = params or SamplingParams(temperature=0, max_tokens=self.output_tokens, ignore_eos=True)
        engine.async_decode = async_decode
        try:
            ids = {engine.add_request(prompt_token_ids=prompt, params=params) for prompt in prompts}
            steps = []
            while engine.has_unfinished():
                begin = time.perf_counter()
                outputs = engine.step()
                elapsed = time.perf_counter() - begin
                decoded = [o for o in outputs if o.request_id in ids and len(o.outputs[0].token_ids) > 1]
                if len(decoded) == len(prompts):
                    steps.append(elapsed)
        finally:
            engine.async_decode = False
        return steps[1:]  # the first decode step waits for its own tokens (none was launched before it)

    def graph_replay_seconds(self, bucket: int, replays: int = 50) -> float | None:
        """GPU time of one replay of this engine's decode graph of `bucket` rows (see `graph_replay_seconds`)."""
        return graph_replay_seconds(self.recorder.runner.decoder, bucket, replays)

    def throughput(self, batch: int) -> dict:
        prompts = [self._random_prompt(self.batch_prompt_tokens) for _ in range(batch)]
        # Warm-up with the timed prompts' lengths: captures this bucket's graph and compiles the kernels of a prefill of
        # this many prompt tokens (run69 warmed up on 16-token prompts; its end-to-end rates then held 2.3 to 9.3 s outside
        # the decode steps, e.g. 675 tok/s end to end against 2,842 in the decode steps at batch 32).
        # It must also reach a decode step of the whole batch, which records that bucket's graph: with chunked prefill the
        # batch decodes together only after ceil(batch * prompt tokens / token budget) prefill steps (run71 warmed up with
        # 3 output tokens, so batches 32 and 64 first decoded together, and captured, inside the timed run: 632 tok/s
        # against 2,640 in the async run after it).
        prefill_steps = -(-batch * self.batch_prompt_tokens // self.engine.scheduler.max_num_batched_tokens)
        self._run([self._random_prompt(self.batch_prompt_tokens) for _ in range(batch)], max_tokens=prefill_steps + 2)  # other prompts, same lengths
        decoder = self.recorder.runner.decoder
        captured = getattr(decoder, "captured_buckets", ())
        self.recorder.records.clear()
        wall = self._run(prompts, max_tokens=self.output_tokens)
        captured_in_timed_run = getattr(decoder, "captured_buckets", ()) != captured
        # Before the async run: its steps take their ids on the device, so the host holds placeholders (-1) for them;
        # run71 to run73 replayed those, every row the same token, all routed to the same experts (batch 32: 16.0 ms a
        # replay against 12.4 ms steps; batch 8: 5.19 against 5.77, fewer experts read).
        replay = self.graph_replay_seconds(next((b for b in getattr(decoder, "buckets", ()) if b >= batch), batch))
        full = [
            r.seconds
            for r in self.recorder.records
            if r.is_decode and r.num_seqs == batch
        ]
        async_steps = self._engine_steps(prompts)
        return {
            "async_tokens_per_second": batch * len(async_steps) / sum(async_steps) if async_steps else None,
            "tokens_per_second": batch * len(full) / sum(full)
            if full
            else float("nan"),
            "decode_steps": len(full),
            "step_seconds_median": statistics.median(full) if full else float("nan"),
            "graph_replay_seconds": replay,
            "end_to_end_tokens_per_second": batch * self.output_tokens / wall,
            "slowest_step_seconds": sorted(full)[-3:],
            "graph_captured_in_timed_run": captured_in_timed_run,
            "prompt_tokens": self.batch_prompt_tokens,
            "output_tokens": self.output_tokens,
        }

    def prefill_mode(self) -> str:
        graphs = getattr(self.recorder.runner, "prefill_graphs", None)
        if graphs is None:
            return "eager"
        if graphs.capture_error:
            return f"padded, eager (graph capture failed: {graphs.capture_error})"
        if graphs.use_graphs:
            return f"graphs, prompt lengths padded to multiples of {graphs.bucket_tokens} (buckets captured: {list(graphs.captured_buckets)})"
        return f"padded to multiples of {graphs.bucket_tokens}, eager"

    def decode_mode(self) -> str:
        decoder = self.recorder.runner.decoder
        if decoder is None:
            return "eager"
        if decoder.capture_error:
            return f"static (graph capture failed: {decoder.capture_error})"
        if decoder.use_graphs:
            return f"graphs (buckets captured: {list(decoder.captured_buckets)})"
        return "static"
