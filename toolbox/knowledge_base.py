"""Finding and parsing the repository's skills and contracts (pure functions; the CLI and site reuse them).

Layout: `knowledge/<domain>/<name>/SKILL.md` and `contracts/<domain>/<name>.yaml` (+ `<name>.py`).
Every document is returned even when it is broken: its `findings` say what is wrong, and its
`frontmatter` / `contract` model is None until the document is valid against the schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolbox.documents.contract import Contract
from toolbox.documents.skill import SkillFrontmatter
from toolbox.findings import Finding
from toolbox.validate.schema import schema_findings
from toolbox.yaml_loader import YamlDocument, load_frontmatter_file, load_yaml_file

KNOWLEDGE_DIR = "knowledge"
CONTRACTS_DIR = "contracts"
SKIPPED_DIRS = {"__pycache__", "node_modules"}
SCHEMA_DIR = "schema"  # contracts/schema/ holds the exported JSON Schemas, not contracts


class RepositoryNotFound(LookupError):
    """No folder holding pyproject.toml and knowledge/ or contracts/ above the starting point."""


@dataclass(frozen=True)
class SkillDocument:
    path: Path  # the SKILL.md, as found (not resolved)
    display: str  # path relative to the repository root, posix
    folder: str  # knowledge/<domain>/<folder>/SKILL.md
    domain_folder: str
    yaml: YamlDocument | None
    frontmatter: SkillFrontmatter | None
    body: str
    body_line: int
    findings: tuple[Finding, ...]

    @property
    def name(self) -> str:
        return self.frontmatter.name if self.frontmatter else self.folder

    @property
    def raw(self) -> dict[str, Any]:
        data = self.yaml.data if self.yaml else None
        return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class ContractDocument:
    path: Path  # the .yaml, as found
    display: str
    path_id: str  # `<domain>/<name>` from the path
    yaml: YamlDocument | None
    contract: Contract | None
    findings: tuple[Finding, ...]

    @property
    def id(self) -> str:
        return self.contract.id if self.contract else self.path_id

    @property
    def python_path(self) -> Path:
        return self.path.with_suffix(".py")


def find_repo_root(start: Path | None = None) -> Path:
    """Walk up from `start` (default: cwd) to the folder holding pyproject.toml and knowledge/ or contracts/."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (
            (folder / KNOWLEDGE_DIR).is_dir() or (folder / CONTRACTS_DIR).is_dir()
        ):
            return folder
    raise RepositoryNotFound(f"no folder with pyproject.toml and knowledge/ or contracts/ at or above {here}")


def display_path(path: Path, root: Path) -> str:
    absolute = path if path.is_absolute() else Path.cwd() / path
    try:
        return absolute.relative_to(root).as_posix()
    except ValueError:
        try:
            return absolute.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return str(path)


def walk_files(folder: Path, root: Path, findings: list[Finding]) -> Iterator[Path]:
    """Files under `folder`, sorted; symlinks that leave `root` become findings and are not followed."""
    seen: set[Path] = set()
    real_root = root.resolve()

    def walk(directory: Path) -> Iterator[Path]:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith(".") or entry.name in SKIPPED_DIRS:
                continue
            try:
                real = entry.resolve()
            except (OSError, RuntimeError):  # a symlink loop
                findings.append(Finding(display_path(entry, root), None, "", "error", "symlink loop; not read",
                                        "remove the link or point it at a real file"))
                continue
            if entry.is_symlink() and not real.is_relative_to(real_root):
                findings.append(Finding(display_path(entry, root), None, "", "error",
                                        f"symlink points outside the repository (to {real}); not read",
                                        "replace the link by the file itself, or point it inside the repository"))
                continue
            if entry.is_dir():
                if real not in seen:
                    seen.add(real)
                    yield from walk(entry)
            elif entry.is_file():
                yield entry

    if folder.is_dir():
        yield from walk(folder)


def skill_files(root: Path, findings: list[Finding]) -> list[Path]:
    """Every SKILL.md under knowledge/; misplaced ones become findings."""
    found = []
    base = root / KNOWLEDGE_DIR
    for path in walk_files(base, root, findings):
        if path.name != "SKILL.md":
            continue
        depth = len(path.relative_to(base).parts)
        if depth != 3:
            findings.append(Finding(display_path(path, root), None, "", "error",
                                    "SKILL.md is not at knowledge/<domain>/<name>/SKILL.md; not checked",
                                    "move the skill folder under its domain folder"))
            continue
        found.append(path)
    return found


