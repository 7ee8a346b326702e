"""`toolbox validate --since REV`: changed documents must bump their version; versions never go down."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolbox.validate.versions import semver_key

SKILL = "knowledge/attention/demo-skill/SKILL.md"
COPY = "contracts/attention/demo-copy.yaml"
COPY_PY = "contracts/attention/demo-copy.py"


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def repo(valid_tree: Path) -> Path:
    git(valid_tree, "init", "-q")
    git(valid_tree, "add", ".")
    git(valid_tree, "commit", "-qm", "base")
    return valid_tree


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_unchanged_is_clean(repo: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 0, result.output


def test_changed_skill_without_bump(repo: Path, toolbox_cli) -> None:
    edit(repo / SKILL, "The body of a valid skill.", "The body of a valid skill, reworded.")
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 1
    lines = result.stdout.strip().split("\n")
    assert len(lines) == 2, result.output
    assert lines[0].startswith(f"{SKILL}:6: error: metadata.version: changed since HEAD but the version is still 1.1.0")


def test_changed_skill_with_bump_and_entry(repo: Path, toolbox_cli) -> None:
    edit(repo / SKILL, "The body of a valid skill.", "The body of a valid skill, reworded.")
    edit(repo / SKILL, '  version: "1.1.0"', '  version: "1.1.1"')
    edit(repo / SKILL, "## Changelog\n", "## Changelog\n\n- 1.1.1 (2026-12-02): Reworded.\n")
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 0, result.output


def test_bump_without_changelog_entry(repo: Path, toolbox_cli) -> None:
    edit(repo / SKILL, '  version: "1.1.0"', '  version: "1.2.0"')
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 1
    assert "no entry for the current version 1.2.0" in result.stdout
    assert len(result.stdout.strip().split("\n")) == 2


def test_decreasing_version(repo: Path, toolbox_cli) -> None:
    edit(repo / SKILL, '  version: "1.1.0"', '  version: "1.0.0"')
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 1
    lines = result.stdout.strip().split("\n")
    assert len(lines) == 2, result.output
    assert lines[0].startswith(f"{SKILL}:6: error: metadata.version: version decreased from 1.1.0 at HEAD to 1.0.0")


def test_contract_python_change_needs_bump(repo: Path, toolbox_cli) -> None:
    edit(repo / COPY_PY, "return {\"out\": x.clone()}", "return {\"out\": x.clone() * 1}")
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 1
    assert f"{COPY}:2: error: version: changed since HEAD (its {COPY_PY} changed) but the version is still 1.0.0" in result.stdout
    edit(repo / COPY, "version: 1.0.0\ntitle", "version: 2.0.0\ntitle")
    edit(repo / COPY, "changelog:\n", "changelog:\n  - version: 2.0.0\n    date: \"2026-12-02\"\n    changes: New reference.\n")
    assert toolbox_cli("validate", "--since", "HEAD", cwd=repo).exit_code == 0


def test_changed_bundled_file_needs_bump(repo: Path, toolbox_cli) -> None:
    script = repo / "knowledge/method/demo-method/scripts/check_demo.py"
    script.write_text(script.read_text() + "print('more')\n")
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert result.exit_code == 1
    assert ("knowledge/method/demo-method/SKILL.md:5: error: metadata.version: changed since HEAD (its "
            "knowledge/method/demo-method/scripts/check_demo.py changed) but the version is still 0.1.0") in result.stdout
    new_file = repo / "knowledge/method/demo-method/references/notes.md"
    new_file.parent.mkdir()
    new_file.write_text("notes\n")
    script.write_text(script.read_text().replace("print('more')\n", ""))
    result = toolbox_cli("validate", "--since", "HEAD", cwd=repo)
    assert "(its knowledge/method/demo-method/references/notes.md changed)" in result.stdout


def test_new_document_needs_no_bump(repo: Path, toolbox_cli) -> None:
    result = toolbox_cli("new", "skill", "demo-new", "--domain", "method", cwd=repo)
    assert result.exit_code == 0, result.output
    assert toolbox_cli("validate", "--since", "HEAD", cwd=repo).exit_code == 0


@pytest.mark.parametrize("rev", ["no-such-rev", "--all", "HEAD~5"])
def test_bad_revision_is_a_usage_error(rev: str, repo: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", "--since", rev, cwd=repo)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_since_outside_git_is_a_usage_error(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", "--since", "HEAD", cwd=valid_tree)
    assert result.exit_code == 2, result.output


def test_semver_precedence() -> None:
    ordered = ["0.9.9", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
               "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.10.0", "2.0.0"]
    keys = [semver_key(v) for v in ordered]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)
    assert semver_key("1.0.0+build.5") == semver_key("1.0.0")
    with pytest.raises(ValueError):
        semver_key("1.0")
