"""ModelConfig.from_hf reads the multimodal and the text-only configs; bad configs fail with the field named."""

from __future__ import annotations

import json

import pytest
import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.config import ConfigError, EngineConfig, ModelConfig
from reference_engine.forward_batch import ForwardBatch


def test_defaults_are_the_real_model():
    config = ModelConfig()
    assert config.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert len(config.full_attention_layers) == 10 and config.rotary_dim == 64
    assert (config.linear_key_dim, config.linear_value_dim, config.linear_conv_dim) == (2048, 4096, 8192)


def test_reads_transformers_configs_both_shapes(tmp_path):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeTextConfig

    text = Qwen3_5MoeTextConfig().to_dict()
    multimodal = Qwen3_5MoeConfig().to_dict()
    assert ModelConfig.from_hf(text) == ModelConfig.from_hf(multimodal) == ModelConfig.from_hf(text) 
    assert ModelConfig.from_hf(text).vocab_size == 248320
    (tmp_path / "config.json").write_text(json.dumps(multimodal))
    assert ModelConfig.from_hf(tmp_path).num_experts == 256


def test_round_trip_through_transformers():
    from transformers import Qwen3_5MoeTextConfig

    config = ModelConfig(hidden_size=64, num_hidden_layers=8, head_dim=32, partial_rotary_factor=0.5, rope_theta=5e5, num_experts=4, num_experts_per_tok=2)
    fields = {k: v for k, v in config.to_hf().items() if k not in ("model_type", "architectures")}
    assert ModelConfig.from_hf(Qwen3_5MoeTextConfig(**fields).to_dict()) == config


def test_older_top_level_rope_fields():
    config = ModelConfig.from_hf({"model_type": "qwen3_5_moe_text", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "num_hidden_layers": 8})
    assert config.rope_theta == 1e6 and config.rotary_dim == 128 and config.full_attention_layers == (3, 7)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "llama"}, "model_type"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
        ({"layer_types": ["linear_attention"] * 39}, "layer_types"),
        ({"layer_types": ["sliding_attention"] * 40}, "sliding_attention"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim"),
        ({"linear_num_value_heads": 24}, "linear_num_value_heads"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7}}, "yarn"),
    ],
)
def test_bad_configs_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_hf({"model_type": "qwen3_5_moe_text", **change})


def test_engine_config_validation():
    assert EngineConfig().torch_dtype == torch.float32
    with pytest.raises(ConfigError, match="dtype"):
        EngineConfig(dtype="int8")
    with pytest.raises(ConfigError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(ConfigError, match="device"):
        EngineConfig(device="tpu")


def test_cache_sizes_match_allocation():
    config = ModelConfig(hidden_size=64, num_hidden_layers=8, head_dim=32, num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8)
    caches = ModelCaches.allocate(config, num_blocks=5, block_size=4, num_state_slots=3, dtype=torch.bfloat16)
    expected = 5 * ModelCaches.bytes_per_block(config, 4, torch.bfloat16) + 3 * ModelCaches.bytes_per_state_slot(config, torch.bfloat16)
    assert caches.total_bytes() == expected
    assert sorted(caches.k_cache) == [3, 7] and sorted(caches.recurrent_state) == [0, 1, 2, 4, 5, 6]
    assert caches.recurrent_state[0].dtype == torch.float32 and caches.conv_state[0].shape == (3, 2 * 32 + 32, 3)
    # the real model: 10 attention layers x 2 (K, V) x 16 tokens x 2 heads x 256 dims x 2 bytes
    assert ModelCaches.bytes_per_block(ModelConfig(), 16, torch.bfloat16) == 10 * 2 * 16 * 2 * 256 * 2


def test_forward_batch_validation_names_the_field():
    def batch(**changes):
        fields = dict(
            input_ids=torch.tensor([1, 2, 3]), positions=torch.tensor([0, 1, 2]), cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32),
            seq_lens=torch.tensor([3], dtype=torch.int32), block_tables=torch.tensor([[0]], dtype=torch.int32),
            slot_mapping=torch.tensor([0, 1, 2]), state_slots=torch.tensor([0]), has_initial_state=torch.tensor([False]),
            logits_indices=torch.tensor([2]), is_decode=False,
        )  # fmt: skip
        fields.update(changes)
        return ForwardBatch(**fields)

    batch().validate()
    with pytest.raises(ValueError, match="seq_lens"):
        batch(seq_lens=torch.tensor([3])).validate()
    with pytest.raises(ValueError, match="positions"):
        batch(positions=torch.tensor([0, 1])).validate()
    with pytest.raises(ValueError, match="decode"):
        batch(is_decode=True).validate()
