"""Pages for one skill: the rendered SKILL.md body with a metadata box, its references, its scripts as code pages."""

from __future__ import annotations

import html
from pathlib import PurePosixPath

from toolbox.site_build import layout
from toolbox.site_build.catalog import Catalog, SkillEntry
from toolbox.site_build.markdown import fence, rewrite_links

LANGUAGES = {".py": "python", ".sh": "bash", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
             ".cu": "cuda", ".cuh": "cuda", ".cpp": "cpp", ".c": "c", ".h": "c", ".md": "markdown", ".txt": "text"}


def skill_pages(catalog: Catalog, skill: SkillEntry) -> dict[str, str]:
    """{docs path: Markdown} for the skill's page, its references and its scripts."""
    pages = {skill.page: skill_page(catalog, skill)}
    for relative in skill.references:
        page = layout.skill_reference_page(skill.domain, skill.name, relative)
        source = f"{skill.folder}/{relative}"
        text = (catalog.root / source).read_text(encoding="utf-8")
        back = f'<p class="toolbox-crumb">Reference of the skill <a href="{html.escape(layout.page_href(page, skill.page))}">{html.escape(skill.name)}</a> · <code>{html.escape(source)}</code></p>\n\n'
        linked = rewrite_links(text, catalog.resolver(source, page), catalog.code_linker(source, page))
        pages[page] = _after_title(linked, back, f"# {PurePosixPath(relative).stem}\n\n")
    for relative in skill.code_files:
        page = layout.skill_script_page(skill.domain, skill.name, relative)
        source = f"{skill.folder}/{relative}"
        text = (catalog.root / source).read_text(encoding="utf-8")
        language = LANGUAGES.get(PurePosixPath(relative).suffix, "text")
        pages[page] = (
            f"# {relative}\n\n"
            f'<p class="toolbox-crumb">File of the skill <a href="{html.escape(layout.page_href(page, skill.page))}">{html.escape(skill.name)}</a> · '
            f'<code>{html.escape(source)}</code> · run it from the repository root: <code>python {html.escape(source)}</code></p>\n\n'
            + fence(text, language)
        )
    return pages


def skill_page(catalog: Catalog, skill: SkillEntry) -> str:
    body = rewrite_links(skill.document.body, catalog.resolver(skill.document.display, skill.page),
                         catalog.code_linker(skill.document.display, skill.page))
    return _after_title(body, metadata_box(catalog, skill), f"# {skill.name}\n\n")


def _after_title(body: str, insert: str, default_title: str) -> str:
    """Insert `insert` right after the first H1 (or give the page `default_title` when it has none)."""
    lines = body.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.startswith("# "):
            return "".join(lines[: index + 1]) + "\n" + insert + "\n" + "".join(lines[index + 1:])
    return default_title + insert + "\n" + body


def _links(items: list[tuple[str, str | None]]) -> str:
    """(label, href or None) pairs as HTML; None marks a dangling reference."""
    if not items:
        return "none"
    parts = []
    for label, href in items:
        if href is None:
            parts.append(f'<code>{html.escape(label)}</code> <em>(missing)</em>')
        else:
            parts.append(f'<a href="{html.escape(href)}"><code>{html.escape(label)}</code></a>')
    return ", ".join(parts)


def metadata_box(catalog: Catalog, skill: SkillEntry) -> str:
    """The box under the title: version, status, domain, applies-to, updated, contracts, requires, files."""
    frontmatter = skill.document.frontmatter
    if frontmatter is None:
        findings = "".join(f"<li>{html.escape(f.message)}</li>" for f in skill.document.findings)
        return f'<div class="toolbox-meta toolbox-invalid"><p><strong>This skill does not validate</strong>; run <code>toolbox validate {html.escape(skill.document.display)}</code>.</p><ul>{findings}</ul></div>\n'
    meta = frontmatter.metadata
    contracts = [(cid, layout.page_href(skill.page, c.page) if (c := catalog.contract(cid)) else None) for cid in meta.contract_ids()]
    requires = [(name, layout.page_href(skill.page, s.page) if (s := catalog.skill(name)) else None) for name in meta.required_skills()]
    files = [(rel, layout.page_href(skill.page, layout.skill_reference_page(skill.domain, skill.name, rel))) for rel in skill.references]
    files += [(rel, layout.page_href(skill.page, layout.skill_script_page(skill.domain, skill.name, rel))) for rel in skill.code_files]
    domain_href = layout.page_href(skill.page, layout.domain_page(skill.domain))
    rows = [
        ("Version", f"<code>{html.escape(meta.version)}</code>"),
        ("Status", f'<span class="toolbox-status toolbox-status-{html.escape(meta.status)}">{html.escape(meta.status)}</span>'),
        ("Domain", f'<a href="{html.escape(domain_href)}">{html.escape(meta.domain)}</a>'),
        ("Applies to", " ".join(f"<code>{html.escape(t)}</code>" for t in meta.applies_to.split()) or "any"),
        ("Updated", html.escape(meta.updated)),
        ("Contracts", _links(contracts)),
        ("Requires", _links(requires)),
        ("Files", _links(files)),
        ("Source", f'<a href="{html.escape(catalog.repository.blob(skill.document.display))}"><code>{html.escape(skill.document.display)}</code></a>'),
    ]
    table_rows = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in rows)
    return (
        f'<div class="toolbox-meta">\n<p class="toolbox-when">{html.escape(frontmatter.description)}</p>\n'
        f"<table class=\"toolbox-facts\">{table_rows}</table>\n</div>\n"
    )
