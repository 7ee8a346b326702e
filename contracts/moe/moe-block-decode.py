"""Executable half of moe/moe-block-decode: float64 reference of the whole MoE block, inputs, the driver.

The implementation takes the experts as two objects (routed stack and shared expert), so the
contract is `interface: custom`: `run` builds them, calls the implementation, and judges `out`
against `reference`. It builds each object as the class the implementation annotates the parameter
with (`experts: SomeClass`), by keyword with the six tensor fields below, so an engine keeps its own
container types; without an annotation it passes this file's `Nvfp4ExpertStack` / `Nvfp4Expert`.
Error cases pass this file's containers (fields and `num_experts` only): bad inputs must be told
from the fields.

Reference: NVFP4 weights decoded from their bits in float64 (E2M1 element 2j in the low nibble,
one E4M3 block scale per 16 elements along the input dim, one float32 tensor scale per matrix, gate
and up with their own), router logits x @ router_weight^T rounded once to x's dtype (the model's
router and shared_expert_gate are linears in the model dtype), softmax over the E routed columns,
top_k renormalised, SwiGLU experts, plus sigmoid(logit E) times the shared expert.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

import torch

FIELDS = ("gate_up_packed", "gate_up_scale", "gate_up_scale_2", "down_packed", "down_scale", "down_scale_2")
BLOCK = 16
# Relative Frobenius bounds on `out`, the same numbers as the YAML's tolerance (a test keeps them equal).
BOUNDS = {"float32": 1.0e-5, "bfloat16": 8.0e-3}
# make_inputs redraws a token until its k-th and (k+1)-th routed logits differ by at least this
# (relative to the k-th, at least absolute): 4 bf16 ulps, so rounding the logits cannot reorder them.
ROUTING_MARGIN = 2.0**-5
MAX_REDRAWS = 200


@dataclass(frozen=True)
class Nvfp4ExpertStack:
    """The routed experts: [E, 2I, H/2] uint8 codes (rows 0:I gate, I:2I up), [E, 2I, H/16] E4M3 scales,
    [E, 2] float32 tensor scales (gate, up); down [E, H, I/2], [E, H, I/16], [E]."""

    gate_up_packed: torch.Tensor
    gate_up_scale: torch.Tensor
    gate_up_scale_2: torch.Tensor
    down_packed: torch.Tensor
    down_scale: torch.Tensor
    down_scale_2: torch.Tensor

    @property
    def num_experts(self) -> int:
        return int(self.gate_up_packed.shape[0])


@dataclass(frozen=True)
class Nvfp4Expert:
    """The shared expert: the same six fields without the expert dimension (down_scale_2 a 0-d tensor)."""

    gate_up_packed: torch.Tensor
    gate_up_scale: torch.Tensor
    gate_up_scale_2: torch.Tensor
    down_packed: torch.Tensor
    down_scale: torch.Tensor
    down_scale_2: torch.Tensor


# ----------------------------------------------------------------------------------------- inputs


def random_codes(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Every byte value equally likely: all 16 E2M1 codes in both nibbles."""
    return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)


