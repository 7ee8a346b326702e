"""The benchmark's outputs: one JSON document with every figure and the environment, and a Markdown summary.

Table columns: figure, ours, floor, ours/floor, peer, peer/ours. Times in milliseconds (ours/floor
>= 1: how many floors the step takes); rates in output tokens/s (ours/floor <= 1: the fraction of
the floor's rate reached). peer/ours > 1 means the peer is slower (times) or faster (rates): the
column is simply the quotient, the unit says which way is better.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    figure: str
    unit: str  # "ms" (lower is better) or "tok/s" (higher is better)
    ours: float
    floor: float | None
    peer: float | None

    def as_dict(self) -> dict:
        return {
            "figure": self.figure, "unit": self.unit, "ours": self.ours, "floor": self.floor, "peer": self.peer,
            "ours_over_floor": _ratio(self.ours, self.floor), "peer_over_ours": _ratio(self.peer, self.ours),
        }  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _cell(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def markdown(document: dict) -> str:
    env, gate = document["environment"], document["gate"]
    lines = [
        f"# Engine benchmark: {document['name']}",
        "",
        *(["**Partial: the run ended before every figure was measured.**", ""] if document.get("partial") else []),
        f"- device: {env['device_name']}; torch {env['torch']}, triton {env['triton']}, transformers {env['transformers']}; commit {env['commit']}"
        + (f"; kernel tuning {env['tuning_file']}" if env.get("tuning_file") else ""),
        (
            f"- model: {document['model']['preset']} architecture, seeded random weights, linears {document['model']['quantize']}, "
            f"LM head {document['model']['lm_head']}, activations {document['model']['dtype']}; fast path: {gate['fast_mode']}"
        ),
        (
            f"- ceilings measured in this run: copy {document['ceilings']['copy_bandwidth'] / 1e12:.3f} TB/s (read + written), "
            f"matrix {document['ceilings']['matmul_rate'] / 1e12:.1f} TFLOP/s ({document['ceilings']['matmul_dtype']})"
        ),
        f"- accuracy gate: {gate['message']}",
        *(
            [f"- the Triton kernels FAILED the gate and were not used: {document['gate_with_triton_kernels']['message']}"]
            if document.get("gate_with_triton_kernels")
            else []
        ),
        f"- our decode path in the timed runs: {document['ours']['decode_mode']}"
        if document.get("ours")
        else "- our figures: not measured",
        *([f"- our prefill path (one fresh prompt): {document['ours']['prefill_mode']}"] if document.get("ours", {}).get("prefill_mode") else []),
        "",
        "| figure | ours | floor | ours/floor | peer | peer/ours |",
        "|---|---|---|---|---|---|",
    ]
    for row in document["table"]:
        lines.append(
            f"| {row['figure']} [{row['unit']}] | {_cell(row['ours'])} | {_cell(row['floor'])} | {_cell(row['ours_over_floor'])} | "
            f"{_cell(row['peer'])} | {_cell(row['peer_over_ours'])} |"
        )
    tpot = (document.get("ours") or {}).get("tpot") or {}
    if tpot.get("engine_step_seconds") is not None:
        replay = tpot.get("graph_replay_seconds")
        lines += [
            "",
            (
                f"Batch-1 decode step: runner {1e3 * tpot['seconds']:.3f} ms (inputs, graph replay, token to host), whole engine step "
                f"{1e3 * tpot['engine_step_seconds']:.3f} ms (plus scheduler and bookkeeping), GPU time of the graph alone "
                + (f"{1e3 * replay:.3f} ms (events over repeated replays)." if replay else "not measured (no graph).")
            ),
        ]
    captured = [batch for batch, figures in ((document.get("ours") or {}).get("throughput") or {}).items() if figures.get("graph_captured_in_timed_run")]
    if captured:
        lines += ["", (f"WARNING: the decode graph of batch {', '.join(captured)} was captured inside the timed run (the warm-up did not "
                       "reach it), so that row's synchronous rate includes compilation and capture.")]  # fmt: skip
    peer = document.get("peer")
    lines += [
        "",
        f"Peer: {peer['name']}; {peer['note']}."
        if peer
        else "Peer: not measured in this run.",
    ]
    if document.get("peer_agreement"):
        agreement = document["peer_agreement"]
        lines.append(
            f"Peer vs ours on the TTFT prompt's last-token logits: KL {agreement['kl']:.3e}, same top-1: {agreement['same_top1']}."
        )
    lines += [
        "",
        (
            "Floors: bytes a step must move (dense weights, expected distinct experts E(1-(1-k/E)^B) per MoE layer, LM head, "
            "GDN states read and written, KV read) over the copy bandwidth, or its matrix FLOPs over the matrix rate, whichever is larger. "
            "Throughput rows: decode steps that ran the whole batch (prefill excluded); see `throughput` in the JSON for end-to-end rates."
        ),
    ]
    for profile in (document.get("profile"), document.get("profile_b32")):
        if not profile:
            continue
        lines += [
            "",
            f"## One decode step, per kernel (static path run eagerly, batch {profile['batch']}, {profile['clock']})",
            "",
            "| kernel | calls | time [us] | share |",
            "|---|---|---|---|",
        ]
        for kernel in profile["kernels"]:
            name = kernel["name"].replace("|", "/")
            lines.append(
                f"| `{name}` | {kernel['calls']} | {kernel['time_us']:.1f} | {100 * kernel['share']:.1f}% |"
            )
        launches = profile.get("launches")
        lines.append(f"\nTotal over all kernels: {profile['total_us']:.1f} us" + (f" in {launches} launches." if launches else "."))
    prefill = document.get("profile_prefill")
    if prefill:
        lines += ["", f"## One prefill of {prefill['prompt_tokens']} tokens, per kernel (eager, {prefill['clock']})", "",
                  "| kernel | calls | time [us] | share |", "|---|---|---|---|"]  # fmt: skip
        for kernel in prefill["kernels"]:
            lines.append(f"| `{kernel['name'].replace('|', '/')}` | {kernel['calls']} | {kernel['time_us']:.1f} | {100 * kernel['share']:.1f}% |")
        lines.append(f"\nTotal over all kernels: {prefill['total_us']:.1f} us in {prefill['launches']} launches.")
    return "\n".join(lines) + "\n"


def write_results(document: dict, out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(document, indent=2, default=float) + "\n")
    md_path.write_text(markdown(document))
    return json_path, md_path
