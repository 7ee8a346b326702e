"""Show what the model/logits gate measures: the engine passes, cheats fail, and quantisation
error is separated from kernel error by judging against dequantised weights.

Runs on a CPU in about half a minute. Uses the contract's own driver (`run`), its float64
reference and the reference engine (`reference_engine.contract_entries.model:prompt_logits`);
each "cheat" is a small, realistic bug wrapped around them.

Usage (from the repository root, with the package installed):
  python knowledge/measurement/accuracy-gates/scripts/gate_catches_cheats.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[4]
CONTRACT = ROOT / "contracts" / "model" / "logits"


def load_contract():
    spec = importlib.util.spec_from_file_location("model_logits_contract", CONTRACT.with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = {c["name"]: c for c in yaml.safe_load(CONTRACT.with_suffix(".yaml").read_text())["cases"]}
    return module, cases


def main() -> int:
    from reference_engine.contract_entries.model import prompt_logits
    from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

    contract, cases = load_contract()

    def constant(config, state_dict, prompts):  # while True: yield "a"
        return [torch.zeros(len(p), config["vocab_size"]).index_fill_(1, torch.tensor([1]), 5.0) for p in prompts]

    def skipped_layer(config, state_dict, prompts):  # layer 1 computed as identity (its outputs zeroed)
        changed = dict(state_dict)
        for name in ("linear_attn.out_proj.weight", "mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight"):
            key = f"model.layers.1.{name}"
            changed[key] = torch.zeros_like(changed[key])
        return prompt_logits(config, changed, prompts)

    def swapped_layers(config, state_dict, prompts):
        swap = {"layers.0.": "layers.1.", "layers.1.": "layers.0."}
        changed = {}
        for name, tensor in state_dict.items():
            for old, new in swap.items():
                if old in name:
                    name = name.replace(old, new)
                    break
            changed[name] = tensor
        return prompt_logits(config, changed, prompts)

    def stale_cache(config, state_dict, prompts):  # recurrent state and KV not reset between requests
        out, previous = [], [3, 1, 4, 1, 5]
        for prompt in prompts:
            logits = contract.reference(config, state_dict, [previous + prompt])[0]
            out.append(logits[len(previous):].float())
            previous = prompt
        return out

    def no_renormalisation(config, state_dict, prompts):  # top-k weights left as raw softmax probabilities
        original = contract._moe

        def moe(h, w, p, cfg):
            probs = torch.softmax(h @ w[p + "gate.weight"].T, dim=-1)
            top_values, top_ids = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
            gate_up, down = w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
            inter, y = down.shape[2], torch.zeros_like(h)
            for e in range(gate_up.shape[0]):
                weight = (top_values * (top_ids == e)).sum(-1, keepdim=True)
                both = h @ gate_up[e].T
                y += weight * ((torch.nn.functional.silu(both[:, :inter]) * both[:, inter:]) @ down[e].T)
            return y + original(h, w, p, cfg) - original_routed(h, w, p, cfg)

        def original_routed(h, w, p, cfg):  # the shared-expert part is kept by subtracting routed from the full MoE
            zero = dict(w)
            zero[p + "experts.down_proj"] = torch.zeros_like(w[p + "experts.down_proj"])
            return original(h, w, p, cfg) - original(h, zero, p, cfg)

        contract._moe = moe
        try:
            return [x.float() for x in contract.reference(config, state_dict, prompts)]
        finally:
            contract._moe = original

    def quantise_weights(state_dict):  # NVFP4 round trip of every 2-D linear the engine would quantise
        keep = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight", "shared_expert_gate", "in_proj_a", "in_proj_b", "conv1d")
        out = {}
        for name, tensor in state_dict.items():
            if tensor.dim() >= 2 and tensor.shape[-1] % 16 == 0 and not any(k in name for k in keep):
                flat = tensor.reshape(-1, tensor.shape[-1])
                packed, scale, scale_2 = quantize_nvfp4(flat)
                tensor = dequantize_nvfp4(packed, scale, scale_2, tensor.dtype).reshape(tensor.shape)
            out[name] = tensor
        return out

    def engine_quantising_on_load(config, state_dict, prompts):  # correct kernels, NVFP4 weights
        return prompt_logits(config, quantise_weights(state_dict), prompts)

    impls = [("reference engine", prompt_logits), ("constant logits", constant), ("layer 1 skipped", skipped_layer),
             ("layers 0 and 1 swapped", swapped_layers), ("stale state/KV from the previous request", stale_cache),
             ("top-k weights not renormalised", no_renormalisation),
             ("NVFP4 engine judged against bf16/f32 weights", engine_quantising_on_load)]
    unexpected = 0
    for case in ("four-layers-f32", "four-layers-bf16"):
        c = cases[case]
        dtype = getattr(torch, c["dtype"])
        for label, impl in impls:
            generator = torch.Generator().manual_seed(c["seed"])
            try:
                message, verdict = contract.run(impl, c["axes"], {}, dtype, "cpu", generator)["message"], "PASS"
            except AssertionError as error:
                message, verdict = str(error), "FAIL"
            should_pass = label == "reference engine"
            unexpected += (verdict == "PASS") != should_pass
            print(f"{case:17} {verdict}  {label:46} {message}")
        # Quantisation apart from kernels: hand the engine the dequantised weights, so the reference sees them too.
        generator = torch.Generator().manual_seed(c["seed"])
        inputs = contract.make_inputs(c["axes"], {}, dtype, "cpu", generator)
        dequantised = quantise_weights(inputs["state_dict"])
        expected = contract.reference(inputs["config"], dequantised, inputs["prompts"])
        actual = prompt_logits(inputs["config"], dequantised, inputs["prompts"])
        bounds = contract.BOUNDS[c["dtype"]]
        try:
            message, verdict = contract._judge(expected, actual, inputs["config"]["vocab_size"], bounds)["message"], "PASS"
        except AssertionError as error:
            message, verdict = str(error), "FAIL"
        unexpected += verdict != "PASS"
        print(f"{case:17} {verdict}  {'NVFP4 engine judged against dequantised weights':46} {message}")
    print("all verdicts as expected" if not unexpected else f"{unexpected} unexpected verdict(s)")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
