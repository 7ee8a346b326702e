"""The page of one contract: its tables, roofline (formulas and values at the benchmark shapes), source and latest results."""

from __future__ import annotations

import ast
import html
import json

from toolbox.documents.contract import Contract
from toolbox.expressions import ExpressionError, evaluate
from toolbox.harness.hardware import load_profiles
from toolbox.site_build import layout
from toolbox.site_build.catalog import Catalog, ContractEntry
from toolbox.site_build.markdown import cell, code_cell, fence, table
from toolbox.site_build.results import ResultRow, format_error

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int64": 8, "int32": 4,
            "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
ROOFLINE_PROFILE = "h200"


def _axes_text(axes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes.items())


def _bound(value) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v:g}" for k, v in value.items())
    return f"{value:g}"


def contract_page(catalog: Catalog, entry: ContractEntry, rows: list[ResultRow]) -> str:
    contract = entry.document.contract
    if contract is None:
        findings = "\n".join(f"- `{f.field}`: {f.message}" for f in entry.document.findings) or "- (no details)"
        return (f"# {entry.id}\n\n!!! failure \"This contract does not validate\"\n\n    Run `toolbox validate {entry.document.display}`.\n\n"
                f"{findings}\n\n" + fence(entry.document.path.read_text(encoding="utf-8"), "yaml"))
    parts = [f"# {contract.title}\n", _header(catalog, entry, contract)]
    parts.append(_interface(contract))
    parts.append(_tolerances(contract))
    parts.append(_cases(contract))
    parts.append(_roofline(contract))
    parts.append(_results(entry, rows))
    parts.append(_source(catalog, entry))
    parts.append("## Changelog\n\n" + table(["version", "date", "changes"],
                 [[code_cell(c.version), cell(c.date), cell(c.changes)] for c in contract.changelog]))
    return "\n".join(parts)


def _header(catalog: Catalog, entry: ContractEntry, contract: Contract) -> str:
    skills = []
    for name in contract.skills:
        skill = catalog.skill(name)
        target = f'<a href="{html.escape(layout.page_href(entry.page, skill.page))}"><code>{html.escape(name)}</code></a>' if skill else f"<code>{html.escape(name)}</code> <em>(missing)</em>"
        skills.append(target)
    rows = [
        ("Id", f"<code>{html.escape(contract.id)}</code> (major {contract.major}: implementations declare <code>@satisfies(\"{html.escape(contract.id)}\", major={contract.major})</code>)"),
        ("Version", f"<code>{html.escape(contract.version)}</code>"),
        ("Status", f'<span class="toolbox-status toolbox-status-{html.escape(contract.status)}">{html.escape(contract.status)}</span>'),
        ("Domain", f'<a href="{html.escape(layout.page_href(entry.page, layout.domain_page(entry.domain)))}">{html.escape(entry.domain)}</a>'),
        ("Skills", ", ".join(skills)),
        ("Tags", " ".join(f"<code>{html.escape(t)}</code>" for t in contract.tags) or "none"),
        ("Interface", f"<code>{contract.interface}</code>" + (f": <code>{html.escape(contract.signature)}</code>" if contract.signature else "")),
        ("Source", f'<a href="{html.escape(catalog.repository.blob(entry.document.display))}"><code>{html.escape(entry.document.display)}</code></a>'),
    ]
    body = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in rows)
    run = f"toolbox test {contract.id} --impl mypkg.module:function"
    return (f'<div class="toolbox-meta">\n<p class="toolbox-when">{html.escape(contract.summary)}</p>\n<table class="toolbox-facts">{body}</table>\n</div>\n\n'
            f"Test an implementation: `{run}`\n")


