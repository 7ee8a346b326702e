"""Speed-of-light floors for Qwen3.6-35B-A3B: bytes per decode step and the prefill FLOP floor.

Pure Python, no dependencies. Every number is derived from the model shapes below (Hugging Face
`configuration_qwen3_5_moe.py` defaults = the 35B-A3B checkpoint) and three ceilings:
  H200 copy bandwidth 4.27e12 B/s and dense bf16 690e12 FLOP/s (measured on this project's H200,
  2026-12-02), B200 8e12 B/s and 2.25e15 (bf16) / 9e15 (FP4) dense FLOP/s (NVIDIA B200 datasheet).

Usage:
  python decode_floor.py                 # all tables, context 1024 tokens per sequence
  python decode_floor.py --context 4096  # KV read grows with the context
  python decode_floor.py --check         # self-checks (closed forms vs the tensor walk), exit 1 on failure
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

BF16, FP32 = 2, 4
NVFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 16  # 4-bit element + one E4M3 byte per 16 elements = 4.5 bits
NVFP4_TENSOR_SCALE = 4  # one fp32 weight_scale_2 per tensor
FP8_BYTES_PER_WEIGHT = 1.0

CEILINGS = {  # bytes/s, FLOP/s
    "H200 measured": {"bandwidth": 4.27e12, "bf16": 690e12},
    "H200 datasheet": {"bandwidth": 4.8e12, "bf16": 989e12},
    "B200 datasheet": {"bandwidth": 8.0e12, "bf16": 2.25e15, "fp4": 9.0e15},
}


@dataclass(frozen=True)
class Shapes:
    hidden: int = 2048
    layers: int = 40
    full_attention_every: int = 4  # layer i is full attention when i % 4 == 3
    attn_heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    gdn_qk_heads: int = 16
    gdn_v_heads: int = 32
    gdn_head_dim: int = 128
    conv_kernel: int = 4
    experts: int = 256
    top_k: int = 8
    expert_inter: int = 512
    shared_inter: int = 512
    vocab: int = 248320

    @property
    def attention_layers(self) -> int:
        return sum(1 for i in range(self.layers) if i % self.full_attention_every == self.full_attention_every - 1)

    @property
    def gdn_layers(self) -> int:
        return self.layers - self.attention_layers


@dataclass(frozen=True)
class Tensor:
    name: str
    rows: int  # out features
    cols: int  # in features
    count: int  # how many such tensors per model (layers x ...)
    kind: str  # "linear" (quantisable), "keep" (stays bf16: router, gates, a/b), "expert", "lm_head", "vector"

    @property
    def params(self) -> int:
        return self.rows * self.cols


def tensors(s: Shapes) -> list[Tensor]:
    """Every weight a decode step reads, except routed experts (listed per expert) and the embedding table."""
    h, g, a = s.hidden, s.gdn_layers, s.attention_layers
    key_dim, value_dim = s.gdn_qk_heads * s.gdn_head_dim, s.gdn_v_heads * s.gdn_head_dim
    return [
        # Gated DeltaNet layers
        Tensor("linear_attn.in_proj_qkv", 2 * key_dim + value_dim, h, g, "linear"),
        Tensor("linear_attn.in_proj_z", value_dim, h, g, "linear"),
        Tensor("linear_attn.in_proj_b", s.gdn_v_heads, h, g, "keep"),
        Tensor("linear_attn.in_proj_a", s.gdn_v_heads, h, g, "keep"),
        Tensor("linear_attn.out_proj", h, value_dim, g, "linear"),
        Tensor("linear_attn.conv1d", 2 * key_dim + value_dim, s.conv_kernel, g, "vector"),
        Tensor("linear_attn.A_log+dt_bias+norm", 1, 2 * s.gdn_v_heads + s.gdn_head_dim, g, "vector"),
        # full-attention layers (q_proj carries the output gate: 2 x heads x head_dim rows)
        Tensor("self_attn.q_proj", 2 * s.attn_heads * s.head_dim, h, a, "linear"),
        Tensor("self_attn.k_proj", s.kv_heads * s.head_dim, h, a, "linear"),
        Tensor("self_attn.v_proj", s.kv_heads * s.head_dim, h, a, "linear"),
        Tensor("self_attn.o_proj", h, s.attn_heads * s.head_dim, a, "linear"),
        Tensor("self_attn.q_norm+k_norm", 1, 2 * s.head_dim, a, "vector"),
        # MoE block, every layer
        Tensor("mlp.gate (router)", s.experts, h, s.layers, "keep"),
        Tensor("mlp.shared_expert.gate_proj", s.shared_inter, h, s.layers, "linear"),
        Tensor("mlp.shared_expert.up_proj", s.shared_inter, h, s.layers, "linear"),
        Tensor("mlp.shared_expert.down_proj", h, s.shared_inter, s.layers, "linear"),
        Tensor("mlp.shared_expert_gate", 1, h, s.layers, "keep"),
        Tensor("input/post_attention_layernorm", 1, 2 * h, s.layers, "vector"),
        # outside the layers
        Tensor("norm", 1, h, 1, "vector"),
        Tensor("lm_head", s.vocab, h, 1, "lm_head"),
    ]


def expert_tensors(s: Shapes) -> list[Tensor]:
    """One routed expert of one layer (checkpoints store gate, up, down separately)."""
    h, i = s.hidden, s.expert_inter
    return [Tensor("expert.gate_proj", i, h, 1, "expert"), Tensor("expert.up_proj", i, h, 1, "expert"),
            Tensor("expert.down_proj", h, i, 1, "expert")]


SCHEMES = ("bf16", "nvfp4 + bf16 lm_head", "nvfp4 + nvfp4 lm_head")


def tensor_bytes(t: Tensor, scheme: str) -> float:
    """Bytes of one copy of tensor t under a precision scheme."""
    quantised = t.kind in ("linear", "expert") or (t.kind == "lm_head" and scheme == "nvfp4 + nvfp4 lm_head")
    if scheme == "bf16" or not quantised:
        return t.params * BF16
    return t.params * NVFP4_BYTES_PER_WEIGHT + NVFP4_TENSOR_SCALE


def expected_distinct_experts(experts: int, top_k: int, batch: int) -> float:
    """E * (1 - (1 - k/E)^B): expected distinct experts one layer touches for B tokens, uniform routing."""
    return experts * (1.0 - (1.0 - top_k / experts) ** batch)


@dataclass(frozen=True)
class StepBytes:
    dense_weights: float  # every non-expert weight, read once per step
    expert_weights: float  # distinct routed experts x bytes per expert, all layers
    embedding_rows: float
    gdn_state: float  # read + write, all sequences
    conv_state: float  # read + write, all sequences
    kv: float  # read of the context + write of the new token, all sequences

    @property
    def total(self) -> float:
        return self.dense_weights + self.expert_weights + self.embedding_rows + self.gdn_state + self.conv_state + self.kv

    @property
    def weights(self) -> float:
        return self.dense_weights + self.expert_weights


def step_bytes(s: Shapes, scheme: str, batch: int, context: int, kv_bytes: int = BF16, distinct: float | None = None) -> StepBytes:
    dense = sum(tensor_bytes(t, scheme) * t.count for t in tensors(s))
    per_expert = sum(tensor_bytes(t, scheme) for t in expert_tensors(s))
    distinct = expected_distinct_experts(s.experts, s.top_k, batch) if distinct is None else distinct
    gdn_state = s.gdn_v_heads * s.gdn_head_dim * s.gdn_head_dim * FP32 * s.gdn_layers  # one sequence, one direction
    conv_dim = 2 * s.gdn_qk_heads * s.gdn_head_dim + s.gdn_v_heads * s.gdn_head_dim
    conv_state = conv_dim * (s.conv_kernel - 1) * BF16 * s.gdn_layers
    kv_per_token = 2 * s.kv_heads * s.head_dim * kv_bytes * s.attention_layers  # K and V, all attention layers
    return StepBytes(
        dense_weights=dense,
        expert_weights=distinct * per_expert * s.layers,
        embedding_rows=batch * s.hidden * BF16,
        gdn_state=2 * batch * gdn_state,
        conv_state=2 * batch * conv_state,
        kv=batch * kv_per_token * (context + 1),
    )


def active_params(s: Shapes) -> dict[str, int]:
    """Parameters one token touches (the embedding table counts one row)."""
    groups: dict[str, int] = {}
    for t in tensors(s):
        key = "lm_head" if t.kind == "lm_head" else t.name.split(".")[0]
        groups[key] = groups.get(key, 0) + t.params * t.count
    groups["mlp"] = groups.get("mlp", 0) + s.top_k * sum(t.params for t in expert_tensors(s)) * s.layers
    groups["embedding row"] = s.hidden
    return groups


def total_params(s: Shapes) -> int:
    dense = sum(t.params * t.count for t in tensors(s))
    return dense + s.experts * sum(t.params for t in expert_tensors(s)) * s.layers + s.vocab * s.hidden


def prefill_flops(s: Shapes, tokens: int, chunk: int = 64) -> dict[str, float]:
    """Dense-equivalent FLOPs of one prompt: linears, causal attention, chunked GDN core; LM head for the last token."""
    active = active_params(s)
    body = sum(v for k, v in active.items() if k not in ("lm_head", "embedding row"))
    d, c = s.gdn_head_dim, chunk
    per_chunk = 5 * 2 * c * c * d + 3 * 2 * c * d * d + 2 * c ** 3 / 3  # gated-deltanet references/chunked-derivation.md
    return {
        "linears 2*P*T": 2.0 * body * tokens,
        "attention QK+PV causal": s.attention_layers * 2 * 2 * s.attn_heads * s.head_dim * tokens * (tokens + 1) / 2,
        "GDN chunked core": s.gdn_layers * s.gdn_v_heads * per_chunk * tokens / c,
        "lm_head (last token)": 2.0 * active["lm_head"],
    }


def _ms(x: float) -> str:
    return f"{x * 1e3:8.3f}"


def report(context: int) -> None:
    s = Shapes()
    active = active_params(s)
    n_active = sum(active.values())
    print(f"Qwen3.6-35B-A3B: {s.gdn_layers} GDN + {s.attention_layers} attention layers, {s.experts} experts, top {s.top_k}")
    print("\nActive parameters per token")
    for k, v in active.items():
        print(f"  {k:<16} {v / 1e6:10.2f} M")
    print(f"  {'total':<16} {n_active / 1e9:10.4f} B   (all parameters: {total_params(s) / 1e9:.2f} B)")

    one = step_bytes(s, "bf16", 1, context)
    print(f"\nPer sequence per step: GDN state r+w {one.gdn_state / 1e6:.1f} MB, conv state r+w {one.conv_state / 1e6:.2f} MB, "
          f"KV read {context} tokens + write 1 = {one.kv / 1e6:.1f} MB (bf16 KV, {one.kv / (context + 1):.0f} B/token)")

    print(f"\nBatch 1, context {context}: bytes per step and floor (ms)")
    print(f"  {'scheme':<24}{'weights GB':>11}{'total GB':>10}{'H200 weights only':>19}" + "".join(f"{k:>16}" for k in CEILINGS))
    for scheme in SCHEMES:
        b = step_bytes(s, scheme, 1, context)
        floors = "".join(f"{_ms(b.total / c['bandwidth']):>16}" for c in CEILINGS.values())
        weights_only = _ms(b.weights / CEILINGS["H200 measured"]["bandwidth"])
        print(f"  {scheme:<24}{b.weights / 1e9:11.3f}{b.total / 1e9:10.3f}{weights_only:>19}{floors}")

    print(f"\nBatch sweep (nvfp4 + bf16 lm_head, context {context}, uniform routing)")
    print(f"  {'B':>3}{'experts/layer':>14}{'weights GB':>11}{'state+KV GB':>12}{'total GB':>10}{'H200 ms':>9}{'tok/s total':>12}{'B200 ms':>9}")
    for batch in (1, 8, 32, 64):
        b = step_bytes(s, "nvfp4 + bf16 lm_head", batch, context)
        h200 = b.total / CEILINGS["H200 measured"]["bandwidth"]
        b200 = b.total / CEILINGS["B200 datasheet"]["bandwidth"]
        per_seq = b.gdn_state + b.conv_state + b.kv + b.embedding_rows
        print(f"  {batch:>3}{expected_distinct_experts(s.experts, s.top_k, batch):14.1f}{b.weights / 1e9:11.3f}{per_seq / 1e9:12.3f}"
              f"{b.total / 1e9:10.3f}{_ms(h200):>9}{batch / h200:12.0f}{_ms(b200):>9}")

    tokens = 1024
    flops = prefill_flops(s, tokens)
    total = sum(flops.values())
    print(f"\nPrefill of {tokens} tokens (batch 1): FLOPs")
    for k, v in flops.items():
        print(f"  {k:<24} {v / 1e12:8.3f} TFLOP")
    print(f"  {'total':<24} {total / 1e12:8.3f} TFLOP")
    all_nvfp4 = total_params(s) - s.vocab * s.hidden  # every weight except the embedding table is read once
    weight_bytes = {scheme: sum(tensor_bytes(t, scheme) * t.count for t in tensors(s))
                    + s.experts * s.layers * sum(tensor_bytes(t, scheme) for t in expert_tensors(s)) for scheme in SCHEMES}
    print(f"  compute floor: H200 measured bf16 {_ms(total / 690e12)} ms, H200 datasheet bf16 {_ms(total / 989e12)} ms, "
          f"B200 bf16 {_ms(total / 2.25e15)} ms, B200 FP4 {_ms(total / 9e15)} ms")
    print(f"  weight-read floor (all {all_nvfp4 / 1e9:.2f} B non-embedding weights read once):")
    for k in SCHEMES:
        print(f"    {k:<24} {weight_bytes[k] / 1e9:6.2f} GB = H200 measured {_ms(weight_bytes[k] / 4.27e12)} ms, B200 {_ms(weight_bytes[k] / 8e12)} ms")


def check() -> list[str]:
    """Closed forms written out by hand must agree with the tensor walk."""
    s, failures = Shapes(), []
    h = 2048
    gdn = 8192 * h + 4096 * h + 2 * 32 * h + h * 4096 + 8192 * 4 + 2 * 32 + 128
    attn = 8192 * h + 2 * 512 * h + h * 4096 + 2 * 256
    moe = 256 * h + 3 * 512 * h + h + 8 * 3 * 512 * h + 2 * h
    closed = 30 * gdn + 10 * attn + 40 * moe + h + 248320 * h + h
    if sum(active_params(s).values()) != closed:
        failures.append(f"active params {sum(active_params(s).values())} != closed form {closed}")
    if abs(expected_distinct_experts(256, 8, 1) - 8) > 1e-9:
        failures.append("one token must touch exactly top_k experts")
    if expected_distinct_experts(256, 8, 10**6) > 256:
        failures.append("distinct experts cannot exceed E")
    b = step_bytes(s, "nvfp4 + bf16 lm_head", 1, 0)
    lm_head = 248320 * h * BF16
    if not lm_head < b.dense_weights:
        failures.append("lm_head must be part of the dense weights")
    if step_bytes(s, "bf16", 1, 0).gdn_state != 2 * 30 * 32 * 128 * 128 * 4:
        failures.append("GDN state must be 30 layers x 2 MiB, read and written")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=1024, help="tokens already in each sequence's KV cache")
    parser.add_argument("--check", action="store_true", help="run the self-checks only")
    args = parser.parse_args()
    if args.context < 0:
        parser.error("--context must be >= 0")
    if args.check:
        failures = check()
        print("\n".join(failures) or "all checks passed")
        return 1 if failures else 0
    report(args.context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
