"""The status dashboard: contract x implementation x device, from every results record file in the repository."""

from __future__ import annotations

from toolbox.site_build import layout
from toolbox.site_build.catalog import Catalog
from toolbox.site_build.markdown import cell, code_cell, table
from toolbox.site_build.results import ResultFiles, ResultRow, format_error

PAGE = layout.STATUS_PAGE


def _verdict(row: ResultRow) -> str:
    if row.total == 0:
        return "no records"
    if row.failed:
        return f"{row.failed} failing"
    if row.counts.get("PASSED", 0) == 0:
        return "all skipped"
    return "passing"


def dashboard_page(catalog: Catalog, files: ResultFiles, rows: list[ResultRow]) -> str:
    parts = ["---\nhide: [navigation]\n---\n", "# Contract status\n",
             ("The latest recorded results of every contract, per implementation and device: one row per "
             "(contract, implementation, device), taken from the newest results file that holds it. Files are the "
             "`{environment, records}` documents written by `toolbox test|check|bench --output` and committed under "
             "`results/` (and `benchmarks/`). Errors are the largest over the recorded cases and outputs; the roofline "
             "column is the best fraction of the roofline reached by a timed benchmark (CUDA runs only).\n")]
    by_contract: dict[str, list[ResultRow]] = {}
    for row in rows:
        by_contract.setdefault(row.contract_id, []).append(row)
    passing = sum(1 for c in catalog.contracts if by_contract.get(c.id) and all(not r.failed and r.counts.get("PASSED") for r in by_contract[c.id]))
    failing = sum(1 for c in catalog.contracts if any(r.failed for r in by_contract.get(c.id, [])))
    untested = sum(1 for c in catalog.contracts if c.id not in by_contract)
    parts.append(table(["contracts", "all recorded rows passing", "some row failing", "no results yet", "results files"],
                       [[cell(len(catalog.contracts)), cell(passing), cell(failing), cell(untested), cell(len(files.record_files))]]))
    body = []
    for contract in catalog.contracts:
        link = f"[{contract.id}]({layout.relative_link(PAGE, contract.page)})"
        version = contract.document.contract.version if contract.document.contract else "invalid"
        mine = by_contract.get(contract.id, [])
        if not mine:
            body.append([link, code_cell(version), "–", "–", "no results recorded", "–", "–", "–", "–"])
            continue
        for row in mine:
            counts = ", ".join(f"{status} {count}" for status, count in sorted(row.counts.items()))
            stale = "" if row.contract_version == version else f" (tested {row.contract_version})"
            body.append([link, code_cell(version) + cell(stale), code_cell(row.implementation), cell(row.device_name), cell(_verdict(row)),
                         cell(counts), cell(f"{format_error(row.max_abs_error)} / {format_error(row.max_rel_error)}"),
                         cell(f"{max(row.roofline_fractions):.0%}" if row.roofline_fractions else ""),
                         cell(f"{row.timestamp[:10]} {row.commit[:8]}")])
    parts += ["## By contract\n", table(["contract", "version", "implementation", "device", "verdict", "statuses",
                                          "max error (abs / rel)", "roofline", "recorded"], body)]
    orphans = sorted({row.contract_id for row in rows} - {c.id for c in catalog.contracts})
    if orphans:
        parts.append("Results name contracts that no longer exist: " + ", ".join(f"`{o}`" for o in orphans) + ".\n")
    parts.append("## Results files\n")
    if files.record_files:
        parts.append(table(["file", "device", "commit", "recorded", "records"], [
            [code_cell(f.path), cell(f.environment.get("device_name")), code_cell(str(f.environment.get("commit", ""))[:12]),
             cell(f.timestamp), cell(len(f.records))] for f in files.record_files]))
    else:
        parts.append("No results files were found under `results/` when this site was built. Record the CPU results with "
                     "`toolbox check --output results/cpu/reference_engine.json` (or `toolbox test --engine reference_engine "
                     "--device cpu --output ...`), the GPU ones with `--device cuda`, and commit them.\n")
    if files.not_understood:
        parts.append("Files skipped:\n\n" + "\n".join(f"- `{path}`: {why}" for path, why in files.not_understood) + "\n")
    return "\n".join(parts)
