"""Which source lines launch the prefill's kernels: device time per (torch op, calling line in reference_engine).

    PYTHONPATH=. python3 benchmarks/kernels/profile_prefill_ops.py OUT.txt [--tokens 1024] [--layers 4]

The per-kernel table of `toolbox engine bench` names kernels (`direct_copy_kernel_cuda`, 170 launches, 1.3 ms in
run49) but not who launched them. This script profiles one eager prefill of a model with the full architecture's
widths and `--layers` layers (seeded random weights, NVFP4 linears, bf16, the committed tuning applied) with Python
stacks, and lists each torch op's device time under the innermost frame inside `reference_engine/`. Launches of
Triton and Gluon kernels appear under their wrapper's frame. No speed is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from reference_engine import presets
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.kernels.tuning import apply_for_cuda
from reference_engine.sampling_params import SamplingParams
from reference_engine.tokenizer import tiny_tokenizer

# ops whose device time is counted (their children carry the kernels; counting parents too would count twice)
LEAF_PREFIXES = ("aten::copy_", "aten::index", "aten::index_put_", "aten::mul", "aten::add", "aten::masked_fill", "aten::cat",
                 "aten::sigmoid", "aten::silu", "aten::where", "aten::clamp", "aten::fill_", "aten::zero_", "aten::mm",
                 "aten::addmm", "aten::gather", "aten::scatter", "aten::sum", "aten::div", "aten::sub", "aten::exp")  # fmt: skip


def _frame(event) -> str:
    """The innermost Python frame inside reference_engine/ (not the bench) above a torch op: profiler frames are
    events named 'path.py(line): function', the op's ancestors when the profile records stacks."""
    parent = event.cpu_parent
    while parent is not None:
        if "reference_engine/" in parent.name and "/bench/" not in parent.name and ".py(" in parent.name:
            return parent.name.split("reference_engine/", 1)[1]
        parent = parent.cpu_parent
    return "(outside reference_engine)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--mode", choices=("eager", "static"), default="eager",
                        help="eager: the bench's per-kernel prefill table; static: the padded path that prefill graphs capture")
    args = parser.parse_args()
    apply_for_cuda()
    presets.PRESETS["profile_layers"] = dataclasses.replace(presets.FULL, num_hidden_layers=args.layers, layer_types=())
    model = presets.build_preset("profile_layers", device="cuda", dtype=torch.bfloat16, quantize="nvfp4", seed=0)
    config = EngineConfig(device="cuda", dtype="bfloat16", max_num_seqs=1, max_model_len=args.tokens + 8,
                          num_blocks=-(-(args.tokens + 8) // 16), max_num_batched_tokens=max(2048, args.tokens))  # fmt: skip
    engine = LLMEngine(model, tiny_tokenizer(), config, decode_mode=args.mode, prefill_graphs=args.mode == "static")
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def one_prefill():
        engine.add_request(prompt_token_ids=torch.randint(1, model.config.vocab_size, (args.tokens,), generator=generator).tolist(), params=params)
        while engine.has_unfinished():
            engine.step()

    one_prefill()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        one_prefill()
        torch.cuda.synchronize()
    rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if not any(event.name.startswith(prefix) for prefix in LEAF_PREFIXES) or event.device_time_total <= 0:
            continue
        if any(child.name.startswith(LEAF_PREFIXES) for child in event.cpu_children):
            continue  # a parent op: its child carries the kernel
        key = (event.name, _frame(event))
        rows[key][0] += 1
        rows[key][1] += event.device_time_total
    kernels = defaultdict(lambda: [0, 0.0])
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.key[:100]] = [event.count, event.self_device_time_total]
    lines = [f"one {args.mode} prefill of {args.tokens} tokens, {args.layers} layers (full widths), device us per op and calling line"]
    for (name, frame), (count, time_us) in sorted(rows.items(), key=lambda item: -item[1][1]):
        lines.append(f"{time_us:9.1f} us {count:4d} x  {name:28s} {frame}")
    lines.append("kernels:")
    for name, (count, time_us) in sorted(kernels.items(), key=lambda item: -item[1][1])[:40]:
        lines.append(f"{time_us:9.1f} us {count:4d} x  {name}")
    if args.mode == "static":  # the same padded forward replayed from its graph: GPU time of the replay alone
        del engine
        graphs = LLMEngine(model, tiny_tokenizer(), config, decode_mode="graphs")
        for _ in range(2):  # run, then capture
            engine = graphs
            one_prefill()
        prefill = graphs.runner.prefill_graphs
        graph = prefill._graphs[max(prefill.captured_buckets)]
        samples = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        lines.append(f"graph replay of the same prefill: median {sorted(samples)[3]:.1f} us (kernel sum above: {sum(t for _, t in kernels.values()):.1f} us)")
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
