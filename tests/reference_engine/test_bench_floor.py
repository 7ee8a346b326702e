"""Floors: checked against hand-computed values and against memory_plan's byte counts."""

from __future__ import annotations

import math

import pytest

from reference_engine.bench.floor import (
    active_parameters_per_token,
    decode_floor,
    expected_distinct_experts,
    expert_bytes,
    floor_seconds,
    prefill_floor,
    step_bytes,
)
from reference_engine.config import ModelConfig
from reference_engine.memory_plan import (
    kv_bytes_per_token,
    state_bytes_per_sequence,
    weight_bytes,
)

FULL = ModelConfig()


def test_distinct_experts_by_hand() -> None:
    assert expected_distinct_experts(256, 8, 1) == 8.0  # exactly top_k at batch 1
    assert expected_distinct_experts(256, 8, 0) == 0.0
    # B = 64: 256 * (1 - (31/32)^64); (31/32)^64 = exp(64 ln 0.96875) = 0.131081...
    assert expected_distinct_experts(256, 8, 64) == pytest.approx(
        256 * (1 - math.exp(64 * math.log(31 / 32))), rel=1e-12
    )
    assert expected_distinct_experts(256, 8, 64) == pytest.approx(222.4425, abs=1e-3)
    assert expected_distinct_experts(256, 8, 2) == pytest.approx(
        256 * (1 - (248 / 256) ** 2)
    )  # 15.75: two tokens share 0.25 on average
    assert expected_distinct_experts(256, 8, 100000) == pytest.approx(256.0)
    with pytest.raises(ValueError):
        expected_distinct_experts(256, 300, 1)


def test_expert_and_state_bytes_by_hand() -> None:
    # gate/up [512, 2048] and down [2048, 512] in NVFP4: 0.5 B per element + one e4m3 per 16 + two fp32 scalars
    per_matrix = 512 * 2048 // 2 + 512 * 2048 // 16 + 8
    assert expert_bytes(FULL, "nvfp4") == 3 * per_matrix == 1_769_496
    assert expert_bytes(FULL, "bf16") == 3 * 512 * 2048 * 2
    # a sequence's GDN state: 30 layers x (32 x 128 x 128 fp32 = 2 MiB recurrent + 8192 x 3 bf16 conv)
    assert state_bytes_per_sequence(FULL) == 30 * (2 * 1024 * 1024 + 8192 * 3 * 2)
    assert kv_bytes_per_token(FULL) == 10 * 2 * 2 * 256 * 2


def test_step_bytes_agree_with_memory_plan() -> None:
    weights = weight_bytes(FULL, "nvfp4", "bf16")
    one = step_bytes(FULL, num_seqs=1, context_tokens=1024)
    assert one.routed_experts == pytest.approx(
        8 * FULL.num_hidden_layers * expert_bytes(FULL, "nvfp4")
    )
    assert (
        one.dense_weights
        == weights.attention
        + weights.linear_attention
        + weights.shared_experts
        + weights.other
    )
    assert one.lm_head == 248320 * 2048 * 2
    assert one.state == 2 * state_bytes_per_sequence(FULL)
    assert one.kv == 1025 * kv_bytes_per_token(FULL)
    # every expert touched: memory_plan's routed total, plus the 8 bytes of scalars of a separate up matrix
    # (memory_plan counts gate_up as one matrix; the engine's NVFP4 experts hold gate and up apart)
    huge = step_bytes(FULL, num_seqs=100000, context_tokens=0)
    assert huge.routed_experts == pytest.approx(
        weights.routed_experts + 40 * 256 * 8, rel=1e-12
    )
    # DESIGN.md section 7: about 2.4 GB of weights per token at batch 1 (NVFP4 linears, bf16 LM head)
    weights_only = one.dense_weights + one.routed_experts + one.lm_head
    assert 2.3e9 < weights_only < 2.5e9
    assert active_parameters_per_token(FULL) == pytest.approx(2.95e9, rel=0.01)
    # the NVFP4 LM head variant moves a quarter-ish of the bf16 head
    assert (
        step_bytes(FULL, 1, 1024, lm_head="nvfp4").lm_head
        == 248320 * 1024 + 248320 * 128 + 8
    )


def test_floors() -> None:
    floor = decode_floor(FULL, 1, 1024, copy_bandwidth=4.27e12, matmul_rate=690e12)
    assert floor.bound == "memory"
    assert floor.seconds == pytest.approx(step_bytes(FULL, 1, 1024).total / 4.27e12)
    assert (
        0.5e-3 < floor.seconds < 0.7e-3
    )  # DESIGN.md: about 0.58 ms of weights, plus state and KV
    assert decode_floor(FULL, 64, 1024, 4.27e12, 690e12).seconds > floor.seconds
    ttft = prefill_floor(FULL, 1024, 4.27e12, 690e12)
    assert ttft.bound == "compute" and ttft.seconds == pytest.approx(
        ttft.flops / 690e12
    )
    assert floor_seconds(10.0, 1.0, 10.0, 10.0).seconds == 1.0
    with pytest.raises(ValueError):
        floor_seconds(1.0, 1.0, 0.0, 1.0)
