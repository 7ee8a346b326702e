"""Memory plan of the full-size model on one H200.

Numbers (ModelConfig() defaults = Qwen3.6-35B-A3B text model, MTP head not counted):
- weights, everything bf16: 69.32e9 bytes (34.66e9 parameters);
- weights, NVFP4 linears (experts, shared experts, attention and GDN projections) with a bf16
  LM head and embedding: 21.00e9 bytes; with an NVFP4 LM head too: 20.27e9 bytes;
- KV cache: 10 attention layers x 2 KV heads x 256 x 2 (K, V) x 2 bytes = 20,480 bytes a token;
- GDN state: 30 layers x (32 x 128 x 128 x 4 + 8192 x 3 x 2) = 64,389,120 bytes a sequence;
- one H200, 141e9 bytes, 0.9 usable = 126.9e9: NVFP4 weights 21.00e9, activation workspace
  estimate 0.53e9 (8192 tokens a step), 64 state slots 4.12e9, leaving 101.2e9 for KV = 308,988
  blocks of 16 = 4.94 million tokens; 64 sequences of 4096 tokens need 262,144 tokens (5.37e9).
"""

from __future__ import annotations

import pytest

from reference_engine.config import ModelConfig
from reference_engine.memory_plan import (
    kv_bytes_per_token,
    linear_bytes,
    plan,
    state_bytes_per_sequence,
    weight_bytes,
)

H200_BYTES = 141_000_000_000


def test_per_token_and_per_sequence_bytes():
    config = ModelConfig()
    assert kv_bytes_per_token(config) == 10 * 2 * 256 * 2 * 2 == 20480
    assert state_bytes_per_sequence(config) == 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)
    assert kv_bytes_per_token(config, "float32") == 2 * kv_bytes_per_token(config)


def test_nvfp4_linear_bytes():
    assert linear_bytes(512, 2048, "bf16") == 512 * 2048 * 2
    assert linear_bytes(512, 2048, "nvfp4") == 512 * 1024 + 512 * 128 + 8
    with pytest.raises(ValueError, match="divisible by 16"):
        linear_bytes(4, 40, "nvfp4")
    with pytest.raises(ValueError, match="unknown precision"):
        linear_bytes(4, 32, "fp8")


def test_bf16_weights_match_the_parameter_count():
    """Counted independently from the published tensor shapes (FACTS.md), layer by layer."""
    hidden, vocab = 2048, 248320
    attention = 8192 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 2 * 256
    gdn = 8192 * 2048 + 4096 * 2048 + 2 * 32 * 2048 + 8192 * 4 + 32 + 32 + 128 + 2048 * 4096
    moe = 256 * 2048 + 2 * 512 * 2048 + 2048 * 512 + 2048 + 256 * (1024 * 2048 + 2048 * 512)
    norms = 2 * hidden
    parameters = 2 * vocab * hidden + 10 * attention + 30 * gdn + 40 * (moe + norms) + hidden
    assert weight_bytes(ModelConfig(), "bf16", "bf16").total == 2 * parameters


def test_full_model_nvfp4_fits_one_h200_with_64_sequences_of_4k():
    config = ModelConfig()
    result = plan(config, H200_BYTES, memory_fraction=0.9, max_num_seqs=64, linears="nvfp4", lm_head="bf16")
    assert result.usable_bytes == int(0.9 * H200_BYTES)
    assert 20.5e9 < result.weight_bytes < 21.5e9
    assert result.max_sequences_of(4096) >= 64
    assert result.num_blocks * 16 >= 64 * 4096
    used = result.weight_bytes + result.activation_bytes + result.state_bytes + result.kv_bytes
    assert used <= result.usable_bytes < used + result.kv_bytes_per_token * result.block_size


def test_bf16_model_does_not_fit_a_small_card():
    with pytest.raises(ValueError, match="does not fit"):
        plan(ModelConfig(), 80_000_000_000, linears="bf16")


def test_fp8_kv_halves_kv_bytes_but_not_the_conv_state():
    """The conv state lives in the model dtype whatever the KV cache dtype is."""
    config = ModelConfig()
    bf16 = plan(config, H200_BYTES, linears="nvfp4", kv_dtype="bfloat16")
    fp8 = plan(config, H200_BYTES, linears="nvfp4", kv_dtype="float8_e4m3fn")
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.state_bytes == bf16.state_bytes == 64 * state_bytes_per_sequence(config, "bfloat16")
