"""The engine on a CUDA device: the tiny preset matches the CPU, and the full-size NVFP4 preset serves a batch."""

from __future__ import annotations

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.presets import save_preset_checkpoint
from reference_engine.tokenizer import tiny_tokenizer

PROMPTS = ["The capital of France is", "Hello", "Once upon a time there was a small model that wanted to answer"]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.mark.cuda
def test_tiny_on_cuda_matches_cpu(tmp_path):
    """The same weights on both devices (a preset draws its weights on the target device, so go through a checkpoint)."""
    save_preset_checkpoint("tiny", tmp_path, seed=0)
    tiny_tokenizer().tokenizer.save(str(tmp_path / "tokenizer.json"))
    cpu = LLM(model=str(tmp_path), max_model_len=128, max_num_batched_tokens=9)
    cuda = LLM(model=str(tmp_path), device="cuda", max_model_len=128, max_num_batched_tokens=9)
    expected = [o.outputs[0].token_ids for o in cpu.generate(PROMPTS, GREEDY, use_tqdm=False)]
    actual = [o.outputs[0].token_ids for o in cuda.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert actual == expected
    seeded = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6, seed=11, ignore_eos=True)
    assert cpu.generate(PROMPTS[0], seeded, use_tqdm=False)[0].outputs[0].token_ids == cuda.generate(PROMPTS[0], seeded, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.cuda
@pytest.mark.slow
def test_full_size_nvfp4_preset_serves_a_batch():
    llm = LLM(model="full", device="cuda", dtype="bfloat16", quantize="nvfp4", max_num_seqs=4, max_model_len=1024,
              max_num_batched_tokens=256)
    scheduler = llm.engine.scheduler
    assert scheduler.block_manager.num_blocks == 4 * 1024 // 16  # capped at the worst case of max_num_seqs sequences
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 4 for o in outputs)
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    assert torch.cuda.max_memory_allocated() < 0.9 * torch.cuda.get_device_properties(0).total_memory
