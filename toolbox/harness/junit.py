"""JUnit XML for CI: one testsuite per contract, one testcase per record."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from toolbox.harness.records import Record
from toolbox.harness.statuses import Status


def junit_xml(records: list[Record]) -> str:
    suites = ET.Element("testsuites", name="toolbox test")
    by_contract: dict[str, list[Record]] = {}
    for record in records:
        by_contract.setdefault(record.contract_id, []).append(record)
    total_failures = total_skipped = 0
    for contract_id, group in by_contract.items():
        failures = sum(1 for r in group if not r.status.ok)
        skipped = sum(1 for r in group if r.status == Status.SKIPPED)
        total_failures += failures
        total_skipped += skipped
        suite = ET.SubElement(suites, "testsuite", name=contract_id, tests=str(len(group)), failures=str(failures), skipped=str(skipped), errors="0")
        for record in group:
            testcase = ET.SubElement(
                suite,
                "testcase",
                classname=f"{contract_id}[{record.implementation}]",
                name=f"{record.kind}:{record.case}[{record.device},{record.dtype}]",
                time=f"{(record.latency_ms or 0.0) / 1000:.6f}",
            )
            if record.status == Status.SKIPPED:
                ET.SubElement(testcase, "skipped", message=record.message)
            elif not record.status.ok:
                failure = ET.SubElement(testcase, "failure", message=f"{record.status.value}: {record.message}", type=record.status.value)
                failure.text = f"{record.status.value}: {record.message}\naxes: {record.axes}\nmax_abs_error: {record.max_abs_error}"
    suites.set("tests", str(len(records)))
    suites.set("failures", str(total_failures))
    suites.set("skipped", str(total_skipped))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def write_junit(path: Path, records: list[Record]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(junit_xml(records) + "\n", encoding="utf-8")