def _interface(contract: Contract) -> str:
    parts = ["## Axes\n", table(["axis", "value", "description"],
             [[code_cell(n), cell(a.value if a.value is not None else "variable"), cell(a.description)] for n, a in contract.axes.items()])]
    parts += ["## Inputs\n", table(["input", "shape", "dtype", "description"],
              [[code_cell(n), code_cell("[" + ", ".join(map(str, t.shape)) + "]"), code_cell(t.dtype), cell(t.description)]
               for n, t in contract.inputs.items()]) if contract.inputs else "None.\n"]
    parts += ["## Outputs\n", table(["output", "shape", "dtype", "in place of", "description"],
              [[code_cell(n), code_cell("[" + ", ".join(map(str, t.shape)) + "]"), code_cell(t.dtype), code_cell(t.aliases), cell(t.description)]
               for n, t in contract.outputs.items()]) if contract.outputs else "None (the contract's `run` driver checks the implementation).\n"]
    if contract.params:
        parts += ["## Params\n", table(["param", "type", "default", "range", "description"], [
            [code_cell(n), cell(p.type), code_cell(p.default),
             cell(f"one of {p.choices}" if p.choices else " ".join(x for x in (f">= {p.min:g}" if p.min is not None else "", f"<= {p.max:g}" if p.max is not None else "") if x)),
             cell(p.description)] for n, p in contract.params.items()])]
    if contract.constraints:
        parts += ["## Constraints\n", "\n".join(f"- `{c}`" for c in contract.constraints) + "\n"]
    return "\n".join(parts)


def _tolerances(contract: Contract) -> str:
    parts = ["## Tolerances\n"]
    if contract.tolerance:
        parts.append(table(["output", "metric", "bound", "atol", "rtol", "why"], [
            [code_cell(n), code_cell(t.metric), cell(_bound(t.bound)), cell(_bound(t.atol)), cell(_bound(t.rtol)), cell(t.description)]
            for n, t in contract.tolerance.items()]))
    else:
        parts.append("Outputs are compared exactly unless the contract's driver says otherwise.\n")
    if contract.invariants:
        parts.append("Invariants checked on every case (functions in the executable half): "
                     + ", ".join(f"`{name}`" for name in contract.invariants) + ".\n")
    return "\n".join(parts)


def _cases(contract: Contract) -> str:
    parts = ["## Cases\n", table(["case", "seed", "axes", "dtype", "device", "params", "description"], [
        [code_cell(c.name), cell(c.seed), code_cell(_axes_text(c.axes)), code_cell(c.dtype), cell(c.device),
         code_cell(json.dumps(c.params) if c.params else ""), cell(c.description)] for c in contract.cases])]
    if contract.errors:
        parts += ["## Error cases\n", "An implementation must raise on each of these inputs.\n",
                  table(["case", "what is wrong", "axes", "mutation", "must raise"], [
                      [code_cell(e.name), cell(e.description), code_cell(_axes_text(e.axes)), code_cell(e.mutate), cell(", ".join(e.raises))]
                      for e in contract.errors])]
    if contract.benchmarks:
        parts += ["## Benchmarks\n", f"Shapes for `toolbox bench {contract.id} --impl ...`.\n",
                  table(["benchmark", "axes", "dtype", "params", "description"], [
                      [code_cell(b.name), code_cell(_axes_text(b.axes)), code_cell(b.dtype), code_cell(json.dumps(b.params) if b.params else ""), cell(b.description)]
                      for b in contract.benchmarks])]
    return "\n".join(parts)


def _roofline(contract: Contract) -> str:
    if contract.roofline is None:
        return "## Roofline\n\nNo roofline model (not a device kernel).\n"
    roofline = contract.roofline
    parts = ["## Roofline\n", f"- bytes moved: `{roofline.bytes}`", f"- arithmetic operations: `{roofline.flops}`"]
    if roofline.notes:
        parts.append(f"\n{roofline.notes.strip()}")
    profile = load_profiles().get(ROOFLINE_PROFILE)
    rows = []
    for benchmark in contract.benchmarks:
        env = {n: a.value for n, a in contract.axes.items() if a.value is not None}
        env.update({n: p.default for n, p in contract.params.items() if isinstance(p.default, (int, float)) and not isinstance(p.default, bool)})
        env.update(benchmark.params)
        env.update(benchmark.axes)
        env["itemsize"] = ITEMSIZE.get(benchmark.dtype, 2)
        try:
            moved, flops = float(evaluate(roofline.bytes, env)), float(evaluate(roofline.flops, env))
        except (ExpressionError, ZeroDivisionError, TypeError) as error:
            rows.append([code_cell(benchmark.name), cell(f"cannot evaluate: {error}"), "–", "–", "–"])
            continue
        ideal = "–"
        if profile is not None:
            peak = profile.peak_for(benchmark.dtype).value
            ideal = f"{1e6 * max(moved / profile.memory_bandwidth.value, flops / peak):.2f}"
        rows.append([code_cell(benchmark.name), cell(f"{moved:,.0f}"), cell(f"{flops:,.0f}"),
                     cell(f"{flops / moved:.2f}" if moved else "–"), cell(ideal)])
    if rows:
        name = profile.name if profile else ROOFLINE_PROFILE
        parts += ["", f"At the benchmark shapes (ideal time on the `{ROOFLINE_PROFILE}` profile: {html.escape(name)}):\n",
                  table(["benchmark", "bytes", "flops", "flops/byte", "ideal [us]"], rows)]
    return "\n".join(parts) + "\n"


