"""Per-kernel time of one decode step, from torch.profiler over the static path run eagerly.

A replayed CUDA graph shows the profiler one launch, so the step is profiled with decode_mode
"static": the same ops, launched one by one (so launch gaps are larger than in the graph; the
kernel times themselves are what the table is for). On the CPU the table holds CPU op times.
"""

from __future__ import annotations

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.sampling_params import SamplingParams


def _device_time(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value:
            return float(value)
    return 0.0


def _table(prof, cuda: bool, top: int) -> tuple[list[dict], float, int]:
    """(top rows, total time, launches). On CUDA only device events count (kernels, memcpys, memsets): an op such
    as aten::mm also carries its kernel's time as self device time, so counting ops too listed the kernel twice
    (the tables up to run40 did: the batch-1 LM head appeared as `aten::mm` and as its cuBLAS kernel)."""
    events = prof.key_averages()
    if cuda:
        rows = [(e.key, e.count, _device_time(e)) for e in events if getattr(e, "device_type", None) == DeviceType.CUDA and _device_time(e) > 0]
    else:
        rows = [(e.key, e.count, float(e.self_cpu_time_total)) for e in events if e.self_cpu_time_total > 0]
    rows.sort(key=lambda row: row[2], reverse=True)
    total = sum(row[2] for row in rows)
    kernels = [{"name": name[:120], "calls": count, "time_us": time_us, "share": time_us / total if total else 0.0} for name, count, time_us in rows[:top]]
    return kernels, total, sum(row[1] for row in rows)


def profile_prefill(model, tokenizer, prompt_tokens: int = 1024, top: int = 15, seed: int = 0) -> dict:
    """Top kernels by time in one prefill of `prompt_tokens` random tokens (the TTFT step), after a warm-up prefill."""
    device = torch.device(model.device)
    dtype = str(model.dtype).removeprefix("torch.")
    config = EngineConfig(device=str(device), dtype=dtype, max_num_seqs=1, max_model_len=prompt_tokens + 8,
                          num_blocks=-(-(prompt_tokens + 8) // 16), max_num_batched_tokens=max(2048, prompt_tokens))  # fmt: skip
    engine = LLMEngine(model, tokenizer, config, decode_mode="eager")
    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    cuda = device.type == "cuda"

    def one_prefill():
        engine.add_request(prompt_token_ids=torch.randint(1, model.config.vocab_size, (prompt_tokens,), generator=generator).tolist(), params=params)
        while engine.has_unfinished():
            engine.step()

    one_prefill()  # warm: kernel compilation and allocator
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        one_prefill()
        if cuda:
            torch.cuda.synchronize(device)
    kernels, total, launches = _table(prof, cuda, top)
    return {"clock": "device (CUDA kernels)" if cuda else "host (CPU ops)", "prompt_tokens": prompt_tokens, "total_us": total,
            "launches": launches, "kernels": kernels}  # fmt: skip


def profile_decode_step(
    model,
    tokenizer,
    batch: int = 1,
    use_triton: bool = True,
    context_tokens: int = 64,
    top: int = 15,
    seed: int = 0,
) -> dict:
    """Top kernels by time (microseconds) in one static decode step of `batch` sequences."""
    device = torch.device(model.device)
    dtype = str(model.dtype).removeprefix("torch.")
    max_model_len = context_tokens + 8
    num_blocks = batch * -(-max_model_len // 16)
    config = EngineConfig(
        device=str(device),
        dtype=dtype,
        max_num_seqs=batch,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
    )
    engine = LLMEngine(model, tokenizer, config, decode_mode="static", use_triton=use_triton)
    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(
            prompt_token_ids=torch.randint(
                1, model.config.vocab_size, (context_tokens,), generator=generator
            ).tolist(),
            params=params,
        )
    for _ in range(3):  # prefill and two decode steps: warm
        engine.step()
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        engine.step()
        if cuda:
            torch.cuda.synchronize(device)
    kernels, total, launches = _table(prof, cuda, top)
    while engine.has_unfinished():
        engine.step()
    return {
        "clock": "device (CUDA kernels)" if cuda else "host (CPU ops)",
        "batch": batch,
        "context_tokens": context_tokens,
        "total_us": total,
        "launches": launches,  # device events (CUDA: kernels, memcpys) or ops (CPU) with recorded time, over the whole step
        "kernels": kernels,
    }