def contract_files(root: Path, findings: list[Finding]) -> list[Path]:
    """Every contract .yaml under contracts/ (contracts/schema/ excluded); misplaced ones become findings."""
    found = []
    base = root / CONTRACTS_DIR
    for path in walk_files(base, root, findings):
        if path.relative_to(base).parts[0] == SCHEMA_DIR:
            continue
        if path.suffix == ".yml":
            findings.append(Finding(display_path(path, root), None, "", "error", "contract files end in .yaml, not .yml",
                                    f"rename it to {path.with_suffix('.yaml').name}"))
            continue
        if path.suffix == ".py" and not path.with_suffix(".yaml").exists() and len(path.relative_to(base).parts) == 2:
            findings.append(Finding(display_path(path, root), None, "", "warning",
                                    "executable half without a contract: no .yaml of the same name next to it",
                                    f"add {path.with_suffix('.yaml').name} or remove the file (contract halves "
                                    "share no helper modules: they import only the standard library, torch and numpy)"))
            continue
        if path.suffix != ".yaml":
            continue
        if len(path.relative_to(base).parts) != 2:
            findings.append(Finding(display_path(path, root), None, "", "error",
                                    "contract is not at contracts/<domain>/<name>.yaml; not checked",
                                    "move it into its domain folder"))
            continue
        found.append(path)
    return found


def parse_skill(path: Path, root: Path) -> SkillDocument:
    display = display_path(path, root)
    loaded, findings = load_frontmatter_file(path, display, root)
    frontmatter = None
    document = loaded.frontmatter if loaded else None
    if document is not None:
        if not isinstance(document.data, dict):
            findings = [Finding(display, 2, "frontmatter", "error", "frontmatter is not a mapping of keys to values",
                                "write `name: ...`, `description: ...`, `metadata:` lines")]
        else:
            try:
                frontmatter = SkillFrontmatter.model_validate(document.data)
            except ValidationError as error:
                findings = schema_findings(error, SkillFrontmatter, document, display, "skill")
    return SkillDocument(
        path=path,
        display=display,
        folder=path.parent.name,
        domain_folder=path.parent.parent.name,
        yaml=document,
        frontmatter=frontmatter,
        body=loaded.body if loaded else "",
        body_line=loaded.body_line if loaded else 1,
        findings=tuple(findings),
    )


def parse_contract(path: Path, root: Path) -> ContractDocument:
    display = display_path(path, root)
    document, findings = load_yaml_file(path, display, root)
    contract = None
    if document is not None:
        if not isinstance(document.data, dict):
            findings = [Finding(display, 1, "(document)", "error", "contract is not a mapping of keys to values",
                                "start from `toolbox new contract DOMAIN/NAME --skill SKILL`")]
        else:
            try:
                contract = Contract.model_validate(document.data)
            except ValidationError as error:
                findings = schema_findings(error, Contract, document, display, "contract")
    path_id = f"{path.parent.name}/{path.stem}"
    return ContractDocument(path, display, path_id, document, contract, tuple(findings))


def iter_skills(root: Path, findings: list[Finding] | None = None) -> list[SkillDocument]:
    """All skills under root/knowledge, parsed; discovery problems are appended to `findings`."""
    sink = findings if findings is not None else []
    return [parse_skill(path, root) for path in skill_files(root, sink)]


def iter_contracts(root: Path, findings: list[Finding] | None = None) -> list[ContractDocument]:
    """All contracts under root/contracts, parsed; discovery problems are appended to `findings`."""
    sink = findings if findings is not None else []
    return [parse_contract(path, root) for path in contract_files(root, sink)]


def skills_by_name(skills: list[SkillDocument]) -> dict[str, SkillDocument]:
    """Valid skills by name (the first one wins when names repeat)."""
    result: dict[str, SkillDocument] = {}
    for skill in skills:
        if skill.frontmatter is not None:
            result.setdefault(skill.name, skill)
    return result


def default_root() -> Path:
    """The repository around the cwd, else the one this package was installed from (editable install)."""
    try:
        return find_repo_root()
    except RepositoryNotFound:
        return find_repo_root(Path(__file__).resolve().parent)
