"""The peer: Hugging Face transformers' `Qwen3_5MoeForCausalLM` holding the same weights as our model.

Its state dict is produced from our model tensor by tensor (NVFP4 linears and experts dequantised to
the peer's dtype), so both compute the same function and the comparison measures the engines, not
the weights. The peer is built empty on the device and filled in place, one tensor at a time (at
full size the bf16 peer alone is about 70 GB). It runs as a user would run it out of the box:
default attention implementation, its own cache, greedy next token; no flash-linear-attention kernels
unless that package is installed (reported).
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import torch

from reference_engine.bench.timing import HostClock
from reference_engine.model.attention import GatedAttention
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.linear import Linear


def _dense(linear: Linear, dtype: torch.dtype, device: torch.device | None) -> torch.Tensor:
    """The linear's dense weight, dequantised on `device` (its tensors copied there first) or where it lives."""
    if device is not None and linear.is_nvfp4 and linear.weight_packed.device != device:
        moved = {name: getattr(linear, name).to(device) for name in ("weight_packed", "weight_scale", "weight_scale_2", "input_scale")
                 if getattr(linear, name) is not None}  # fmt: skip
        linear = replace(linear, **moved)
    weight = linear.dense_weight(dtype)
    return weight if device is None else weight.to(device)


def _experts(
    experts: RoutedExperts, dtype: torch.dtype, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if experts.is_fused_dense:
        return experts.gate_up_proj.to(device=device, dtype=dtype), experts.down_proj.to(device=device, dtype=dtype)
    gate_up = torch.stack(
        [
            torch.cat([_dense(g, dtype, device), _dense(u, dtype, device)])
            for g, u in zip(experts.gate, experts.up)
        ]
    )  # [E, 2I, H]
    down = torch.stack([_dense(d, dtype, device) for d in experts.down])  # [E, H, I]
    return gate_up, down


def iter_hf_state(model, dtype: torch.dtype, device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, dense tensor) for every weight of our model, in the `Qwen3_5MoeForCausalLM` layout (prefix `model.`).

    With `device`, every tensor is produced there (NVFP4 ones dequantised there), wherever the model's weights live."""

    def cast(value):
        if isinstance(value, Linear):
            return _dense(value, dtype, device)
        return value.to(device=device, dtype=dtype)

    yield "model.embed_tokens.weight", cast(model.embed_tokens)
    yield "model.norm.weight", cast(model.norm)
    yield "lm_head.weight", cast(model.lm_head)
    for layer in model.layers:
        p = f"model.layers.{layer.layer_index}."
        yield p + "input_layernorm.weight", cast(layer.input_layernorm)
        yield (
            p + "post_attention_layernorm.weight",
            cast(layer.post_attention_layernorm),
        )
        mixer = layer.mixer
        if isinstance(mixer, GatedAttention):
            a = p + "self_attn."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                yield a + name + ".weight", cast(getattr(mixer, name))
            yield a + "q_norm.weight", cast(mixer.q_norm)
            yield a + "k_norm.weight", cast(mixer.k_norm)
        else:
            g = p + "linear_attn."
            for name in (
                "in_proj_qkv",
                "in_proj_z",
                "in_proj_b",
                "in_proj_a",
                "out_proj",
            ):
                yield g + name + ".weight", cast(getattr(mixer, name))
            yield g + "conv1d.weight", cast(mixer.conv_weight)[:, None, :]
            yield g + "A_log", mixer.A_log.to(device=device, dtype=torch.float32)
            yield g + "dt_bias", mixer.dt_bias.to(device=device, dtype=torch.float32)
            yield g + "norm.weight", cast(mixer.norm_weight)
        m, mlp = p + "mlp.", layer.mlp
        yield m + "gate.weight", cast(mlp.gate)
        gate_up, down = _experts(mlp.experts, dtype, device)
        yield m + "experts.gate_up_proj", gate_up
        yield m + "experts.down_proj", down
        del gate_up, down
        yield m + "shared_expert.gate_proj.weight", cast(mlp.shared_gate_proj)
        yield m + "shared_expert.up_proj.weight", cast(mlp.shared_up_proj)
        yield m + "shared_expert.down_proj.weight", cast(mlp.shared_down_proj)
        yield m + "shared_expert_gate.weight", cast(mlp.shared_expert_gate)


def build_peer(model, dtype: torch.dtype, device: torch.device | None = None):
    """A transformers Qwen3_5MoeForCausalLM on `device` (default: our model's), filled with our (dequantised) weights.

    Our weights may live elsewhere (the bench parks them on the host so that both fit an 80 GB card): each
    tensor is copied to `device` and dequantised there, one at a time."""
    device = torch.device(device) if device is not None else model.device
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    fields = {
        k: v
        for k, v in model.config.to_hf().items()
        if k not in ("model_type", "architectures", "torch_dtype")
    }
    config = Qwen3_5MoeTextConfig(**fields)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            peer = Qwen3_5MoeForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    targets = dict(peer.named_parameters())
    filled = set()
    with torch.no_grad():
        for name, tensor in iter_hf_state(model, dtype, device):
            if name not in targets:
                raise ValueError(f"the transformers model has no parameter {name!r}")
            target = targets[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{name}: transformers expects {list(target.shape)}, ours is {list(tensor.shape)}"
                )
            target.copy_(tensor.to(target.dtype))
            filled.add(name)
    missing = sorted(set(targets) - filled)
    if missing:
        raise ValueError(
            f"parameters of the transformers model left unfilled: {missing[:5]}"
        )
    return peer


@dataclass(frozen=True)
class PeerFigures:
    name: str
    ttft_seconds: float
    ttft_samples: list
    tpot_seconds: float
    tpot_samples: list
    flash_linear_attention: bool
    attention_implementation: str
    note: str

    def as_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def measure_peer(
    peer, prompt: list[int], decode_tokens: int = 4, repeats: int = 2
) -> tuple[PeerFigures, torch.Tensor]:
    """TTFT of `prompt` (median of `repeats` after a warm-up) and TPOT over `decode_tokens` greedy steps; also the last prompt logits [V]."""
    import transformers

    device = next(peer.parameters()).device
    clock = HostClock(device)
    ids = torch.tensor([prompt], dtype=torch.int64, device=device)
    ttft_samples, output = [], None
    for repeat in range(repeats + 1):
        begin = clock.now()
        output = peer(input_ids=ids, use_cache=True)
        elapsed = clock.now() - begin
        if repeat:
            ttft_samples.append(elapsed)
    last_logits = output.logits[0, -1].float().cpu()
    cache = output.past_key_values
    token = output.logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
    tpot_samples = []
    for step in range(decode_tokens + 1):
        begin = clock.now()
        output = peer(input_ids=token, past_key_values=cache, use_cache=True)
        token = output.logits[:, -1].argmax(-1, keepdim=True)
        cache = output.past_key_values
        elapsed = clock.now() - begin
        if step:
            tpot_samples.append(elapsed)  # the first decode step is a warm-up
    has_fla = importlib.util.find_spec("fla") is not None
    note = (
        f"transformers {transformers.__version__}, {str(next(peer.parameters()).dtype).removeprefix('torch.')}, "
        + (
            "flash-linear-attention installed"
            if has_fla
            else "flash-linear-attention NOT installed: the Gated DeltaNet layers run transformers' torch fallback"
        )
    )
    figures = PeerFigures(
        name="transformers Qwen3_5MoeForCausalLM",
        ttft_seconds=statistics.median(ttft_samples),
        ttft_samples=ttft_samples,
        tpot_seconds=statistics.median(tpot_samples),
        tpot_samples=tpot_samples,
        flash_linear_attention=has_fla,
        attention_implementation=str(
            getattr(peer.config, "_attn_implementation", "default")
        ),
        note=note,
    )
    return figures, last_logits
