"""Random damage to valid documents never crashes the validator: every outcome is findings, never an exception."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import VALID_TREE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolbox.validate.runner import validate_repository

DOCUMENTS = [
    "knowledge/attention/demo-skill/SKILL.md",
    "knowledge/method/demo-method/SKILL.md",
    "contracts/attention/demo-copy.yaml",
    "contracts/attention/demo-copy.py",
]
CRASH = "the validator failed on this document"


@st.composite
def damage(draw) -> tuple[str, bytes]:
    relative = draw(st.sampled_from(DOCUMENTS))
    data = bytearray((VALID_TREE / relative).read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "delete-line", "duplicate-line", "insert"]))
        lines = bytes(data).split(b"\n")
        if kind == "flip" and data:
            index = draw(st.integers(0, len(data) - 1))
            data[index] = draw(st.sampled_from(list(b" \t:-[]{}&*!|>'\"#\n\x00\xff") + [ord("a")]))
        elif kind == "delete-line" and len(lines) > 1:
            del lines[draw(st.integers(0, len(lines) - 1))]
            data = bytearray(b"\n".join(lines))
        elif kind == "duplicate-line":
            index = draw(st.integers(0, len(lines) - 1))
            lines.insert(index, lines[index])
            data = bytearray(b"\n".join(lines))
        else:
            index = draw(st.integers(0, len(data)))
            data[index:index] = draw(st.binary(min_size=1, max_size=8))
    return relative, bytes(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage())
def test_damaged_documents_give_findings_not_exceptions(tmp_path_factory, change: tuple[str, bytes]) -> None:
    root = tmp_path_factory.mktemp("fuzz") / "repo"
    shutil.copytree(VALID_TREE, root)
    relative, data = change
    (root / relative).write_bytes(data)
    report = validate_repository(root)
    assert not any(CRASH in finding.message for finding in report.findings), report.findings
    for finding in report.findings:
        assert finding.file and finding.message and finding.hint, finding
        assert "\n" not in finding.to_text()


def test_a_crashing_check_becomes_a_finding(valid_tree: Path, monkeypatch) -> None:
    """The guard itself: a bug in a check is reported on the document, not raised."""
    from toolbox.validate import runner

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(runner, "check_contract", broken)
    report = validate_repository(valid_tree)
    crashes = [f for f in report.findings if CRASH in f.message]
    assert [f.file for f in crashes] == ["contracts/attention/demo-copy.yaml", "contracts/attention/demo-scale.yaml"]
