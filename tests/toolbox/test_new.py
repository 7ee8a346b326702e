"""`toolbox new skill|contract`: scaffolds validate as generated and link both ways."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch


def test_new_method_skill_validates(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("new", "skill", "decode-profiling", "--domain", "measurement",
                         "--description", "How to profile decode steps.", cwd=valid_tree)
    assert result.exit_code == 0, result.output
    assert (valid_tree / "knowledge/measurement/decode-profiling/SKILL.md").is_file()
    check = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert check.exit_code == 0, check.output
    assert "in 3 skill(s)" in check.output


def test_new_skill_and_contract_link_both_ways(valid_tree: Path, toolbox_cli) -> None:
    assert toolbox_cli("new", "skill", "fused-rope", "--domain", "attention", cwd=valid_tree).exit_code == 0
    # An operation skill without a contract is allowed as a draft but flagged.
    flagged = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert flagged.exit_code == 1 and "names no contract" in flagged.output
    result = toolbox_cli("new", "contract", "attention/fused-rope", "--skill", "fused-rope", "--skill", "demo-skill",
                         cwd=valid_tree)
    assert result.exit_code == 0, result.output
    skill = (valid_tree / "knowledge/attention/fused-rope/SKILL.md").read_text()
    assert 'contracts: "attention/fused-rope"' in skill
    assert 'contracts: "attention/demo-copy attention/fused-rope"' in (valid_tree / "knowledge/attention/demo-skill/SKILL.md").read_text()
    check = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert check.exit_code == 0, check.output
    assert "in 3 skill(s) and 3 contract(s)" in check.output


def test_new_skill_with_existing_contract_adds_back_reference(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("new", "skill", "copy-kernels", "--domain", "attention", "--contract", "attention/demo-copy",
                         cwd=valid_tree)
    assert result.exit_code == 0, result.output
    assert "  - copy-kernels\n" in (valid_tree / "contracts/attention/demo-copy.yaml").read_text()
    check = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert check.exit_code == 0, check.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["skill", "Bad_Name", "--domain", "method"], "not a skill name"),
        (["skill", "demo-skill", "--domain", "method"], "already exists"),
        (["skill", "x-skill", "--domain", "attention", "--contract", "attention/missing"], "does not exist"),
        (["skill", "x-skill", "--domain", "method", "--description", "uses <b>"], "would not validate"),
        (["skill", "x-skill", "--domain", "nowhere"], "Invalid value for '--domain'"),
        (["contract", "attention/demo-copy", "--skill", "demo-skill"], "already exists"),
        (["contract", "noslash", "--skill", "demo-skill"], "not a contract id"),
        (["contract", "attention/new-op", "--skill", "ghost"], "skill 'ghost' does not exist"),
    ],
)
def test_refusals_write_nothing(args: list[str], fragment: str, valid_tree: Path, toolbox_cli) -> None:
    before = sorted(p.relative_to(valid_tree) for p in valid_tree.rglob("*"))
    result = toolbox_cli("new", *args, cwd=valid_tree)
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert sorted(p.relative_to(valid_tree) for p in valid_tree.rglob("*")) == before


def test_scaffolded_python_is_runnable(valid_tree: Path, toolbox_cli) -> None:
    """The generated executable half makes random (non-zero) inputs, and its reference and mutate run."""
    assert toolbox_cli("new", "contract", "attention/copy-two", "--skill", "demo-skill", cwd=valid_tree).exit_code == 0
    spec = importlib.util.spec_from_file_location("copy_two", valid_tree / "contracts/attention/copy-two.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generator = torch.Generator().manual_seed(0)
    inputs = module.make_inputs({"T": 5, "H": 32}, {}, torch.float32, "cpu", generator)
    assert inputs["x"].shape == (5, 32) and inputs["x"].std() > 0.5  # random normal, not zeros
    assert torch.equal(module.reference(**inputs)["out"], inputs["x"])
    mutated, _ = module.flatten_x(inputs, {})
    assert mutated["x"].dim() == 1


IMPLEMENTATIONS = """
def good(x, out):
    if x.dim() != 2:
        raise ValueError("x must be 2-D")
    out.copy_(x)


