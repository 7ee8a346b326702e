"""Executable half of model/logits: an independent float64 forward of the Qwen3.6-35B-A3B architecture.

Imports only the standard library and torch. `reference(config, state_dict, prompts)` runs each
prompt alone, token-parallel where it can and with a plain loop for the Gated DeltaNet recurrence,
from a Hugging Face text config dict and a state dict in HF naming (prefix `model.`, fused experts).
`run` drives an implementation `impl(config, state_dict, prompts) -> [logits [len_i, vocab]]` and
judges it by per-position KL(reference || impl) and top-1 agreement.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Per case dtype: (mean KL bound, max KL bound, minimum top-1 agreement, top-1 margin), KL in nats per
# position. Top-1 is counted only where the reference's two best logits differ by more than the margin.
# The bf16 bounds are what transformers' own bf16 forward reaches on these random models (routing
# flips under bf16 rounding dominate); they still sit far below a model with a wrong layer.
BOUNDS = {
    "float64": (1e-10, 1e-9, 1.0, 1e-6),
    "float32": (1e-8, 1e-7, 1.0, 1e-3),
    "float16": (1e-3, 1e-2, 0.95, 0.05),
    "bfloat16": (3e-2, 0.3, 0.75, 0.1),
}


def _rope_settings(config: dict) -> tuple[float, float]:
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 1e7))
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    return float(theta), float(factor)


def _layer_types(config: dict) -> list[str]:
    types = config.get("layer_types")
    if types:
        return list(types)
    return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(config["num_hidden_layers"])]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool = True) -> torch.Tensor:
    scale = (1.0 + weight) if zero_centred else weight
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * scale


def _attention(h: torch.Tensor, w: dict, p: str, config: dict) -> torch.Tensor:
    length = h.shape[0]
    heads, kv_heads, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps = config["rms_norm_eps"]
    theta, factor = _rope_settings(config)
    both = (h @ w[p + "q_proj.weight"].T).view(length, heads, 2 * dim)
    query, gate = both[..., :dim], both[..., dim:].reshape(length, heads * dim)
    key = (h @ w[p + "k_proj.weight"].T).view(length, kv_heads, dim)
    value = (h @ w[p + "v_proj.weight"].T).view(length, kv_heads, dim)
    query, key = _rms(query, w[p + "q_norm.weight"], eps), _rms(key, w[p + "k_norm.weight"], eps)
    rotary = int(dim * factor)
    half = rotary // 2
    inv_freq = theta ** (-torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)  # [rotary / 2]
    angle = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [L, rotary / 2]
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        first, second = x[..., :half], x[..., half:rotary]
        return torch.cat([first * cos - second * sin, second * cos + first * sin, x[..., rotary:]], dim=-1)

    query, key = rotate(query), rotate(key)
    out = torch.empty(length, heads, dim, dtype=torch.float64)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = (query[:, head] @ key[:, kv].T) / math.sqrt(dim)
        scores = scores.masked_fill(~causal, float("-inf"))
        out[:, head] = torch.softmax(scores, dim=-1) @ value[:, kv]
    return (out.reshape(length, heads * dim) * torch.sigmoid(gate)) @ w[p + "o_proj.weight"].T


def _gated_deltanet(h: torch.Tensor, w: dict, p: str, config: dict) -> torch.Tensor:
    length = h.shape[0]
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    k_dim, v_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    mixed = h @ w[p + "in_proj_qkv.weight"].T  # [L, C]
    kernel = w[p + "conv1d.weight"][:, 0, :]  # [C, K]
    width = kernel.shape[1]
    padded = torch.cat([torch.zeros(width - 1, mixed.shape[1], dtype=torch.float64), mixed])  # [K-1+L, C]
    conv = sum(padded[j : j + length] * kernel[:, j] for j in range(width))
    conv = conv * torch.sigmoid(conv)  # SiLU
    key_total = k_heads * k_dim
    query = conv[:, :key_total].reshape(length, k_heads, k_dim)
    key = conv[:, key_total : 2 * key_total].reshape(length, k_heads, k_dim)
    value = conv[:, 2 * key_total :].reshape(length, v_heads, v_dim)
    z = (h @ w[p + "in_proj_z.weight"].T).reshape(length, v_heads, v_dim)
    beta = torch.sigmoid(h @ w[p + "in_proj_b.weight"].T)  # [L, Hv]
    g = -torch.exp(w[p + "A_log"]) * F.softplus(h @ w[p + "in_proj_a.weight"].T + w[p + "dt_bias"])  # [L, Hv]
    query = query / torch.sqrt((query * query).sum(-1, keepdim=True) + 1e-6) / math.sqrt(k_dim)
    key = key / torch.sqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    group = v_heads // k_heads  # key head i serves value heads i * group ... (i + 1) * group - 1
    query, key = query.repeat_interleave(group, dim=1), key.repeat_interleave(group, dim=1)  # [L, Hv, Dk]
    out = torch.empty(length, v_heads, v_dim, dtype=torch.float64)
    state = torch.zeros(v_heads, k_dim, v_dim, dtype=torch.float64)  # one [Dk, Dv] matrix per value head
    for t in range(length):
        state = state * torch.exp(g[t])[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", state, key[t])
        delta = beta[t][:, None] * (value[t] - predicted)  # [Hv, Dv]
        state = state + key[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", state, query[t])
    normed = _rms(out, w[p + "norm.weight"], config["rms_norm_eps"], zero_centred=False) * F.silu(z)
    return normed.reshape(length, v_heads * v_dim) @ w[p + "out_proj.weight"].T


def _moe(h: torch.Tensor, w: dict, p: str, config: dict) -> torch.Tensor:
    probs = torch.softmax(h @ w[p + "gate.weight"].T, dim=-1)  # [L, E]
    top_values, top_ids = torch.topk(probs, config["num_experts_per_tok"], dim=-1)
    top_values = top_values / top_values.sum(-1, keepdim=True)
    gate_up, down = w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
    inter = down.shape[2]
    out = torch.zeros_like(h)
    for expert in range(gate_up.shape[0]):
        weight = (top_values * (top_ids == expert)).sum(-1, keepdim=True)  # [L, 1], zero where not chosen
        both = h @ gate_up[expert].T  # [L, 2I]
        out += weight * ((F.silu(both[:, :inter]) * both[:, inter:]) @ down[expert].T)
    shared = (F.silu(h @ w[p + "shared_expert.gate_proj.weight"].T) * (h @ w[p + "shared_expert.up_proj.weight"].T)) @ w[
        p + "shared_expert.down_proj.weight"
    ].T
    return out + torch.sigmoid(h @ w[p + "shared_expert_gate.weight"].T) * shared


def reference(config: dict, state_dict: dict, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Float64 logits [len_i, vocab] of each prompt, computed alone from position 0."""
    w = {name: tensor.detach().to("cpu", torch.float64) for name, tensor in state_dict.items()}
    eps = config["rms_norm_eps"]
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    results = []
    for prompt in prompts:
        x = w["model.embed_tokens.weight"][torch.tensor(prompt, dtype=torch.int64)]  # [L, H]
        for i, kind in enumerate(_layer_types(config)):
            p = f"model.layers.{i}."
            h = _rms(x, w[p + "input_layernorm.weight"], eps)
            if kind == "full_attention":
                x = x + _attention(h, w, p + "self_attn.", config)
            else:
                x = x + _gated_deltanet(h, w, p + "linear_attn.", config)
            x = x + _moe(_rms(x, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.", config)
        results.append(_rms(x, w["model.norm.weight"], eps) @ head.T)
    return results


def _config(axes: dict) -> dict:
    layers = axes["num_hidden_layers"]
    return {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": axes["vocab_size"],
        "hidden_size": axes["hidden_size"],
        "num_hidden_layers": layers,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        "rms_norm_eps": 1e-6,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": axes["num_experts"],
        "num_experts_per_tok": axes["num_experts_per_tok"],
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
    }


def _state_dict(config: dict, generator: torch.Generator) -> dict:
    H, V = config["hidden_size"], config["vocab_size"]

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=generator, dtype=torch.float64) / math.sqrt(in_features)

    def small(*shape: int, mean: float = 0.0) -> torch.Tensor:
        return mean + 0.1 * torch.randn(*shape, generator=generator, dtype=torch.float64)

    s = {"model.embed_tokens.weight": torch.randn(V, H, generator=generator, dtype=torch.float64), "model.norm.weight": small(H), "lm_head.weight": linear(V, H)}
    heads, kv_heads, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    key_total = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    v_heads, v_dim = config["linear_num_value_heads"], config["linear_value_head_dim"]
    conv_dim = 2 * key_total + v_heads * v_dim
    E, I, Is = config["num_experts"], config["moe_intermediate_size"], config["shared_expert_intermediate_size"]
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"], s[p + "post_attention_layernorm.weight"] = small(H), small(H)
        if kind == "full_attention":
            a = p + "self_attn."
            s[a + "q_proj.weight"], s[a + "k_proj.weight"] = linear(2 * heads * dim, H), linear(kv_heads * dim, H)
            s[a + "v_proj.weight"], s[a + "o_proj.weight"] = linear(kv_heads * dim, H), linear(H, heads * dim)
            s[a + "q_norm.weight"], s[a + "k_norm.weight"] = small(dim), small(dim)
        else:
            g = p + "linear_attn."
            s[g + "in_proj_qkv.weight"], s[g + "in_proj_z.weight"] = linear(conv_dim, H), linear(v_heads * v_dim, H)
            s[g + "in_proj_b.weight"], s[g + "in_proj_a.weight"] = linear(v_heads, H), linear(v_heads, H)
            s[g + "conv1d.weight"] = torch.randn(conv_dim, 1, config["linear_conv_kernel_dim"], generator=generator, dtype=torch.float64) / 2
            s[g + "A_log"] = torch.empty(v_heads, dtype=torch.float64).uniform_(0.0, 2.0, generator=generator)
            s[g + "dt_bias"] = torch.empty(v_heads, dtype=torch.float64).uniform_(-1.0, 1.0, generator=generator)
            s[g + "norm.weight"] = small(v_dim, mean=1.0)
            s[g + "out_proj.weight"] = linear(H, v_heads * v_dim)
        m = p + "mlp."
        s[m + "gate.weight"] = 2.0 * linear(E, H)  # sharper routing, so top-k choices are rarely near-ties
        s[m + "experts.gate_up_proj"] = torch.stack([linear(2 * I, H) for _ in range(E)])
        s[m + "experts.down_proj"] = torch.stack([linear(H, I) for _ in range(E)])
        s[m + "shared_expert.gate_proj.weight"], s[m + "shared_expert.up_proj.weight"] = linear(Is, H), linear(Is, H)
        s[m + "shared_expert.down_proj.weight"], s[m + "shared_expert_gate.weight"] = linear(H, Is), linear(1, H)
    return s


def make_inputs(axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """A small random config, its random state dict (in `dtype` on `device`) and prompts of unequal lengths."""
    config = _config(axes)
    state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in _state_dict(config, generator).items()}
    longest, count = axes["max_prompt_len"], axes["num_prompts"]
    lengths = [max(1, longest - (i * longest) // count) for i in range(count)]  # unequal, the first the longest
    prompts = [torch.randint(0, config["vocab_size"], (n,), generator=generator).tolist() for n in lengths]
    return {"config": config, "state_dict": state, "prompts": prompts}


def _judge(expected: list[torch.Tensor], actual, vocab: int, bounds: tuple[float, float, float, float]) -> dict:
    assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
        f"expected a list of {len(expected)} logits tensors, got {type(actual).__name__} of length {len(actual) if hasattr(actual, '__len__') else '?'}"
    )
    kls, agree, counted = [], 0, 0
    for index, (ref, got) in enumerate(zip(expected, actual)):
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (ref.shape[0], vocab), (
            f"prompt {index}: expected logits of shape [{ref.shape[0]}, {vocab}], got {getattr(got, 'shape', type(got).__name__)}"
        )
        got = got.detach().to("cpu", torch.float64)
        assert torch.isfinite(got).all(), f"prompt {index}: logits hold NaN or Inf"
        log_ref, log_got = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
        kls.append((log_ref.exp() * (log_ref - log_got)).sum(-1))
        top2 = ref.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > bounds[3]
        agree += int((ref.argmax(-1) == got.argmax(-1))[clear].sum())
        counted += int(clear.sum())
    kl = torch.cat(kls)
    kl_mean, kl_max = float(kl.mean()), float(kl.max())
    top1 = agree / max(counted, 1)
    mean_bound, max_bound, top1_bound, _ = bounds
    message = f"KL mean {kl_mean:.3e} (bound {mean_bound:.0e}), max {kl_max:.3e} (bound {max_bound:.0e}), top-1 agreement {top1:.4f} (bound {top1_bound}) over {kl.numel()} positions"
    assert kl_mean <= mean_bound and kl_max <= max_bound and top1 >= top1_bound, message
    return {"message": message}  # KL is no absolute error, so it travels in the message only


def run(impl, axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    inputs = make_inputs(axes, params, dtype, device, generator)
    # The reference sees the same (rounded) weights as the implementation, so only compute error is measured.
    expected = reference(inputs["config"], inputs["state_dict"], inputs["prompts"])
    state_copy = {name: tensor.clone() for name, tensor in inputs["state_dict"].items()}
    actual = impl(dict(inputs["config"]), state_copy, [list(p) for p in inputs["prompts"]])
    bounds = BOUNDS[str(dtype).removeprefix("torch.")]
    return _judge(expected, actual, inputs["config"]["vocab_size"], bounds)
