"""Index pages (all skills, all contracts, one page per domain) and the literate-nav SUMMARY.md."""

from __future__ import annotations

from toolbox.site_build import layout
from toolbox.site_build.catalog import Catalog, ContractEntry, SkillEntry
from toolbox.site_build.markdown import cell, code_cell, table

HAND_WRITTEN = (("Home", "index.md"), ("About", "about.md"))


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _skill_rows(page: str, skills: list[SkillEntry]) -> list[list[str]]:
    rows = []
    for s in skills:
        meta = s.document.frontmatter.metadata if s.document.frontmatter else None
        rows.append([f"[`{s.name}`]({layout.relative_link(page, s.page)})", cell(s.title), code_cell(meta.version if meta else "invalid"),
                     cell(meta.status if meta else "invalid"), cell(_first_sentence(s.description))])
    return rows


def _contract_rows(page: str, contracts: list[ContractEntry]) -> list[list[str]]:
    rows = []
    for c in contracts:
        contract = c.document.contract
        rows.append([f"[`{c.id}`]({layout.relative_link(page, c.page)})", cell(c.title), code_cell(contract.version if contract else "invalid"),
                     cell(contract.status if contract else "invalid"), cell(" ".join(contract.skills) if contract else "")])
    return rows


SKILL_HEADERS = ["skill", "title", "version", "status", "what"]
CONTRACT_HEADERS = ["contract", "title", "version", "status", "skills"]


def skills_index(catalog: Catalog) -> str:
    parts = ["# Skills\n", (f"{len(catalog.skills)} skills in the [Agent Skills](https://agentskills.io) format. An agent loads one by its path, "
             "`knowledge/<domain>/<name>/SKILL.md` (`toolbox skills path NAME` prints it; `toolbox skills install --target DIR` copies them).\n")]
    for domain in catalog.domains():
        mine = [s for s in catalog.skills if s.domain == domain]
        if mine:
            parts += [f"## {layout.domain_title(domain)}\n", table(SKILL_HEADERS, _skill_rows(layout.SKILLS_INDEX, mine))]
    return "\n".join(parts)


def contracts_index(catalog: Catalog) -> str:
    parts = ["# Contracts\n", (f"{len(catalog.contracts)} executable contracts. Each is a YAML document and a Python half "
             "(reference, input maker); `toolbox test ID --impl module:function` runs any implementation against one.\n")]
    for domain in catalog.domains():
        mine = [c for c in catalog.contracts if c.domain == domain]
        if mine:
            parts += [f"## {layout.domain_title(domain)}\n", table(CONTRACT_HEADERS, _contract_rows(layout.CONTRACTS_INDEX, mine))]
    return "\n".join(parts)


def domain_page(catalog: Catalog, domain: str) -> str:
    page = layout.domain_page(domain)
    skills = [s for s in catalog.skills if s.domain == domain]
    contracts = [c for c in catalog.contracts if c.domain == domain]
    parts = [f"# {layout.domain_title(domain)}\n", f"The skills and contracts of the `{domain}` domain.\n", "## Skills\n"]
    parts.append(table(SKILL_HEADERS, _skill_rows(page, skills)) if skills else "No skill in this domain.\n")
    parts.append("## Contracts\n")
    parts.append(table(CONTRACT_HEADERS, _contract_rows(page, contracts)) if contracts else "No contract in this domain.\n")
    return "\n".join(parts)


def domains_index(catalog: Catalog) -> str:
    rows = [[f"[{layout.domain_title(d)}]({layout.relative_link(layout.DOMAINS_INDEX, layout.domain_page(d))})",
             cell(sum(1 for s in catalog.skills if s.domain == d)), cell(sum(1 for c in catalog.contracts if c.domain == d))]
            for d in catalog.domains()]
    return "# Domains\n\n" + table(["domain", "skills", "contracts"], rows)


def summary(catalog: Catalog) -> str:
    """The navigation, for mkdocs-literate-nav: every skill and contract page appears exactly once."""
    lines = [f"- [{HAND_WRITTEN[0][0]}]({HAND_WRITTEN[0][1]})", "- Skills", f"    - [All skills]({layout.SKILLS_INDEX})"]
    for domain in catalog.domains():
        mine = [s for s in catalog.skills if s.domain == domain]
        if mine:
            lines.append(f"    - {layout.domain_title(domain)}")
            lines += [f"        - [{s.name}]({s.page})" for s in mine]
    lines += ["- Contracts", f"    - [All contracts]({layout.CONTRACTS_INDEX})"]
    for domain in catalog.domains():
        mine = [c for c in catalog.contracts if c.domain == domain]
        if mine:
            lines.append(f"    - {layout.domain_title(domain)}")
            lines += [f"        - [{c.id.split('/', 1)[1]}]({c.page})" for c in mine]
    lines += ["- Domains", f"    - [All domains]({layout.DOMAINS_INDEX})"]
    lines += [f"    - [{layout.domain_title(d)}]({layout.domain_page(d)})" for d in catalog.domains()]
    lines += [f"- [Status]({layout.STATUS_PAGE})", f"- [Benchmarks]({layout.BENCHMARKS_PAGE})"]
    lines += [f"- [{title}]({path})" for title, path in HAND_WRITTEN[1:]]
    return "\n".join(lines) + "\n"
