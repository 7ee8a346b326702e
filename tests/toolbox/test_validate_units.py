"""Units of the validator: the YAML loader, findings rendering, usage errors of `toolbox validate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolbox.findings import Finding, render_json, sort_findings
from toolbox.yaml_loader import MAX_ALIASES, parse_yaml, split_frontmatter


def test_lines_of_keys_and_items() -> None:
    document, findings = parse_yaml("a: 1\nb:\n  c: [x, y]\n  d:\n    - 1\n    - 2\n", "f.yaml", first_line=3)
    assert findings == []
    assert document.data == {"a": 1, "b": {"c": ["x", "y"], "d": [1, 2]}}
    assert document.line_of(("a",)) == 3
    assert document.line_of(("b", "d", 1)) == 8
    assert document.line_of(("b", "missing")) == 4  # falls back to the parent


def test_few_aliases_are_fine_many_are_refused() -> None:
    small = "a: &x [1, 2]\nb: *x\n"
    assert parse_yaml(small, "f")[0].data == {"a": [1, 2], "b": [1, 2]}
    many = "a: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(MAX_ALIASES + 1))
    document, findings = parse_yaml(many, "f")
    assert document is None and "aliases" in findings[0].message


def test_deep_nesting_is_refused() -> None:
    document, findings = parse_yaml("[" * 200 + "]" * 200, "f")
    assert document is None and findings[0].severity == "error"


@pytest.mark.parametrize("text", ["a: 1\n---\nb: 2\n", "a: b: c\n", "a: 'open\n", "? [a]\n: 1\n"])
def test_bad_yaml_is_a_finding(text: str) -> None:
    document, findings = parse_yaml(text, "f")
    assert document is None and len(findings) == 1 and findings[0].file == "f"


def test_control_character_is_a_finding_with_its_line() -> None:
    document, findings = parse_yaml("a: 1\nb: x\x00y\n", "f", first_line=2)
    assert document is None
    assert (findings[0].line, findings[0].message) == (3, "control character #x0000 is not allowed in YAML")


def test_frontmatter_split() -> None:
    assert split_frontmatter("---\na: 1\n---\nbody\n", "s") == ("a: 1", "body\n", 4)
    assert isinstance(split_frontmatter("---\na: 1\n", "s"), Finding)
    assert isinstance(split_frontmatter("a: 1\n---\n", "s"), Finding)


def test_finding_rendering() -> None:
    finding = Finding("k/SKILL.md", 3, "name", "error", "bad\nname", "fix it")
    assert finding.to_text() == "k/SKILL.md:3: error: name: bad name (hint: fix it)"
    assert Finding("f", None, "", "warning", "m").to_text() == "f: warning: m"
    assert json.loads(render_json([finding]))[0] == {"file": "k/SKILL.md", "line": 3, "field": "name",
                                                     "severity": "error", "message": "bad\nname", "hint": "fix it"}
    with pytest.raises(ValueError):
        Finding("f", 1, "", "fatal", "m")
    assert [f.line for f in sort_findings([Finding("a", 9, "", "error", "x"), Finding("a", 2, "", "error", "y")])] == [2, 9]


@pytest.mark.parametrize(
    "args",
    [["no/such/path"], ["--format", "xml"], ["pyproject.toml"], ["--no-such-option"]],
)
def test_usage_errors_exit_2(args: list[str], valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", *args, cwd=valid_tree)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_path_outside_repository_is_a_usage_error(valid_tree: Path, tmp_path: Path, toolbox_cli) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = toolbox_cli("validate", str(valid_tree / "knowledge"), str(outside), cwd=valid_tree)
    assert result.exit_code == 2 and "outside the repository" in result.output


def test_no_repository_is_a_usage_error(tmp_path: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", cwd=tmp_path)
    assert result.exit_code == 2 and "pyproject.toml" in result.output


def test_json_output_of_a_clean_tree(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", "--format", "json", cwd=valid_tree)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []


def test_single_file_and_subfolder(valid_tree: Path, toolbox_cli) -> None:
    for target in ("knowledge/attention/demo-skill/SKILL.md", "contracts/attention/demo-copy.yaml",
                   "contracts/attention/demo-copy.py", "contracts", str(valid_tree)):
        result = toolbox_cli("validate", target, cwd=valid_tree)
        assert result.exit_code == 0, (target, result.output)
    only_skill = toolbox_cli("validate", "knowledge/attention/demo-skill/SKILL.md", cwd=valid_tree)
    assert "in 1 skill(s) and 0 contract(s)" in only_skill.output
