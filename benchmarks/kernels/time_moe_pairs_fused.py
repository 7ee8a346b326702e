"""Time the decode MoE experts in one launch (`kernels/moe_pairs_fused.py`) against the two per-pair launches.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_pairs_fused.py OUT.json [--tokens 1,2,4,8] [--tuning FILE]

The real layer (E=256, H=2048, I=512, top-8 plus the shared expert, NVFP4; `time_moe_decode.layer`, four copies cycled in
a CUDA graph of 8 calls so that every call streams its weights from HBM), this card's tuning file applied. Per batch:
- experts alone (ids and weights given): `moe_decode.nvfp4_experts_with_shared` (gate/up launch, down launch, the
  committed settings) against `moe_pairs_fused.fused_pairs_with_shared` with down tiles of 4, 8 and 16 rows, 4 or 8
  warps, and a waiting program spinning or sleeping 200 or 1000 ns between its counter reads (`FORMS`);
- the whole block as the model runs it (`moe_decode.moe_block_decode`: the fused router, then the experts) with the
  fused launch off, on at the best form of the experts-alone rows, and with the router in the same launch (`BLOCK`).
Every form's output is first compared with the two launches' on the same inputs (NaN-poisoned outputs): they differ
only in the order of the float32 slot sum, so the relative difference must stay under `AGREE`. Forms are timed
alternately, three rounds, each form's fastest round counts. No speed is asserted.

`--model-graph`: then the full model (seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`)
decodes from one prompt with the launch off, on (`MAX_TOKENS` 8) and with the router in it (`BLOCK`), `--rounds` rounds alternating, and the GPU
time of one batch-1 graph replay and of one batch-8 replay is recorded (`time_side_stream.batch_replay_us`), with the
last logits' largest difference and top-1 (the slot sum's order differs, so the bits may too).

`--tuning FILE`: writes `moe_pairs_fused_max_tokens` (the largest batch timed up to which the fused block beats the
two launches by `MIN_GAIN` at every batch timed, in either form; 0 when batch 1 does not), `moe_pairs_fused_block` (1 when
the router in the launch beat the experts alone by `MIN_GAIN` at each of those batches) and `moe_pairs_fused_down_rows` /
`moe_pairs_fused_warps` / `moe_pairs_fused_spin_ns` (batch 1's best form) into FILE.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import COPIES, TOP_K, H, layer
from time_moe_tiled import routing

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode, moe_pairs_fused
from reference_engine.kernels.tuning import apply_for_cuda, write_setting

CALLS = 8
ROUNDS = 3
FORMS = ((8, 4, 0), (4, 4, 0), (16, 4, 0), (8, 8, 0), (4, 4, 200), (4, 4, 1000), (8, 8, 200), (8, 8, 1000))  # (down rows, warps, sleep ns)
# of the fused launch; the first is the module default. Sleeps: run79 timed the spinning forms at 1.65x the two launches at T=1.
AGREE = 4e-3  # relative difference allowed against the two launches (float32 slot-sum order, then bfloat16 rounding)
MIN_GAIN = 1.03


def form_name(form: tuple[int, int, int]) -> str:
    rows, warps, sleep_ns = form
    return f"fused rows {rows} warps {warps} sleep {sleep_ns}"


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--tuning", help="tuning file to write the adopted settings into")
    parser.add_argument("--model-graph", action="store_true", help="also time the full model's batch-1 and batch-8 decode graphs off, on and with the router in the launch")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the model-graph timing")
    args = parser.parse_args()
    torch.manual_seed(0)
    apply_for_cuda()
    committed = moe_pairs_fused.MAX_TOKENS, moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.NUM_WARPS, moe_pairs_fused.SPIN_NS, moe_pairs_fused.BLOCK
    layers = [layer() for _ in range(COPIES)]
    gen = torch.Generator().manual_seed(1)
    records = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = [(torch.randn(tokens, H, device="cuda").bfloat16(), *routing(tokens, gen)) for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        tiles = moe_decode._settings(tokens)[:3]

        def two_launches(index: int, out: torch.Tensor) -> None:
            experts, shared, _ = layers[index % COPIES]
            x, ids, weights = inputs[index % COPIES]
            moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, out)

        def fused(index: int, out: torch.Tensor, form=FORMS[0]) -> None:
            experts, shared, _ = layers[index % COPIES]
            x, ids, weights = inputs[index % COPIES]
            moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.NUM_WARPS, moe_pairs_fused.SPIN_NS = form
            moe_pairs_fused.fused_pairs_with_shared(x, weights, ids, experts, shared, out, tiles)

        def block(index: int, out: torch.Tensor, setting: str) -> None:
            experts, shared, router_weight = layers[index % COPIES]
            x = inputs[index % COPIES][0]
            moe_pairs_fused.MAX_TOKENS = 0 if setting == "off" else tokens
            moe_pairs_fused.BLOCK = setting == "block"
            moe_decode.moe_block_decode(x, router_weight, experts, shared, TOP_K, out)

        want = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        two_launches(1, want)
        agreement = {}
        for form in FORMS:
            got = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
            fused(1, got, form)
            agreement[form] = relative(got, want) if torch.isfinite(got).all() else float("inf")
            if not agreement[form] < AGREE:
                raise SystemExit(f"T={tokens} form {form}: the fused launch and the two launches disagree ({agreement[form]:.3g})")
        rounds: dict[str, list[float]] = {"two launches": [], **{form_name(form): [] for form in FORMS}}
        for _ in range(ROUNDS):

            def step():
                for index in range(CALLS):
                    two_launches(index, outs[index % COPIES])

            rounds["two launches"].append(graph_seconds(step) * 1e6 / CALLS)
            for form in FORMS:

                def fused_step():
                    for index in range(CALLS):
                        fused(index, outs[index % COPIES], form)

                rounds[form_name(form)].append(graph_seconds(fused_step) * 1e6 / CALLS)
        best = {name: min(values) for name, values in rounds.items()}
        best_form = min(FORMS, key=lambda f: best[form_name(f)])
        moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.NUM_WARPS, moe_pairs_fused.SPIN_NS = best_form
        block_want = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        block(1, block_want, "off")
        block_agreement = {}
        for setting in ("on", "block"):
            block_got = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
            block(1, block_got, setting)
            block_agreement[setting] = relative(block_got, block_want) if torch.isfinite(block_got).all() else float("inf")
            if not block_agreement[setting] < AGREE:
                raise SystemExit(f"T={tokens}: the block ({setting}) disagrees with the two launches ({block_agreement[setting]:.3g})")
        block_rounds: dict[str, list[float]] = {"off": [], "on": [], "block": []}
        for _ in range(ROUNDS):
            for name in ("off", "on", "block"):

                def block_step():
                    for index in range(CALLS):
                        block(index, outs[index % COPIES], name)

                block_rounds[name].append(graph_seconds(block_step) * 1e6 / CALLS)
        block_best = {name: min(values) for name, values in block_rounds.items()}
        record = {"tokens": tokens, "gate_up_tiles": list(tiles), "experts_us": best, "experts_rounds_us": rounds,
                  "agreement": {"/".join(map(str, form)): a for form, a in agreement.items()}, "best_form": list(best_form),
                  "block_us": block_best, "block_rounds_us": block_rounds, "block_agreement": block_agreement,
                  "block_ratio": block_best["on"] / block_best["off"], "block_router_ratio": block_best["block"] / block_best["off"]}  # fmt: skip
        records.append(record)
        print(f"T={tokens}: experts two launches {best['two launches']:6.2f} us; "
              + ", ".join(f"{form_name(form)[6:]} {best[form_name(form)]:6.2f}" for form in FORMS)
              + f"; block off {block_best['off']:6.2f}, experts fused {block_best['on']:6.2f}, router too {block_best['block']:6.2f} us "
              f"(ratios {record['block_ratio']:.3f}, {record['block_router_ratio']:.3f}; best form {best_form}; agreement {block_agreement})", flush=True)  # fmt: skip
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "records": records}, indent=1))
    moe_pairs_fused.MAX_TOKENS, moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.NUM_WARPS, moe_pairs_fused.SPIN_NS, moe_pairs_fused.BLOCK = committed
    if args.tuning:
        max_tokens, block_wins = 0, True
        for record in sorted(records, key=lambda r: r["tokens"]):
            best_on = min(record["block_us"]["on"], record["block_us"]["block"])
            if record["block_us"]["off"] / best_on < MIN_GAIN:
                break
            max_tokens = record["tokens"]
            block_wins = block_wins and record["block_us"]["on"] / record["block_us"]["block"] >= MIN_GAIN
        write_setting(args.tuning, "moe_pairs_fused_max_tokens", max_tokens)
        write_setting(args.tuning, "moe_pairs_fused_block", int(max_tokens > 0 and block_wins))
        one = [r for r in records if r["tokens"] == 1]
        if one:
            rows, warps, sleep_ns = one[0]["best_form"]
            write_setting(args.tuning, "moe_pairs_fused_down_rows", rows)
            write_setting(args.tuning, "moe_pairs_fused_warps", warps)
            write_setting(args.tuning, "moe_pairs_fused_spin_ns", sleep_ns)
        print(f"tuning: moe_pairs_fused_max_tokens = {max_tokens}, moe_pairs_fused_block = {int(max_tokens > 0 and block_wins)}" + (f", down rows {rows}, warps {warps}, sleep {sleep_ns} ns (batch 1's best form)" if one else ""))
    if args.model_graph:
        del layers
        torch.cuda.empty_cache()
        document = json.loads(Path(args.out).read_text())
        document["model_graph"] = model_graph(args.rounds)
        Path(args.out).write_text(json.dumps(document, indent=1))


def model_graph(rounds: int) -> dict:
    """The full model's batch-1 and batch-8 decode graphs with the experts' launch off, on (up to 8 tokens) and with the
    router in it too ("block"), alternating rounds."""
    import statistics

    from time_l2_prefetch import one_setting
    from time_side_stream import batch_replay_us

    from reference_engine.presets import build_preset
    from reference_engine.tokenizer import load_tokenizer

    model = build_preset("full", device=torch.device("cuda"), dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    tokenizer = load_tokenizer("full")
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    samples: dict[str, dict[str, list[float]]] = {setting: {"1": [], "8": []} for setting in ("off", "on", "block")}
    logits = {}
    for _ in range(rounds):
        for setting in samples:

            def configure(decoder, setting=setting) -> None:  # after the engine installed the tuning file
                moe_pairs_fused.MAX_TOKENS = 0 if setting == "off" else 8
                moe_pairs_fused.BLOCK = setting == "block"

            record, logits[setting] = one_setting(model, tokenizer, None, prompt, configure)
            samples[setting]["1"].append(record["graph_replay_us"])
            samples[setting]["8"].append(batch_replay_us(model, tokenizer, prompt, 8, configure))
            print(f"model graph {setting}: batch 1 {samples[setting]['1'][-1]:.1f} us, batch 8 {samples[setting]['8'][-1]:.1f} us", flush=True)
    medians = {setting: {batch: statistics.median(v) for batch, v in per.items()} for setting, per in samples.items()}
    summary = {"samples_us": samples, "median_us": medians,
               "over_off": {setting: {batch: medians[setting][batch] / medians["off"][batch] for batch in ("1", "8")} for setting in ("on", "block")},
               "logits_max_abs_diff": {setting: float((logits[setting] - logits["off"]).abs().max()) for setting in ("on", "block")},
               "top1_equal": {setting: int(logits[setting].argmax()) == int(logits["off"].argmax()) for setting in ("on", "block")}}  # fmt: skip
    for setting in ("on", "block"):
        print(f"model graph {setting} / off: batch 1 {summary['over_off'][setting]['1']:.4f}, batch 8 {summary['over_off'][setting]['8']:.4f}; "
              f"logits differ by {summary['logits_max_abs_diff'][setting]:.3g}, top-1 equal {summary['top1_equal'][setting]}", flush=True)  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
