"""What the site is made of: every skill and contract (parsed once by `toolbox.knowledge_base`), with its page path.

`Catalog.page_for(repository_path)` maps a repository file to the page that shows it, so links
written in skills (`../other-skill/SKILL.md`, `references/x.md`, `scripts/y.py`) become links
between pages; a file that has no page becomes a link to the repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from toolbox.knowledge_base import (
    ContractDocument,
    SkillDocument,
    iter_contracts,
    iter_skills,
    walk_files,
)
from toolbox.site_build import layout
from toolbox.site_build.markdown import repo_relative

SKILL_FILE_FOLDERS = ("references", "scripts", "assets")


@dataclass(frozen=True)
class SkillEntry:
    document: SkillDocument
    domain: str
    name: str
    title: str
    page: str
    references: tuple[str, ...]  # Markdown files under references/, relative to the skill folder
    code_files: tuple[str, ...]  # every other file under references/ and scripts/, relative to the skill folder

    @property
    def folder(self) -> str:
        return f"knowledge/{self.document.domain_folder}/{self.document.folder}"

    @property
    def description(self) -> str:
        return self.document.frontmatter.description if self.document.frontmatter else ""


@dataclass(frozen=True)
class ContractEntry:
    document: ContractDocument
    domain: str
    page: str

    @property
    def id(self) -> str:
        return self.document.id

    @property
    def title(self) -> str:
        return self.document.contract.title if self.document.contract else self.document.id


def _title(body: str, fallback: str) -> str:
    for line in body.splitlines():
        match = re.match(r"^#\s+(.+?)\s*#*\s*$", line)
        if match:
            return match.group(1)
    return fallback


@dataclass(frozen=True)
class Catalog:
    root: Path
    repository: layout.Repository
    skills: tuple[SkillEntry, ...]
    contracts: tuple[ContractEntry, ...]

    @classmethod
    def load(cls, root: Path, repository: layout.Repository | None = None) -> Catalog:
        skills = tuple(sorted((_skill_entry(doc, root) for doc in iter_skills(root)), key=lambda s: (s.domain, s.name)))
        contracts = tuple(sorted((ContractEntry(doc, doc.path_id.split("/")[0], layout.contract_page(doc.path_id))
                                  for doc in iter_contracts(root)), key=lambda c: c.id))
        return cls(root, repository or layout.Repository(), skills, contracts)

    def domains(self) -> list[str]:
        return sorted({s.domain for s in self.skills} | {c.domain for c in self.contracts})

    def skill(self, name: str) -> SkillEntry | None:
        return next((s for s in self.skills if s.name == name), None)

    def contract(self, contract_id: str) -> ContractEntry | None:
        return next((c for c in self.contracts if c.id == contract_id), None)

    def page_for(self, repository_path: str) -> str | None:
        """The page showing a repository file (or skill folder), or None."""
        path = repository_path.rstrip("/")
        for skill in self.skills:
            if path in (skill.folder, f"{skill.folder}/SKILL.md"):
                return skill.page
            if path.startswith(skill.folder + "/"):
                inner = path[len(skill.folder) + 1:]
                if inner in skill.references:
                    return layout.skill_reference_page(skill.domain, skill.name, inner)
                if inner in skill.code_files:
                    return layout.skill_script_page(skill.domain, skill.name, inner)
        for contract in self.contracts:
            if path in (contract.document.display, contract.document.display[: -len(".yaml")] + ".py"):
                return contract.page
        return None

    def resolver(self, source_file: str, page: str):
        """A link resolver for `markdown.rewrite_links`, for Markdown written in repository file `source_file` shown on `page`."""

        def resolve(target: str) -> str | None:
            path, anchor = repo_relative(source_file, target)
            found = self.page_for(path)
            if found is not None:
                return layout.relative_link(page, found) + anchor
            if (self.root / path).exists():
                return self.repository.blob(path) + anchor
            return None

        return resolve


    def code_linker(self, source_file: str, page: str):
        """For `markdown.rewrite_links(code_link=...)`: inline code naming a skill, a contract or a file of this folder."""
        resolve = self.resolver(source_file, page)
        names = {skill.name: skill.page for skill in self.skills}
        contracts = {contract.id: contract.page for contract in self.contracts}

        def link(text: str) -> str | None:
            if text in names and names[text] != page:
                return layout.relative_link(page, names[text])
            if text in contracts:
                return layout.relative_link(page, contracts[text])
            if "/" in text and not text.startswith(("/", "http", ".")) and " " not in text and len(text) < 200:
                path, _ = repo_relative(source_file, text)
                found = self.page_for(path)
                if found is not None and found != page:
                    return resolve(text)
                found = self.page_for(text)  # written from the repository root: `contracts/moe/router-topk.yaml`
                if found is not None and found != page:
                    return layout.relative_link(page, found)
                if found is None and (self.root / text).is_file() and (self.root / text).resolve().is_relative_to(self.root.resolve()):
                    return self.repository.blob(text)
            return None

        return link


def _skill_entry(document: SkillDocument, root: Path) -> SkillEntry:
    meta = document.frontmatter.metadata if document.frontmatter else None
    domain = meta.domain if meta else document.domain_folder
    name = document.name
    folder = document.path.parent
    references, code_files = [], []
    for sub in SKILL_FILE_FOLDERS[:2]:
        for path in walk_files(folder / sub, root, []):
            relative = path.relative_to(folder).as_posix()
            if sub == "references" and path.suffix == ".md":
                references.append(relative)
            elif _is_text(path):
                code_files.append(relative)
    return SkillEntry(document, domain, name, _title(document.body, name), layout.skill_page(domain, name),
                      tuple(references), tuple(code_files))


def _is_text(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False  # binary files are linked in the repository, not rendered
    return "\x00" not in text