def random_block_scales(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """E4M3 bytes 0x30..0x47: block scales 0.5 .. 3.75."""
    raw = torch.randint(0x30, 0x48, shape, generator=generator, dtype=torch.uint8)
    return raw.view(torch.float8_e4m3fn)


def random_tensor_scales(shape: tuple[int, ...], fan_in: int, generator: torch.Generator) -> torch.Tensor:
    """Tensor scales making the dequantised weights about N(0, 1/fan_in) (E2M1 rms 2.9, block scales rms about 1.9)."""
    spread = torch.rand(shape, generator=generator, dtype=torch.float64) + 0.5  # gate and up differ
    return (spread / (2.9 * 1.9 * math.sqrt(fan_in))).float()


def make_inputs(axes, params, dtype, device, generator):
    tokens, hidden, inter, experts, top_k = axes["T"], axes["H"], axes["I"], axes["E"], params["top_k"]
    router_weight = (torch.randn(experts + 1, hidden, generator=generator, dtype=torch.float64) * (1.4 / math.sqrt(hidden))).to(dtype)
    rows = []
    for _ in range(tokens):
        for _ in range(MAX_REDRAWS):
            row = torch.randn(hidden, generator=generator, dtype=torch.float64).to(dtype)
            if not 1 <= top_k < experts or routing_gap(row, router_weight, experts, top_k) >= 0:
                break
        else:
            raise AssertionError(f"no token with a clear top-{top_k} in {MAX_REDRAWS} draws: change the case")
        rows.append(row)
    if tokens >= 3:
        rows[2] = rows[1]  # a repeated row (as padding rows of a CUDA-graph bucket are): same routing, same output
    inputs = {"x": torch.stack(rows), "router_weight": router_weight}
    inputs |= {
        "gate_up_packed": random_codes((experts, 2 * inter, hidden // 2), generator),
        "gate_up_scale": random_block_scales((experts, 2 * inter, hidden // BLOCK), generator),
        "gate_up_scale_2": random_tensor_scales((experts, 2), hidden, generator),
        "down_packed": random_codes((experts, hidden, inter // 2), generator),
        "down_scale": random_block_scales((experts, hidden, inter // BLOCK), generator),
        "down_scale_2": random_tensor_scales((experts,), inter, generator),
        "shared_gate_up_packed": random_codes((2 * inter, hidden // 2), generator),
        "shared_gate_up_scale": random_block_scales((2 * inter, hidden // BLOCK), generator),
        "shared_gate_up_scale_2": random_tensor_scales((2,), hidden, generator),
        "shared_down_packed": random_codes((hidden, inter // 2), generator),
        "shared_down_scale": random_block_scales((hidden, inter // BLOCK), generator),
        "shared_down_scale_2": random_tensor_scales((), inter, generator),
    }
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def routing_gap(x_row: torch.Tensor, router_weight: torch.Tensor, experts: int, top_k: int) -> float:
    """(l_k - l_{k+1}) - margin for the routed logits of one token (x's dtype rounding included); >= 0 is clear."""
    logits = router_logits(x_row[None, :], router_weight)[0, :experts]
    ranked = logits.sort(descending=True).values
    return float(ranked[top_k - 1] - ranked[top_k]) - ROUTING_MARGIN * max(1.0, abs(float(ranked[top_k - 1])))


# -------------------------------------------------------------------------------------- reference


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (sign, 2 exponent bits with bias 1, 1 mantissa bit) -> float64."""
    codes = codes.long()
    sign = torch.where(codes & 0x8 != 0, -1.0, 1.0).double()
    exponent = ((codes >> 1) & 0x3).double()
    mantissa = (codes & 0x1).double()
    magnitude = torch.where(exponent == 0, mantissa * 0.5, 2.0 ** (exponent - 1) * (1 + mantissa / 2))
    return sign * magnitude


def e4m3_values(scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bytes (sign, 4 exponent bits with bias 7, 3 mantissa bits) -> float64 (no NaN byte is drawn)."""
    raw = scale.cpu().view(torch.uint8).long()
    sign = torch.where(raw & 0x80 != 0, -1.0, 1.0).double()
    exponent = ((raw >> 3) & 0xF).double()
    mantissa = (raw & 0x7).double()
    magnitude = torch.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return sign * magnitude


def _byte_table() -> torch.Tensor:
    """[256, 2] float64: the E2M1 values of the low and the high nibble of every byte."""
    every_byte = torch.arange(256)
    return torch.stack([e2m1_values(every_byte & 0x0F), e2m1_values(every_byte >> 4)], dim=1)


def _scale_table() -> torch.Tensor:
    """[256] float64: the value of every E4M3 byte (0x7F and 0xFF are NaN)."""
    values = e4m3_values(torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn))
    values[[0x7F, 0xFF]] = float("nan")
    return values


BYTE_VALUES, SCALE_VALUES = _byte_table(), _scale_table()


def dequantize(packed: torch.Tensor, scale: torch.Tensor, tensor_scale: float) -> torch.Tensor:
    """[rows, K/2] codes, [rows, K/16] E4M3 scales -> [rows, K] float64; element 2j is the low nibble of byte j."""
    rows = packed.shape[0]
    values = BYTE_VALUES[packed.cpu().long()].reshape(rows, -1, BLOCK)  # [rows, K/16, 16]
    block_scales = SCALE_VALUES[scale.cpu().view(torch.uint8).long()]  # [rows, K/16]
    return (values * block_scales[:, :, None]).reshape(rows, -1) * float(tensor_scale)


def swiglu(x: torch.Tensor, gate_up: tuple[torch.Tensor, torch.Tensor, torch.Tensor], down: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [n, H] float64; gate_up = (codes [2I, H/2], scales [2I, H/16], tensor scales [2]); down = (codes, scales, scale)."""
    packed, scale, scale_2 = gate_up
    inter = packed.shape[0] // 2
    gate_weight = dequantize(packed[:inter], scale[:inter], float(scale_2[0]))  # [I, H]
    up_weight = dequantize(packed[inter:], scale[inter:], float(scale_2[1]))
    down_weight = dequantize(down[0], down[1], float(down[2]))  # [H, I]
    gate, up = x @ gate_weight.T, x @ up_weight.T
    return (gate * torch.sigmoid(gate) * up) @ down_weight.T


def router_logits(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """[T, E+1] float64: the exact product rounded once to x's dtype, as a linear in the model dtype returns it."""
    return (x.double() @ router_weight.double().T).to(x.dtype).double()


def reference(
    x, router_weight, gate_up_packed, gate_up_scale, gate_up_scale_2, down_packed, down_scale, down_scale_2,
    shared_gate_up_packed, shared_gate_up_scale, shared_gate_up_scale_2, shared_down_packed, shared_down_scale, shared_down_scale_2,
    top_k,
):  # fmt: skip
    experts = gate_up_packed.shape[0]
    x64 = x.double().cpu()
    logits = router_logits(x.cpu(), router_weight.cpu())  # [T, E+1]
    probs = torch.softmax(logits[:, :experts], dim=-1)  # the shared gate's logit is not a routed expert
    chosen = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]  # ties: lower id
    weights = probs.gather(1, chosen)
    weights = weights / weights.sum(dim=-1, keepdim=True)  # always renormalised
    out = torch.sigmoid(logits[:, experts:]) * swiglu(
        x64,
        (shared_gate_up_packed, shared_gate_up_scale, shared_gate_up_scale_2.cpu()),
        (shared_down_packed, shared_down_scale, shared_down_scale_2.cpu()),
    )
    for expert in sorted(set(chosen.flatten().tolist())):  # one expert's weights in float64 at a time
        token_index, slot = (chosen == expert).nonzero(as_tuple=True)
        y = swiglu(
            x64[token_index],
            (gate_up_packed[expert], gate_up_scale[expert], gate_up_scale_2[expert].cpu()),
            (down_packed[expert], down_scale[expert], down_scale_2[expert].cpu()),
        )
        out.index_add_(0, token_index, weights[token_index, slot][:, None] * y)
    return {"out": out}


# ----------------------------------------------------------------------------------------- driver


def containers(impl) -> tuple[type, type]:
    """The classes the implementation annotates `experts` and `shared` with, else this file's."""
    try:
        hints = typing.get_type_hints(impl)
    except (NameError, TypeError, AttributeError):  # annotations that do not resolve: the plain containers
        hints = {}
    experts_type, shared_type = hints.get("experts"), hints.get("shared")
    return (
        experts_type if isinstance(experts_type, type) else Nvfp4ExpertStack,
        shared_type if isinstance(shared_type, type) else Nvfp4Expert,
    )


def call_arguments(inputs: dict, experts_type: type = Nvfp4ExpertStack, shared_type: type = Nvfp4Expert) -> dict:
    """The keyword arguments of the call, `out` poisoned with NaN."""
    x = inputs["x"]
    return {
        "x": x,
        "router_weight": inputs["router_weight"],
        "experts": experts_type(**{field: inputs[field] for field in FIELDS}),
        "shared": shared_type(**{field: inputs["shared_" + field] for field in FIELDS}),
        "out": torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device),
    }


def run(impl, axes, params, dtype, device, generator):
    inputs = make_inputs(axes, params, dtype, device, generator)
    expected = reference(**{name: tensor.cpu().clone() for name, tensor in inputs.items()}, **params)["out"]
    before = {name: tensor.clone() for name, tensor in inputs.items()}
    arguments = call_arguments(inputs, *containers(impl))
    impl(**arguments, top_k=params["top_k"])
    if device == "cuda":
        torch.cuda.synchronize()
    out = arguments["out"]
    for name, tensor in inputs.items():
        assert torch.equal(_bytes(tensor), _bytes(before[name])), f"the implementation wrote its input {name}"
    assert tuple(out.shape) == tuple(expected.shape) and out.dtype == dtype, f"out is {out.dtype} {tuple(out.shape)}"
    actual = out.detach().cpu().double()
    unwritten = int(torch.isnan(actual).sum())
    assert unwritten == 0, f"out: {unwritten} of {actual.numel()} elements left unwritten (still NaN)"
    error = float(torch.linalg.vector_norm(actual - expected) / torch.linalg.vector_norm(expected))
    bound = BOUNDS[str(dtype).removeprefix("torch.")]
    max_abs = float((actual - expected).abs().max())
    assert error <= bound, f"out: rel_fro {error:.3e} > {bound:.1e} (max abs error {max_abs:.3e})"
    return {"max_abs_error": {"out": max_abs}, "max_rel_error": {"out": max_abs / float(expected.abs().max())}, "message": f"rel_fro {error:.2e}"}


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (a bitwise comparison that works for float8)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


# --------------------------------------------------------------------------------- error mutations


def _call(inputs: dict, params: dict) -> tuple[dict, dict]:
    return call_arguments(inputs), params


def valid_call(inputs, params):
    """No mutation (params may be invalid): the call as the error case's params make it."""
    return _call(inputs, params)


def router_without_shared_row(inputs, params):
    """router_weight [E, H]: the shared expert's gate row missing."""
    inputs["router_weight"] = inputs["router_weight"][:-1].clone()
    return _call(inputs, params)


def router_other_dtype(inputs, params):
    other = torch.float16 if inputs["x"].dtype != torch.float16 else torch.float32
    inputs["router_weight"] = inputs["router_weight"].to(other)
    return _call(inputs, params)


def block_scales_float32(inputs, params):
    """The routed gate_up block scales as float32 values instead of E4M3 bytes."""
    inputs["gate_up_scale"] = inputs["gate_up_scale"].float()
    return _call(inputs, params)


def one_tensor_scale_for_gate_up(inputs, params):
    """gate_up_scale_2 [E] (one scale for the fused gate_up) instead of [E, 2]."""
    inputs["gate_up_scale_2"] = inputs["gate_up_scale_2"][:, 0].clone()
    return _call(inputs, params)


def shared_intermediate_differs(inputs, params):
    """A shared expert of intermediate I + 16 (the fused block needs the routed I)."""
    extra = {"shared_gate_up_packed": (32, 0), "shared_gate_up_scale": (32, 0), "shared_down_packed": (8, 1), "shared_down_scale": (1, 1)}
    for name, (count, dim) in extra.items():
        tensor = inputs[name]
        inputs[name] = torch.cat([tensor, tensor.narrow(dim, 0, count)], dim=dim)
    return _call(inputs, params)


def x_three_dims(inputs, params):
    inputs["x"] = inputs["x"][:, None, :].clone()
    return _call(inputs, params)


def out_other_dtype(inputs, params):
    arguments, params = _call(inputs, params)
    arguments["out"] = arguments["out"].to(torch.float16 if arguments["out"].dtype != torch.float16 else torch.float32)
    return arguments, params
