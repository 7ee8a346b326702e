"""The engine benchmarks page: each `toolbox engine bench` document as a table and inline SVG plots."""

from __future__ import annotations

import math
import re

from markdown.extensions.toc import slugify

from toolbox.site_build.markdown import cell, code_cell, table
from toolbox.site_build.results import EngineBenchmark, ResultFiles
from toolbox.site_build.svg import Series, bar_chart, line_chart

BATCH_ROW = re.compile(r"^output tokens/s, batch (\d+)$")


def _number(value) -> float | None:
    """A finite number, or None (missing, NaN or not a number)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def benchmarks_page(files: ResultFiles) -> str:
    parts = ["---\nhide: [navigation]\n---\n", "# Engine benchmarks\n",
             ("What `toolbox engine bench` recorded: the reference engine's time to first token (TTFT), time per output token "
             "(TPOT) and decode throughput by batch size, next to the **floor** (the bytes a step must move over the copy "
             "bandwidth measured in the same run, or its FLOPs over the measured matrix rate, whichever is larger) and a "
             "**peer** (Hugging Face transformers on the same weights) measured in the same run. Every run first passes an "
             "accuracy gate (fast path against the plain path) or records nothing but the failure.\n")]
    if not files.engine_benchmarks:
        parts.append('!!! info "No engine benchmark recorded yet"\n\n'
                     "    No benchmark results were found in `benchmarks/results/*.json` when this site was built. "
                     "Record one on a GPU with `toolbox engine bench` (it writes `benchmarks/results/<date>-<device>-<variant>.json` "
                     "and a Markdown summary), commit the files, and rebuild the site.\n")
        return "\n".join(parts)
    parts.append(table(["run", "device", "date", "gate", "TPOT batch 1 [ms]", "source"], [
        [f"[{cell(b.name)}](#{_anchor(b.name)})", cell(b.document.get("environment", {}).get("device_name")), cell(b.date[:10]),
         cell("passed" if b.document.get("gate", {}).get("passed") else "FAILED"), cell(_tpot(b)), code_cell(b.path)]
        for b in files.engine_benchmarks]))
    for benchmark in files.engine_benchmarks:
        parts.append(_section(benchmark))
    return "\n".join(parts)


def _anchor(name: str) -> str:
    """The id Python-Markdown's toc extension gives the section's heading."""
    return slugify(name, "-")


def _tpot(benchmark: EngineBenchmark) -> str:
    for row in benchmark.document.get("table", []):
        if str(row.get("figure", "")).startswith("TPOT") and _number(row.get("ours")) is not None:
            return f"{row['ours']:.3f}"
    return ""


def _section(benchmark: EngineBenchmark) -> str:
    document = benchmark.document
    env, model, gate = document.get("environment", {}), document.get("model", {}), document.get("gate", {})
    ceilings = document.get("ceilings", {})
    lines = [f"## {benchmark.name}\n"]
    facts = [
        f"- device: {env.get('device_name', '?')}; torch {env.get('torch', '?')}, triton {env.get('triton', '?')}; commit `{str(env.get('commit', '?'))[:12]}`; {env.get('date', '')}",
        f"- model: {model.get('preset', '?')} architecture, linears {model.get('quantize', '?')}, LM head {model.get('lm_head', '?')}, activations {model.get('dtype', '?')}",
        f"- accuracy gate: {'passed' if gate.get('passed') else '**failed**'}: {gate.get('message', '')}",
    ]
    triton_gate = document.get("gate_with_triton_kernels")
    if isinstance(triton_gate, dict) and triton_gate.get("message"):
        facts.append(f"- gate with the Triton kernels: {'passed' if triton_gate.get('passed') else '**failed** (not used in the timed runs)'}: {triton_gate['message']}")
    decode_mode = (document.get("ours") or {}).get("decode_mode")
    if decode_mode:
        facts.append(f"- our decode path in the timed runs: {decode_mode}")
    bandwidth, rate = _number(ceilings.get("copy_bandwidth")), _number(ceilings.get("matmul_rate"))
    if bandwidth and rate:
        facts.append(f"- ceilings measured in the run: copy {bandwidth / 1e12:.2f} TB/s, matrix {rate / 1e12:.0f} TFLOP/s")
    lines += facts + [f"- file: `{benchmark.path}`", ""]
    rows = document.get("table", [])
    if not rows:
        lines.append("No figures: the run stopped at the accuracy gate.\n")
        return "\n".join(lines)
    lines.append(table(["figure", "unit", "ours", "floor", "ours/floor", "peer", "peer/ours"], [
        [cell(r.get("figure")), cell(r.get("unit")), cell(_fmt(r.get("ours"))), cell(_fmt(r.get("floor"))), cell(_fmt(r.get("ours_over_floor"))),
         cell(_fmt(r.get("peer"))), cell(_fmt(r.get("peer_over_ours")))] for r in rows]))
    lines.append(_plots(benchmark.name, rows))
    return "\n".join(lines)


def _fmt(value) -> str:
    number = _number(value)
    if number is None:
        return "n/a"
    return f"{number:,.0f}" if abs(number) >= 100 else f"{number:.3g}"


def _plots(name: str, rows: list[dict]) -> str:
    batches = []
    for row in rows:
        match = BATCH_ROW.match(str(row.get("figure", "")))
        if match:
            batches.append((int(match.group(1)), row))
    batches.sort()
    charts = []
    if batches:
        categories = [str(b) for b, _ in batches]
        charts.append(line_chart(
            f"Decode throughput by batch size ({name})", categories,
            [Series("ours", tuple(_number(r.get("ours")) for _, r in batches)),
             Series("floor", tuple(_number(r.get("floor")) for _, r in batches), dashed=True),
             Series("peer", tuple(_number(r.get("peer")) for _, r in batches))],
            "output tokens/s", "batch size"))
        fractions = tuple(_number(r.get("ours_over_floor")) for _, r in batches)
        charts.append(bar_chart(f"Fraction of the floor's rate reached ({name})", categories,
                                [Series("ours / floor", fractions)], "ours / floor", "batch size"))
    for row in (r for r in rows if r.get("unit") == "ms"):  # one chart per latency figure: TTFT and TPOT differ by 100x
        label = str(row.get("figure", ""))
        charts.append(bar_chart(f"{label} ({name})", [label.split(",")[0]],
                                [Series("ours", (_number(row.get("ours")),)),
                                 Series("floor", (_number(row.get("floor")),), dashed=True),
                                 Series("peer", (_number(row.get("peer")),))], "milliseconds"))
    charts = [c for c in charts if c]
    return "\n".join(f'<div class="toolbox-chart-box">\n{c}\n</div>\n' for c in charts)
