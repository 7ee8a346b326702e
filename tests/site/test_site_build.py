"""The site as CI builds it: strict and clean, one page per skill and contract, all in the nav, llms.txt, links resolve."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from toolbox.knowledge_base import iter_contracts, iter_skills
from toolbox.site_build import layout


def _served(docs_page: str) -> str:
    """The URL path (relative to the site root) mkdocs serves a docs page at."""
    return layout.page_href("index.md", docs_page)


def test_strict_build_has_no_warnings(built_site):
    assert built_site.returncode == 0
    assert not [line for line in built_site.log.splitlines() if "WARNING" in line or "ERROR" in line], built_site.log


def test_every_skill_and_contract_has_exactly_one_page_in_the_nav(built_site, repo_root):
    home = (built_site.output_dir / "index.html").read_text(encoding="utf-8")
    home = home[home.index("md-nav--primary"): home.index('class="md-content"')]  # the navigation only
    skills, contracts = iter_skills(repo_root), iter_contracts(repo_root)
    assert len(skills) > 20 and len(contracts) > 20
    for skill in skills:
        page = layout.skill_page(skill.frontmatter.metadata.domain, skill.name)
        assert (built_site.output_dir / _served(page) / "index.html").is_file(), skill.name
        assert home.count(f'href="{_served(page)}"') == 1, f"{skill.name} is not exactly once in the navigation"
        # a leaf link named for the skill (not swallowed as a section's index page)
        assert re.search(rf'href="{re.escape(_served(page))}" class="md-nav__link[^"]*">\s*<span class="md-ellipsis">\s*{re.escape(skill.name)}\s*<', home), skill.name
    for contract in contracts:
        page = layout.contract_page(contract.id)
        assert (built_site.output_dir / _served(page) / "index.html").is_file(), contract.id
        assert home.count(f'href="{_served(page)}"') == 1, f"{contract.id} is not exactly once in the navigation"
    # no other page claims to be a skill or contract page (one page each, no leftovers)
    assert len(list((built_site.output_dir / "skills").glob("*/*/index.html"))) == len(skills)
    assert len(list((built_site.output_dir / "contracts").glob("*/*/index.html"))) == len(contracts)
    assert not (built_site.output_dir / "SUMMARY").exists(), "the nav file must not be a page"


def test_every_skill_and_contract_is_searchable(built_site, repo_root):
    index = json.loads((built_site.output_dir / "search" / "search_index.json").read_text(encoding="utf-8"))
    locations = {doc["location"] for doc in index["docs"]}
    for skill in iter_skills(repo_root):
        assert _served(layout.skill_page(skill.frontmatter.metadata.domain, skill.name)) in locations, skill.name
    for contract in iter_contracts(repo_root):
        assert _served(layout.contract_page(contract.id)) in locations, contract.id


def test_llms_txt_lists_every_skill_with_its_description(built_site, repo_root):
    llms = (built_site.output_dir / "llms.txt").read_text(encoding="utf-8")
    assert llms.startswith("# ")
    for skill in iter_skills(repo_root):
        line = next((line for line in llms.splitlines() if line.startswith(f"- [{skill.name}](")), None)
        assert line is not None, f"{skill.name} missing from llms.txt"
        assert " ".join(skill.frontmatter.description.split())[:60] in line
        url = re.search(r"\]\(([^)]+)\)", line).group(1)
        assert (built_site.output_dir / urlparse(url).path.split("/toolbox/", 1)[1]).is_file(), url
    for contract in iter_contracts(repo_root):
        assert f"/contracts/{contract.id}/index.md)" in llms, contract.id
    full = (built_site.output_dir / "llms-full.txt").read_text(encoding="utf-8")
    assert "Gated DeltaNet" in full and len(full) > len(llms)


LINK = re.compile(r'<(?:a|link|script|img)\b[^>]*?\s(?:href|src)="([^"]*)"')


def broken_links(root: Path) -> list[str]:
    broken = []
    for page in root.rglob("*.html"):
        if page.name == "404.html":
            continue  # served for any path, so its links are absolute under site_url
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if urlparse(target).scheme or target.startswith(("#", "mailto:", "//")):
                continue
            path = unquote(urldefrag(target)[0])
            if not path:
                continue
            resolved = Path(os.path.normpath(page.parent / path))
            if resolved.is_dir():
                resolved = resolved / "index.html"
            if not resolved.exists():
                broken.append(f"{page.relative_to(root)} -> {target}")
    return broken


def test_every_internal_link_resolves(built_site):
    """Raw-HTML links (metadata boxes, crumbs) are not checked by mkdocs, so every href in the build is checked here."""
    broken = broken_links(built_site.output_dir)
    assert not broken, "broken links:\n" + "\n".join(broken[:40])


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text('<a href="../b/">b</a> <a class="x" href="../a/#top">a</a> <img src="../c.png">')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "index.html").write_text('<a href="https://example.org">web</a> <code>&lt;a href="nowhere/"&gt;</code>')
    assert broken_links(tmp_path) == ["a/index.html -> ../c.png"]


def test_pages_have_edit_links_to_their_sources(built_site):
    skill = (built_site.output_dir / "skills/linear-attention/gated-deltanet/index.html").read_text(encoding="utf-8")
    assert "edit/main/knowledge/linear-attention/gated-deltanet/SKILL.md" in skill
    contract = (built_site.output_dir / "contracts/norms-and-activations/rmsnorm/index.html").read_text(encoding="utf-8")
    assert "edit/main/contracts/norms-and-activations/rmsnorm.yaml" in contract
    home = (built_site.output_dir / "index.html").read_text(encoding="utf-8")
    assert "edit/main/site/docs/index.md" in home
    status = (built_site.output_dir / "status/index.html").read_text(encoding="utf-8")
    assert "edit/main/" not in status, "a generated page with no single source has no edit link"


def test_skill_page_renders_references_and_scripts(built_site):
    base = built_site.output_dir / "skills/linear-attention/gated-deltanet"
    assert (base / "references/chunked-derivation/index.html").is_file()
    script = (base / "scripts/chunked_vs_recurrent.py/index.html").read_text(encoding="utf-8")
    assert 'class="highlight"' in script and '<span class="k">def</span>' in script  # highlighted Python


def test_toolbox_site_build_cli(tmp_path, repo_root):
    """The CLI is a thin layer: usage errors are clear, and --help carries examples."""
    from click.testing import CliRunner

    from toolbox.cli import main

    result = CliRunner().invoke(main, ["site", "build", "--help"])
    assert result.exit_code == 0 and "Examples:" in result.output and "--no-strict" in result.output
    result = CliRunner().invoke(main, ["site", "serve", "--port", "0"])
    assert result.exit_code == 2 and "0 is not in the range" in result.output


@pytest.mark.parametrize("page", ["status/index.html", "benchmarks/index.html", "domains/attention/index.html"])
def test_generated_pages_exist(built_site, page):
    assert (built_site.output_dir / page).is_file()