def off_by_one_percent(x, out):
    if x.dim() != 2:
        raise ValueError("x must be 2-D")
    out.copy_(x * 1.02)


def no_check(x, out):
    out.copy_(x.reshape(out.shape))
"""


def test_scaffolded_contract_runs_in_the_harness(valid_tree: Path, tmp_path: Path, toolbox_cli, monkeypatch) -> None:
    """The scaffold is a working contract: the harness passes a copy and catches a wrong one and a missing check."""
    if importlib.util.find_spec("toolbox.commands.test") is None:
        pytest.skip("toolbox test is not written yet (another helper owns it)")
    assert toolbox_cli("new", "contract", "attention/copy-three", "--skill", "demo-skill", cwd=valid_tree).exit_code == 0
    (tmp_path / "scaffold_impls.py").write_text(IMPLEMENTATIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    statuses = {}
    for name in ("good", "off_by_one_percent", "no_check"):
        result = toolbox_cli("test", "attention/copy-three", "--impl", f"scaffold_impls:{name}", "--no-isolation",
                             "--contracts-dir", "contracts", "--format", "json", cwd=valid_tree)
        statuses[name] = result.output
    assert "INCORRECT_NUMERICAL" not in statuses["good"] and "MISSING_ERROR" not in statuses["good"]
    assert "PASSED" in statuses["good"]
    assert "INCORRECT_NUMERICAL" in statuses["off_by_one_percent"]
    assert "MISSING_ERROR" in statuses["no_check"]


def test_back_reference_edits(tmp_path: Path) -> None:
    from toolbox.templates.render import EditRefused, add_contract_to_skill, add_skill_to_contract

    flow = tmp_path / "flow.yaml"
    flow.write_text("id: a/b\nskills: [one, two]\nversion: 1.0.0\n")
    assert add_skill_to_contract(flow, "three") is True
    assert "skills: [one, two, three]\n" in flow.read_text()
    assert add_skill_to_contract(flow, "three") is False
    block = tmp_path / "block.yaml"
    block.write_text("skills:\n    - one\n    # a comment\n    - two\nversion: 1.0.0\n")
    assert add_skill_to_contract(block, "three") is True
    assert block.read_text() == "skills:\n    - one\n    # a comment\n    - two\n    - three\nversion: 1.0.0\n"
    missing = tmp_path / "SKILL.md"
    missing.write_text("---\nname: x\nmetadata:\n  version: \"1.0.0\"\n---\nbody\n")
    assert add_contract_to_skill(missing, "a/b") is True
    assert '  contracts: "a/b"\n  version' in missing.read_text()
    folded = tmp_path / "folded.md"
    folded.write_text("---\nname: x\nmetadata:\n  contracts: >-\n    a/b\n---\nbody\n")
    with pytest.raises(EditRefused):
        add_contract_to_skill(folded, "c/d")
    assert "c/d" not in folded.read_text()


def test_refused_edit_warns_and_validate_flags_it(valid_tree: Path, toolbox_cli) -> None:
    path = valid_tree / "knowledge/attention/demo-skill/SKILL.md"
    path.write_text(path.read_text().replace('contracts: "attention/demo-copy"', "contracts: >-\n    attention/demo-copy"))
    assert toolbox_cli("validate", cwd=valid_tree).exit_code == 0
    result = toolbox_cli("new", "contract", "attention/demo-four", "--skill", "demo-skill", cwd=valid_tree)
    assert result.exit_code == 0 and "by hand" in result.output
    check = toolbox_cli("validate", cwd=valid_tree)
    assert check.exit_code == 1 and "does not list contract `attention/demo-four`" in check.output