def _results(entry: ContractEntry, rows: list[ResultRow]) -> str:
    parts = ["## Latest results\n"]
    mine = [row for row in rows if row.contract_id == entry.id]
    if not mine:
        parts.append("No results recorded for this contract yet. Record some with "
                     f"`toolbox test {entry.id} --engine reference_engine --device cpu --output results/cpu/reference_engine.json` "
                     "and commit the file.\n")
        return "\n".join(parts)
    parts.append(table(["implementation", "device", "version", "records", "max error (abs / rel)", "roofline", "recorded"], [
        [code_cell(r.implementation), cell(r.device_name), code_cell(r.contract_version),
         cell(f"{r.counts.get('PASSED', 0)} passed, {r.failed} failed, {r.counts.get('SKIPPED', 0)} skipped"),
         cell(f"{format_error(r.max_abs_error)} / {format_error(r.max_rel_error)}"),
         cell(f"{max(r.roofline_fractions):.0%} best" if r.roofline_fractions else ""), cell(f"{r.timestamp[:10]} {r.commit[:8]} ({r.source})")]
        for r in mine]))
    failures = [(r, rec) for r in mine for rec in r.failing_records]
    timed = [(r, rec) for r in mine for rec in r.benchmarks if rec.get("latency_ms") is not None]
    if timed:
        parts += ["\nTimed benchmarks:\n", table(["implementation", "device", "benchmark", "dtype", "latency [ms]", "fraction of roofline"], [
            [code_cell(r.implementation), cell(r.device_name), code_cell(rec.get("case")), code_cell(rec.get("dtype")),
             cell(f"{rec['latency_ms']:.4f}"), cell(f"{rec['roofline_fraction']:.1%}" if rec.get("roofline_fraction") is not None else "")]
            for r, rec in timed])]
    if failures:
        parts += ["\nCases that did not pass:\n", table(["implementation", "device", "case", "status", "message"], [
            [code_cell(r.implementation), cell(r.device_name), code_cell(rec.get("case")), code_cell(rec.get("status")), cell(str(rec.get("message", ""))[:300])]
            for r, rec in failures])]
    return "\n".join(parts)


def _source(catalog: Catalog, entry: ContractEntry) -> str:
    python = entry.document.python_path
    display = entry.document.display[: -len(".yaml")] + ".py"
    contract = entry.document.contract
    parts = ["## Executable half\n"]
    if not python.is_file():
        return "\n".join(parts + [f"`{display}` is missing.\n"])
    source = python.read_text(encoding="utf-8")
    parts.append(f"[`{display}`]({catalog.repository.blob(display)}) imports only the standard library, torch and numpy. "
                 f"Its `{contract.reference}` function is the oracle every implementation is compared with:\n")
    reference = function_source(source, contract.reference)
    parts.append(fence(reference, "python") if reference else f"(no function `{contract.reference}` found in the file)\n")
    # The whole file and the YAML stay unhighlighted: thousands of highlighted tokens per page make the build slow.
    parts.append('??? example "The whole file: ' + display + '"\n\n' + _indent(fence(source, "text")))
    parts.append('??? note "The contract document: ' + entry.document.display + '"\n\n' + _indent(fence(entry.document.path.read_text(encoding="utf-8"), "text")))
    return "\n".join(parts)


def function_source(source: str, name: str) -> str | None:
    """The text of top-level function `name` (with its decorators) in a Python file, without importing it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            return "\n".join(lines[start: node.end_lineno])
    return None


def _indent(text: str) -> str:
    return "".join(("    " + line) if line.strip() else line for line in text.splitlines(keepends=True))
