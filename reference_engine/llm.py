"""The offline entry point, shaped like vLLM's: `LLM(model=...)` then `generate(...)` or `stream(...)`.

    llm = LLM(model="tiny")                      # or "full", or a checkpoint directory
    outputs = llm.generate(["Hello", "The sea"], SamplingParams(temperature=0, max_tokens=8))
    for text in llm.stream("Hello", SamplingParams(max_tokens=8)):
        print(text, end="")
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.outputs import RequestOutput
from reference_engine.sampling_params import SamplingParams
from reference_engine.tokenizer import TextTokenizer, load_tokenizer

PRESET_NAMES = ("tiny", "full")


def load_engine_model(model: str | Path, device: str, dtype: torch.dtype, seed: int, quantize: str | None = None, progress: bool = False):
    """A preset name builds seeded random weights (NVFP4 linears with quantize="nvfp4"); anything else is a checkpoint directory."""
    if str(model) in PRESET_NAMES:
        from reference_engine.presets import build_preset

        return build_preset(str(model), device=device, dtype=dtype, seed=seed, quantize=quantize)
    if quantize is not None:
        raise ValueError("quantize applies to the presets only; quantize a checkpoint with `toolbox engine quantize` first")
    path = Path(model)
    if not path.exists():
        raise ValueError(f"model {str(model)!r} is neither a preset ({', '.join(PRESET_NAMES)}) nor an existing checkpoint directory")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json, so it is not a checkpoint directory")
    from reference_engine.loader import load_model

    return load_model(path, dtype=dtype, device=device, progress=progress)


class LLM:
    def __init__(
        self,
        model: str | Path = "tiny",
        device: str = "cpu",
        dtype: str = "float32",
        max_num_seqs: int = 8,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        num_blocks: int | None = None,
        block_size: int = 16,
        seed: int = 0,
        gpu_memory_utilization: float = 0.85,
        tokenizer: TextTokenizer | None = None,
        quantize: str | None = None,
        async_decode: bool = True,
    ) -> None:
        """async_decode: launch each decode step before the previous one's tokens reach the host (CUDA graph and
        static decode steps; see `LLMEngine.step`)."""
        probe = EngineConfig(device=device, dtype=dtype, block_size=block_size, seed=seed)  # validates device and dtype early
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was asked for, but this machine has no CUDA device (use device='cpu')")
        if tokenizer is None:
            if str(model) not in PRESET_NAMES and Path(model).is_dir() and not (Path(model) / "tokenizer.json").is_file():
                raise ValueError(f"{model} has no tokenizer.json; pass tokenizer=TextTokenizer.from_dir(...) or use a full checkpoint")
            tokenizer = load_tokenizer(model) if str(model) in PRESET_NAMES or Path(model).is_dir() else None
        self.model = load_engine_model(model, device, probe.torch_dtype, seed, quantize=quantize)
        max_model_len = max_model_len or min(4096, self.model.config.max_position_embeddings)
        self.config = EngineConfig(
            device=device,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            block_size=block_size,
            num_blocks=num_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_batched_tokens=max_num_batched_tokens or max(2048, max_num_seqs),
            seed=seed,
            async_decode=async_decode,
        )
        self.tokenizer = tokenizer
        if self.tokenizer.vocab_size > self.model.config.vocab_size:
            raise ValueError(f"the tokenizer has {self.tokenizer.vocab_size} tokens, the model only {self.model.config.vocab_size}")
        self.engine = LLMEngine(self.model, self.tokenizer, self.config)

    def _requests(self, prompts, sampling_params, prompt_token_ids) -> list[tuple[str | None, list[int] | None, SamplingParams]]:
        if prompts is not None and prompt_token_ids is not None:
            raise ValueError("give prompts or prompt_token_ids, not both")
        if prompts is None and prompt_token_ids is None:
            raise ValueError("give prompts (text) or prompt_token_ids")
        if prompts is not None:
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("prompts must be a string or a list of strings")
            items: list[tuple[str | None, list[int] | None]] = [(t, None) for t in texts]
        else:
            ids = list(prompt_token_ids)
            batch = [ids] if ids and isinstance(ids[0], int) else ids
            items = [(None, list(p)) for p in batch]
        if sampling_params is None:
            params = [SamplingParams()] * len(items)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise ValueError(f"{len(params)} sampling params for {len(items)} prompts")
        return [(text, ids, p) for (text, ids), p in zip(items, params)]

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt with continuous batching; outputs come back in input order."""
        added: list[str] = []
        try:
            for text, ids, params in self._requests(prompts, sampling_params, prompt_token_ids):
                added.append(self.engine.add_request(prompt=text, prompt_token_ids=ids, params=params))
        except Exception:
            for request_id in added:
                self.engine.abort(request_id)
            raise
        finished: dict[str, RequestOutput] = {}
        wanted = set(added)
        with tqdm(total=len(added), desc="generating", unit="req", disable=not use_tqdm) as bar:
            while wanted - finished.keys():
                for output in self.engine.step():
                    if output.finished and output.request_id in wanted:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in added]

    def stream(
        self,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> Iterator[str]:
        """Yield the text of one request piece by piece as tokens are produced."""
        for piece, _ in self.stream_outputs(prompt, sampling_params, prompt_token_ids):
            if piece:
                yield piece

    def stream_outputs(
        self,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> Iterator[tuple[str, RequestOutput]]:
        """Yield (new text, output so far) after every token of one request; the request is aborted if the caller stops early."""
        request_id = self.engine.add_request(prompt=prompt, prompt_token_ids=prompt_token_ids, params=sampling_params)
        emitted, done = "", False
        try:
            while not done:
                for output in self.engine.step():
                    if output.request_id != request_id:
                        continue
                    text, done = output.outputs[0].text, output.finished
                    if text.endswith("\ufffd") and not done:
                        yield "", output  # a character split across byte tokens: wait for the rest
                        continue
                    piece = text[len(emitted):] if text.startswith(emitted) else ""
                    emitted = text
                    yield piece, output
        finally:
            if not done and self.engine.scheduler.get(request_id) is not None:
                self.engine.abort(request_id)
