"""The page generator without mkdocs: results read from real harness records, newest wins, failures shown, plots drawn."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from toolbox.harness.records import Record, write_json
from toolbox.harness.statuses import Status
from toolbox.site_build import generate_site, layout
from toolbox.site_build.benchmarks_page import benchmarks_page
from toolbox.site_build.catalog import Catalog
from toolbox.site_build.contract_pages import contract_page, function_source
from toolbox.site_build.dashboard import dashboard_page
from toolbox.site_build.markdown import fence, rewrite_links
from toolbox.site_build.results import latest_rows, load_result_files
from toolbox.site_build.svg import Series, line_chart

CONTRACT = "norms-and-activations/rmsnorm"


@pytest.fixture(scope="module")
def catalog(repo_root) -> Catalog:
    return Catalog.load(repo_root)


def _record(case: str, status: Status, rel: float | None, impl: str = "reference_engine", kind: str = "case",
            latency_ms: float | None = None, fraction: float | None = None, timestamp: str = "2026-12-01T10:00:00+00:00") -> Record:
    return Record(contract_id=CONTRACT, contract_version="1.0.0", implementation=impl, case=case, kind=kind, device="cpu",
                  dtype="float32", axes={"T": 5, "D": 64}, status=status, message="" if status.ok else f"{case} went wrong",
                  max_abs_error={"out": rel}, max_rel_error={"out": rel}, latency_ms=latency_ms, roofline_fraction=fraction,
                  environment={"device_name": "cpu (x86_64)", "commit": "abc123def4567890", "timestamp": timestamp})


def _write(root: Path, relative: str, records: list[Record]) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, records, records[0].environment)


def test_newest_results_file_wins_and_failures_show(tmp_path, catalog):
    old = "2026-12-01T10:00:00+00:00"
    new = "2026-12-02T10:00:00+00:00"
    _write(tmp_path, "results/cpu/old.json", [_record("small-f32", Status.PASSED, 1e-7, timestamp=old),
                                              _record("small-bf16", Status.PASSED, 2e-3, timestamp=old)])
    _write(tmp_path, "results/cpu/new.json", [_record("small-f32", Status.PASSED, 3e-7, timestamp=new),
                                              _record("small-bf16", Status.INCORRECT_NUMERICAL, 0.5, timestamp=new)])
    _write(tmp_path, "results/tmp/scratch.json", [_record("small-f32", Status.RUNTIME_ERROR, None, timestamp="2027-01-01")])
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "notes.json").write_text('{"something": "else"}')
    files = load_result_files(tmp_path)
    rows = latest_rows(files)
    assert [row.source for row in rows] == ["results/cpu/new.json"]  # newest wins; results/tmp is scratch
    row = rows[0]
    assert row.counts == {"PASSED": 1, "INCORRECT_NUMERICAL": 1} and row.failed == 1
    assert row.max_rel_error == pytest.approx(0.5)
    assert files.not_understood and files.not_understood[0][0] == "benchmarks/notes.json"

    status = dashboard_page(catalog, files, rows)
    line = next(line for line in status.splitlines() if f"[{CONTRACT}](" in line)
    assert "1 failing" in line and "INCORRECT_NUMERICAL 1" in line and "5.00e-01" in line
    assert "no results recorded" in status  # every other contract is listed as untested
    assert "benchmarks/notes.json" in status
    page = contract_page(catalog, catalog.contract(CONTRACT), rows)
    assert "small-bf16 went wrong" in page and "INCORRECT_NUMERICAL" in page


def test_a_passing_run_reads_as_passing_and_timed_runs_show_the_roofline(tmp_path, catalog):
    _write(tmp_path, "results/cuda/ours.json", [
        _record("small-f32", Status.PASSED, 1e-7), _record("decode-t1", Status.PASSED, None, kind="benchmark", latency_ms=0.0123, fraction=0.41)])
    rows = latest_rows(load_result_files(tmp_path))
    status = dashboard_page(catalog, load_result_files(tmp_path), rows)
    line = next(line for line in status.splitlines() if f"[{CONTRACT}](" in line)
    assert "passing" in line and "failing" not in line and "41%" in line
    page = contract_page(catalog, catalog.contract(CONTRACT), rows)
    assert "0.0123" in page and "41.0%" in page


def test_no_results_is_said_plainly(tmp_path, catalog):
    files = load_result_files(tmp_path)
    assert "No results files were found" in dashboard_page(catalog, files, [])
    assert "No engine benchmark recorded yet" in benchmarks_page(files)
    assert "No results recorded for this contract yet" in contract_page(catalog, catalog.contract(CONTRACT), [])


def _engine_document() -> dict:
    from reference_engine.bench.report import Row

    rows = [Row("TTFT, 1024 prompt tokens", "ms", 80.0, 20.0, 400.0), Row("TPOT, batch 1", "ms", 1.6, 0.58, 30.0)]
    rows += [Row(f"output tokens/s, batch {b}", "tok/s", 500.0 * b ** 0.7, 1700.0 * b ** 0.8, 33.0 if b == 1 else None) for b in (1, 8, 32, 64)]
    return {"name": "2026-12-02-h200-nvfp4-lmhead-bf16", "environment": {"device_name": "NVIDIA H200", "torch": "2.13.0", "triton": "3.6.0",
            "commit": "0123456789abcdef", "date": "2026-12-02T12:00:00+00:00"},
            "model": {"preset": "full", "quantize": "nvfp4", "lm_head": "bf16", "dtype": "bfloat16"},
            "gate": {"passed": True, "message": "fast path agrees", "fast_mode": "graphs"},
            "ceilings": {"copy_bandwidth": 4.27e12, "matmul_rate": 6.9e14, "matmul_dtype": "bfloat16"},
            "table": [r.as_dict() for r in rows]}


def test_benchmarks_page_plots_the_recorded_figures(tmp_path):
    folder = tmp_path / "benchmarks" / "results"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(_engine_document()))
    page = benchmarks_page(load_result_files(tmp_path))
    assert page.count("<svg") == 4 and "polyline" in page  # throughput, fraction of floor, TTFT, TPOT
    assert "NVIDIA H200" in page and "1.6" in page
    # the plotted points carry the recorded values (tooltips), ours below the floor at batch 64
    assert f"ours: {500.0 * 64 ** 0.7:,.0f}" in page and f"floor: {1700.0 * 64 ** 0.8:,.0f}" in page


def test_line_chart_puts_larger_values_higher():
    svg = line_chart("t", ["1", "2"], [Series("a", (10.0, 1000.0))], "y", "x")
    ys = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert len(ys) == 2 and ys[1] < ys[0]
    assert line_chart("t", ["1"], [Series("a", (None,))], "y", "x") == ""


def test_links_in_skills_become_links_between_pages(catalog):
    skill = catalog.skill("gated-deltanet")
    resolve = catalog.resolver(skill.document.display, skill.page)
    text = ("See [the derivation](references/chunked-derivation.md#token-recurrence), [conv](../causal-conv1d/SKILL.md), "
            "[script](scripts/chunked_vs_recurrent.py), [contract](../../../contracts/norms-and-activations/rmsnorm.yaml), "
            "[floor](../../../reference_engine/bench/floor.py), [web](https://example.org) and `[code](not/a/link.md)`.\n"
            "```\n[inside](a fence.md)\n```\n")
    out = rewrite_links(text, resolve)
    assert "(references/chunked-derivation.md#token-recurrence)" in out
    assert "(../causal-conv1d/index.md)" in out
    assert "(scripts/chunked_vs_recurrent.py.md)" in out
    assert "(../../../contracts/norms-and-activations/rmsnorm.md)" in out
    assert "(https://github.com/inference-skills/toolbox/blob/main/reference_engine/bench/floor.py)" in out
    assert "(https://example.org)" in out and "`[code](not/a/link.md)`" in out and "[inside](a fence.md)" in out


def test_page_hrefs_for_raw_html():
    assert layout.page_href("skills/a/b/index.md", "contracts/a/x.md") == "../../../contracts/a/x/"
    assert layout.page_href("contracts/a/x.md", "skills/a/b/index.md") == "../../../skills/a/b/"
    assert layout.page_href("status.md", "contracts/a/x.md") == "../contracts/a/x/"
    assert layout.page_href("index.md", "status.md") == "status/"


def test_fences_outlast_backticks_and_reference_functions_are_found():
    assert fence("a ```` b").startswith("`````")
    source = "import torch\n\n@decorator\ndef reference(x):\n    return x\n\ndef other():\n    pass\n"
    assert function_source(source, "reference") == "@decorator\ndef reference(x):\n    return x"
    assert function_source(source, "missing") is None


def test_generated_site_has_one_page_per_document_and_a_complete_nav(repo_root, catalog):
    site = generate_site(repo_root)
    nav = site.pages["SUMMARY.md"]
    for skill in catalog.skills:
        assert nav.count(f"]({skill.page})") == 1 and skill.page in site.pages
    for contract in catalog.contracts:
        assert nav.count(f"]({contract.page})") == 1 and contract.page in site.pages
    assert len({s.page for s in catalog.skills}) == len(catalog.skills)
    assert sum(len(entries) for entries in site.llms_sections.values()) >= len(catalog.skills) + len(catalog.contracts)


def test_inline_code_naming_a_page_becomes_a_link(catalog):
    skill = catalog.skill("gated-deltanet")
    link = catalog.code_linker(skill.document.display, skill.page)
    text = ("Decode is `gdn-recurrent-decode`; see `references/chunked-derivation.md`, `linear-attention/gdn-gates`, "
            "`contracts/moe/router-topk.yaml`, `reference_engine/bench/floor.py`, `x = a / b`, `gated-deltanet`, "
            "and [`causal-conv1d`](../causal-conv1d/SKILL.md).\n## `qk-norm` in a heading stays\n```\n`qk-norm` in a fence stays\n```\n")
    out = rewrite_links(text, catalog.resolver(skill.document.display, skill.page), link)
    assert "[`gdn-recurrent-decode`](../gdn-recurrent-decode/index.md)" in out
    assert "[`references/chunked-derivation.md`](references/chunked-derivation.md)" in out
    assert "[`linear-attention/gdn-gates`](../../../contracts/linear-attention/gdn-gates.md)" in out
    assert "[`contracts/moe/router-topk.yaml`](../../../contracts/moe/router-topk.md)" in out
    assert "[`reference_engine/bench/floor.py`](https://github.com/inference-skills/toolbox/blob/main/reference_engine/bench/floor.py)" in out
    assert " `x = a / b`," in out and " `gated-deltanet`," in out  # not a page; the page itself
    assert "[`causal-conv1d`](../causal-conv1d/index.md)" in out and "[[" not in out  # an existing link is not nested
    assert "## `qk-norm` in a heading stays" in out and "\n`qk-norm` in a fence stays\n" in out


def test_a_run_stopped_at_the_gate_is_shown_as_such(tmp_path):
    document = {**_engine_document(), "name": "gate-failed-run", "table": [],
                "gate": {"passed": False, "message": "top-1 agreement 0.2 < 0.99"},
                "ceilings": {"copy_bandwidth": float("nan"), "matmul_rate": float("nan"), "matmul_dtype": "-"}}
    folder = tmp_path / "benchmarks" / "results"
    folder.mkdir(parents=True)
    (folder / "gate-failed-run.json").write_text(json.dumps(document))  # NaN as JSON writes it
    page = benchmarks_page(load_result_files(tmp_path))
    assert "FAILED" in page and "stopped at the accuracy gate" in page and "top-1 agreement 0.2" in page
    assert "<svg" not in page and "nan TB/s" not in page
