"""Run every check over a repository and keep the findings for the requested paths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolbox.findings import Finding, sort_findings
from toolbox.knowledge_base import (
    CONTRACTS_DIR,
    KNOWLEDGE_DIR,
    contract_files,
    display_path,
    parse_contract,
    parse_skill,
    skill_files,
)
from toolbox.validate.contracts import check_contract
from toolbox.validate.references import check_references
from toolbox.validate.skills import check_skill
from toolbox.validate.versions import check_revision, version_findings


class UsageProblem(ValueError):
    """A bad path or revision: the command exits 2."""


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    skills_checked: int
    contracts_checked: int

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.is_error)

    @property
    def warnings(self) -> int:
        return len(self.findings) - self.errors


def scope_of(root: Path, paths: list[Path]) -> list[str]:
    """Display prefixes to keep: a file keeps itself (and a contract's sibling), a folder what is under it."""
    if not paths:
        return [f"{KNOWLEDGE_DIR}/", f"{CONTRACTS_DIR}/"]
    scope = []
    real_root = root.resolve()
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise UsageProblem(f"no such file or folder: {path}")
        absolute = path.absolute()
        parent = absolute.parent.resolve() if path.is_symlink() else absolute.resolve().parent
        located = parent / absolute.name
        if not (located == real_root or located.is_relative_to(real_root)):
            raise UsageProblem(f"{path} is outside the repository at {root}")
        display = display_path(located, real_root) if located != real_root else ""
        if located.is_dir() and not located.is_symlink():
            scope.append(f"{display}/" if display else "")
            continue
        if located.name == "SKILL.md" or (display.startswith(f"{CONTRACTS_DIR}/") and located.suffix in (".yaml", ".yml")):
            scope.append(display)
            if located.suffix in (".yaml", ".yml"):
                scope.append(display_path(located.with_suffix(".py"), real_root))
        elif display.startswith(f"{CONTRACTS_DIR}/") and located.suffix == ".py":
            scope += [display, display_path(located.with_suffix(".yaml"), real_root)]
        else:
            raise UsageProblem(f"{path} is neither a SKILL.md, a contract (contracts/<domain>/<name>.yaml) nor a folder")
    return scope


def validate_repository(root: Path, paths: list[Path] | None = None, since: str | None = None) -> Report:
    """All findings for documents under `paths` (default: knowledge/ and contracts/), in the context of the whole repository."""
    root = root.resolve()
    scope = scope_of(root, list(paths or []))
    if since is not None:
        try:
            check_revision(root, since)
        except ValueError as error:
            raise UsageProblem(str(error)) from None
    discovery: list[Finding] = []
    skills = [skill for path in skill_files(root, discovery)
              if (skill := _parse_guarded(parse_skill, path, root, discovery)) is not None]
    contracts = [document for path in contract_files(root, discovery)
                 if (document := _parse_guarded(parse_contract, path, root, discovery)) is not None]
    path_owners = {document.path_id: document.display for document in contracts}
    findings = list(discovery)
    for skill in skills:
        findings += _guarded(skill.display, lambda skill=skill: check_skill(skill))
    for document in contracts:
        findings += _guarded(document.display, lambda document=document: check_contract(document, root, path_owners))
    findings += _guarded("knowledge", lambda: check_references(skills, contracts))
    if since is not None:
        findings += _guarded("knowledge", lambda: version_findings(root, since, skills, contracts))

    def in_scope(display: str) -> bool:
        return any(display == prefix or (prefix.endswith("/") or prefix == "") and display.startswith(prefix)
                   for prefix in scope)

    kept = [finding for finding in findings if in_scope(finding.file)]
    return Report(
        findings=tuple(sort_findings(kept)),
        skills_checked=sum(1 for s in skills if in_scope(s.display)),
        contracts_checked=sum(1 for c in contracts if in_scope(c.display)),
    )


def _crash(display: str, error: Exception) -> Finding:
    return Finding(display, None, "", "error", f"the validator failed on this document: {type(error).__name__}: {error}",
                   "this is a toolbox bug; please report it with the document")


def _guarded(display: str, check) -> list[Finding]:
    """Run one check; a bug in it becomes a finding on that document instead of a traceback."""
    try:
        return list(check())
    except Exception as error:  # noqa: BLE001 - deliberately broad: the CLI must never show a traceback
        return [_crash(display, error)]


def _parse_guarded(parse, path: Path, root: Path, sink: list[Finding]):
    try:
        return parse(path, root)
    except Exception as error:  # noqa: BLE001 - as above
        sink.append(_crash(display_path(path, root), error))
        return None
