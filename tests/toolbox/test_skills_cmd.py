"""`toolbox skills list|show|path|install` over the small valid tree."""

from __future__ import annotations

import json
from pathlib import Path

SKILL = "knowledge/attention/demo-skill/SKILL.md"


def test_list_text_and_json(valid_tree: Path, toolbox_cli) -> None:
    text = toolbox_cli("skills", "list", cwd=valid_tree)
    assert text.exit_code == 0, text.output
    lines = text.stdout.strip().split("\n")
    assert [line.split()[:3] for line in lines] == [["demo-method", "0.1.0", "draft"], ["demo-skill", "1.1.0", "stable"]]
    records = json.loads(toolbox_cli("skills", "list", "--format", "json", cwd=valid_tree).stdout)
    assert [r["name"] for r in records] == ["demo-method", "demo-skill"]
    assert records[1]["contracts"] == ["attention/demo-copy"]
    assert records[1]["path"] == str(valid_tree / SKILL)
    assert {"name", "version", "status", "description", "domain", "path"} <= set(records[0])


def test_list_by_domain(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("skills", "list", "--domain", "method", "--format", "json", cwd=valid_tree)
    assert [r["name"] for r in json.loads(result.stdout)] == ["demo-method"]


def test_list_warns_about_broken_skills(valid_tree: Path, toolbox_cli) -> None:
    (valid_tree / SKILL).write_text("---\nname: [\n---\n")
    result = toolbox_cli("skills", "list", cwd=valid_tree)
    assert result.exit_code == 0
    assert "1 skill(s) could not be read" in result.output
    assert "demo-skill" not in result.stdout


def test_path_and_show(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("skills", "path", "demo-skill", cwd=valid_tree)
    assert result.exit_code == 0
    path = Path(result.stdout.strip())
    assert path.is_absolute() and path == valid_tree / SKILL
    shown = toolbox_cli("skills", "show", "demo-skill", cwd=valid_tree)
    assert shown.stdout == (valid_tree / SKILL).read_text()


def test_unknown_name_suggests(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("skills", "path", "demo-skil", cwd=valid_tree)
    assert result.exit_code == 1
    assert "no skill named 'demo-skil'" in result.output and "Did you mean: demo-skill" in result.output
    assert result.stdout == ""


def test_install_copy_refuse_force(valid_tree: Path, tmp_path: Path, toolbox_cli) -> None:
    target = tmp_path / "agent" / ".claude" / "skills"
    result = toolbox_cli("skills", "install", "--target", str(target), cwd=valid_tree)
    assert result.exit_code == 0, result.output
    installed = target / "demo-skill" / "SKILL.md"
    assert installed.read_text() == (valid_tree / SKILL).read_text() and not installed.is_symlink()
    assert (target / "demo-method" / "SKILL.md").is_file()
    installed.write_text("locally edited")
    again = toolbox_cli("skills", "install", "--target", str(target), "demo-skill", cwd=valid_tree)
    assert again.exit_code == 1 and "--force" in again.output
    assert installed.read_text() == "locally edited"
    forced = toolbox_cli("skills", "install", "--target", str(target), "--force", "demo-skill", cwd=valid_tree)
    assert forced.exit_code == 0
    assert installed.read_text() == (valid_tree / SKILL).read_text()


def test_install_link(valid_tree: Path, tmp_path: Path, toolbox_cli) -> None:
    target = tmp_path / "skills"
    result = toolbox_cli("skills", "install", "--target", str(target), "--link", "demo-skill", cwd=valid_tree)
    assert result.exit_code == 0, result.output
    link = target / "demo-skill"
    assert link.is_symlink() and link.resolve() == (valid_tree / SKILL).parent.resolve()
    assert not (target / "demo-method").exists()


def test_install_unknown_name_installs_nothing(valid_tree: Path, tmp_path: Path, toolbox_cli) -> None:
    target = tmp_path / "skills"
    result = toolbox_cli("skills", "install", "--target", str(target), "demo-skill", "nope", cwd=valid_tree)
    assert result.exit_code == 1
    assert not target.exists()
