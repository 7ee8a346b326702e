"""The knowledge site's generator: pure functions from the repository to {docs path: Markdown}.

`site/gen/pages.py` (a mkdocs-gen-files script) writes what `generate_site(root)` returns into the
build; nothing generated is committed. `toolbox site build|serve` drives mkdocs (see `build.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolbox.site_build import layout
from toolbox.site_build.benchmarks_page import benchmarks_page
from toolbox.site_build.catalog import Catalog
from toolbox.site_build.contract_pages import contract_page
from toolbox.site_build.dashboard import dashboard_page
from toolbox.site_build.indexes import (
    contracts_index,
    domain_page,
    domains_index,
    skills_index,
    summary,
)
from toolbox.site_build.results import latest_rows, load_result_files
from toolbox.site_build.skill_pages import skill_pages

NAV_FILE = "SUMMARY.md"


@dataclass(frozen=True)
class GeneratedSite:
    pages: dict[str, str]  # docs path -> Markdown
    edit_paths: dict[str, str]  # docs path -> repository path a contributor edits
    llms_sections: dict[str, list[dict[str, str]]]  # mkdocs-llmstxt `sections`: {title: [{page: description}]}


def generate_site(root: Path, repository: layout.Repository | None = None) -> GeneratedSite:
    catalog = Catalog.load(root, repository)
    files = load_result_files(root)
    rows = latest_rows(files)
    pages: dict[str, str] = {}
    edit_paths: dict[str, str] = {}
    for skill in catalog.skills:
        for page, text in skill_pages(catalog, skill).items():
            pages[page] = text
        edit_paths[skill.page] = skill.document.display
        for relative in skill.references:
            edit_paths[layout.skill_reference_page(skill.domain, skill.name, relative)] = f"{skill.folder}/{relative}"
        for relative in skill.code_files:
            edit_paths[layout.skill_script_page(skill.domain, skill.name, relative)] = f"{skill.folder}/{relative}"
    for contract in catalog.contracts:
        pages[contract.page] = contract_page(catalog, contract, rows)
        edit_paths[contract.page] = contract.document.display
    pages[layout.SKILLS_INDEX] = skills_index(catalog)
    pages[layout.CONTRACTS_INDEX] = contracts_index(catalog)
    pages[layout.DOMAINS_INDEX] = domains_index(catalog)
    for domain in catalog.domains():
        pages[layout.domain_page(domain)] = domain_page(catalog, domain)
    pages[layout.STATUS_PAGE] = dashboard_page(catalog, files, rows)
    pages[layout.BENCHMARKS_PAGE] = benchmarks_page(files)
    pages[NAV_FILE] = summary(catalog)
    llms = {
        "Skills (load the SKILL.md by its repository path; these pages render them)": [
            {s.page: " ".join(s.description.split())} for s in catalog.skills],
        "Contracts (run `toolbox test ID --impl module:function`)": [
            {c.page: " ".join(c.document.contract.summary.split()) if c.document.contract else c.id} for c in catalog.contracts],
        "Overview": [{layout.SKILLS_INDEX: "every skill by domain"}, {layout.CONTRACTS_INDEX: "every contract by domain"},
                     {layout.STATUS_PAGE: "latest contract results per implementation and device"},
                     {layout.BENCHMARKS_PAGE: "engine benchmarks against the floor and a peer"}],
    }
    return GeneratedSite(pages, edit_paths, llms)


__all__ = ["NAV_FILE", "GeneratedSite", "generate_site"]
