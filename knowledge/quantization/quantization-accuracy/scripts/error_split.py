"""Split NVFP4 error into kernel error and quantisation error on a small random model (CPU, ~10 s).

Uses the independent float64 forward of the `model/logits` contract (contracts/model/logits.py)
as the model, and its random configuration (hidden 64, 8 layers: 6 Gated DeltaNet + 2 attention,
16 experts, top 4). Weights are fake-quantised to NVFP4 (quantise, then dequantise, in the
ModelOpt arithmetic) under several keep-in-high-precision policies.

  quantisation error = KL(original model || dequantised model)        the price of the format
  kernel error       = KL(dequantised model || your NVFP4 kernels)     must be at rounding level
The "kernels" here are this project's engine run in float32 on the dequantised weights (its
`model/logits` entry, correct) and the float64 model with the nibbles of one expert swapped (a
packing bug), to show which number each kind of bug moves. A random 64-wide model exaggerates the
quantisation error (per-linear errors of about 10% compound with no trained structure to absorb
them); only real checkpoints on real text give the number to report (../SKILL.md section 3).
Metrics per prompt position: KL(reference || candidate) in nats, and top-1 agreement where the
reference's two best logits differ by more than a margin (0.1 here, the contract's bf16 margin).

Run: python error_split.py      (from anywhere inside the repository)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "contracts" / "model" / "logits.py").exists())
spec = importlib.util.spec_from_file_location("logits_contract", ROOT / "contracts" / "model" / "logits.py")
contract = importlib.util.module_from_spec(spec)
spec.loader.exec_module(contract)

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def fake_nvfp4(weight: torch.Tensor, swap_nibbles: bool = False) -> torch.Tensor:
    """Quantise [N, K] to NVFP4 and dequantise (float32 scale arithmetic, ties to even), float64 out."""
    w = weight.to(torch.float32)
    scale_2 = w.abs().max() / 2688.0
    blocks = w.reshape(w.shape[0], -1, 16)
    s = blocks.abs().amax(-1) / (6.0 * scale_2)
    s = torch.where(s == 0, torch.ones_like(s), s).clamp(2.0**-9, 448.0).to(torch.float8_e4m3fn).float()
    scaled = (blocks / (s * scale_2)[..., None]).abs().clamp(max=6.0).double()
    midpoints = (GRID[1:] + GRID[:-1]) / 2
    index = torch.bucketize(scaled, midpoints) + ((scaled[..., None] == midpoints) & (torch.arange(7) % 2 == 1)).any(-1).long()
    values = GRID[index] * torch.sign(blocks).double()
    if swap_nibbles:  # element 2j read from the high nibble: a packing bug
        values = values.reshape(*values.shape[:-1], 8, 2).flip(-1).reshape(values.shape)
    return (values * (s.double() * scale_2.double())[..., None]).reshape(weight.shape)


POLICIES = {
    "experts only (routed + shared)": lambda name: "experts" in name or "shared_expert." in name,
    "all projections; router, gates, in_proj_a/b, lm_head kept": lambda name: not name.endswith(
        ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_a.weight", "in_proj_b.weight", "lm_head.weight", "embed_tokens.weight")
    ),
}


def quantised_state(state: dict, keep_rule, swap_expert: bool = False) -> dict:
    out = {}
    for name, tensor in state.items():
        linear = name.endswith(".weight") and tensor.ndim == 2 and tensor.shape[1] % 16 == 0 and "norm" not in name
        experts = name.endswith(("experts.gate_up_proj", "experts.down_proj"))
        if experts and keep_rule(name):
            parts = [fake_nvfp4(tensor[e], swap_nibbles=swap_expert and e == 0) for e in range(tensor.shape[0])]
            out[name] = torch.stack(parts)
        elif linear and keep_rule(name):
            out[name] = fake_nvfp4(tensor)
        else:
            out[name] = tensor.double()
    return out


def compare(reference: list[torch.Tensor], candidate: list[torch.Tensor], margin: float = 0.1) -> tuple[float, float, float]:
    """(mean KL, max KL, top-1 agreement at clear positions) of candidate against reference."""
    kls, agree, counted = [], 0, 0
    for ref, got in zip(reference, candidate):
        log_ref, log_got = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
        kls.append((log_ref.exp() * (log_ref - log_got)).sum(-1))
        top2 = ref.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > margin
        agree += int((ref.argmax(-1) == got.argmax(-1))[clear].sum())
        counted += int(clear.sum())
    kl = torch.cat(kls)
    return float(kl.mean()), float(kl.max()), agree / max(counted, 1)


def main() -> None:
    case = next(c for c in contract_cases() if c["name"] == "eight-layers-f32")
    inputs = contract.make_inputs(case["axes"], {}, torch.float32, "cpu", torch.Generator().manual_seed(case["seed"]))
    config, state, prompts = inputs["config"], inputs["state_dict"], inputs["prompts"]
    original = contract.reference(config, state, prompts)
    print("quantisation error: original float64 model vs NVFP4-dequantised weights (float64 forward)")
    results = {}
    for label, rule in POLICIES.items():
        dequantised = quantised_state(state, rule)
        results[label] = compare(original, contract.reference(config, dequantised, prompts))
        print(f"  {label:58s} KL mean {results[label][0]:.4f}  max {results[label][1]:.4f}  top-1 {results[label][2]:.3f}")

    print("kernel error: dequantised model (float64) vs simulated kernels")
    rule = POLICIES["all projections; router, gates, in_proj_a/b, lm_head kept"]
    dequantised = quantised_state(state, rule)
    reference = contract.reference(config, dequantised, prompts)
    from reference_engine.contract_entries.model import prompt_logits  # the engine, float32 arithmetic

    as_float32 = {name: t.float() for name, t in dequantised.items()}  # NVFP4 values are exact in float32
    kernel_ok = compare(reference, prompt_logits(dict(config), as_float32, [list(p) for p in prompts]))
    kernel_bug = compare(reference, contract.reference(config, quantised_state(state, rule, swap_expert=True), prompts))
    bound = contract.BOUNDS["float32"]
    print(f"  engine, float32, same weights         KL mean {kernel_ok[0]:.2e}  max {kernel_ok[1]:.2e}  top-1 {kernel_ok[2]:.3f}  (float32 bound: mean {bound[0]:.0e}, max {bound[1]:.0e})")
    print(f"  nibbles swapped in one expert         KL mean {kernel_bug[0]:.2e}  max {kernel_bug[1]:.2e}  top-1 {kernel_bug[2]:.3f}")
    assert kernel_ok[0] <= bound[0] and kernel_ok[1] <= bound[1], "a correct float32 forward must pass the float32 gate"
    assert kernel_bug[0] > bound[0], "a packing bug must fail the kernel gate"
    assert results["experts only (routed + shared)"][0] > bound[0], "quantisation error is far above the kernel gate"
    print("all checks passed")


def contract_cases() -> list[dict]:
    import yaml  # the repository's environment has PyYAML

    return yaml.safe_load((ROOT / "contracts" / "model" / "logits.yaml").read_text())["cases"]


if __name__ == "__main__":
    main()
