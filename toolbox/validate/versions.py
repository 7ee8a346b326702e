"""Semantic-version rules against an earlier revision (`toolbox validate --since REV`).

A document that changed since REV must have a higher version than it had at REV (and, like every
document, a changelog entry for its current version, which the per-document checks enforce). A
contract counts as changed when its .yaml or its executable .py changed. A version lower than at
REV is always an error.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from toolbox.documents.skill import SEMVER_PATTERN
from toolbox.findings import Finding
from toolbox.knowledge_base import ContractDocument, SkillDocument, display_path
from toolbox.yaml_loader import parse_yaml, split_frontmatter


class RevisionError(ValueError):
    """REV is not a commit of the repository holding the documents (a usage error)."""


def semver_key(version: str) -> tuple[Any, ...]:
    """Sort key following semver precedence (build metadata ignored)."""
    match = re.match(SEMVER_PATTERN, version)
    if not match:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, prerelease = match.group(1), match.group(2), match.group(3), match.group(4)
    if prerelease is None:
        pre: tuple[Any, ...] = ((1,),)  # a release sorts after all of its prereleases
    else:
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in prerelease.split("."))
        pre = ((0,), *pre)
    return (int(major), int(minor), int(patch), pre)


def check_revision(root: Path, rev: str) -> None:
    if rev.startswith("-"):
        raise RevisionError(f"revision {rev!r} may not start with '-'")
    result = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if result is None or result.returncode != 0:
        raise RevisionError(f"{rev!r} is not a commit of the git repository at {root}")


def version_findings(root: Path, rev: str, skills: list[SkillDocument], contracts: list[ContractDocument]) -> list[Finding]:
    findings = []
    changed = _changed_paths(root, rev)
    for skill in skills:
        if skill.frontmatter is None or skill.yaml is None:
            continue
        old = _old_text(root, rev, skill.path)
        if old is None:
            continue  # new since REV
        folder = skill.display.rsplit("/", 1)[0] + "/"
        others = sorted(p for p in changed if p.startswith(folder) and p != skill.display)
        if old == _read(skill.path) and not others:
            continue
        previous = _old_skill_version(old)
        detail = f" (its {others[0]} changed)" if old == _read(skill.path) else ""
        findings += _compare(skill.display, skill.yaml.line_of(("metadata", "version")), "metadata.version",
                             skill.frontmatter.metadata.version, previous, rev, detail)
    for document in contracts:
        if document.contract is None or document.yaml is None:
            continue
        old = _old_text(root, rev, document.path)
        if old is None:
            continue
        same_yaml = old == _read(document.path)
        same_python = _old_text(root, rev, document.python_path) == _read(document.python_path)
        if same_yaml and same_python:
            continue
        previous = _old_contract_version(old)
        findings += _compare(document.display, document.yaml.line_of(("version",)), "version",
                             document.contract.version, previous, rev,
                             "" if not same_yaml else f" (its {display_path(document.python_path, root)} changed)")
    return findings


def _compare(display: str, line: int | None, field: str, current: str, previous: str | None, rev: str,
             detail: str = "") -> list[Finding]:
    if previous is None:
        return []  # no readable version at REV: nothing to compare with
    try:
        now, then = semver_key(current), semver_key(previous)
    except ValueError:
        return []
    if now < then:
        return [Finding(display, line, field, "error", f"version decreased from {previous} at {rev} to {current}",
                        f"versions only go up: use a version above {previous}")]
    if now == then:
        return [Finding(display, line, field, "error", f"changed since {rev}{detail} but the version is still {current}",
                        "bump it (MAJOR: passing implementations may now fail; MINOR: cases or optional fields "
                        "added; PATCH: prose) and add a changelog entry for the new version")]
    return []


def _changed_paths(root: Path, rev: str) -> set[str]:
    """Paths (relative to root) that differ from REV in the working tree, untracked new files included."""
    paths: set[str] = set()
    for args in (("diff", "--name-only", "--relative", rev, "--", "."), ("ls-files", "--others", "--exclude-standard")):
        result = _git(root, *args)
        if result is not None and result.returncode == 0:
            paths.update(line for line in result.stdout.decode("utf-8", errors="replace").splitlines() if line)
    return paths


def _old_skill_version(text: str) -> str | None:
    split = split_frontmatter(text, "old")
    if isinstance(split, Finding):
        return None
    document, _ = parse_yaml(split[0], "old", 2)
    data = document.data if document else None
    metadata = data.get("metadata") if isinstance(data, dict) else None
    version = metadata.get("version") if isinstance(metadata, dict) else None
    return version if isinstance(version, str) else None


def _old_contract_version(text: str) -> str | None:
    document, _ = parse_yaml(text, "old")
    data = document.data if document else None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def _old_text(root: Path, rev: str, path: Path) -> str | None:
    relative = display_path(path, root)
    result = _git(root, "show", f"{rev}:./{relative}")
    if result is None or result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", errors="replace")


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
