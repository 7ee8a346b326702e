"""The built site in headless Chromium: pages render with their headings and no console errors; screenshots kept.

Screenshots go to artifacts/site/*.png (git-ignored) for people to look at. Chromium is required
in CI (CI=true): there the test fails when it is missing; elsewhere it is skipped.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest

from tests.site.browser import Chromium, LoopbackServer, find_chromium
from toolbox.knowledge_base import find_repo_root

REPO_ROOT = find_repo_root(Path(__file__).resolve().parent)

pytestmark = pytest.mark.browser
ARTIFACTS = REPO_ROOT / "artifacts" / "site"

# (name, served path, expected H1, H2 headings that must be present)
PAGES = [
    ("home", "", "Inference skills toolbox", ["What is here", "Where to start"]),
    ("skill-gated-deltanet", "skills/linear-attention/gated-deltanet/", "Gated DeltaNet (Qwen3.5 / Qwen3.6 linear attention)",
     ["1. The layer (Qwen3.6-35B-A3B shapes [2][4])", "Changelog"]),
    ("contract-rmsnorm", "contracts/norms-and-activations/rmsnorm/", "Zero-centred RMSNorm (weight applied as 1 + w), computed in float32",
     ["Axes", "Inputs", "Outputs", "Tolerances", "Cases", "Error cases", "Benchmarks", "Roofline", "Latest results", "Executable half", "Changelog"]),
    ("status", "status/", "Contract status", ["By contract", "Results files"]),
    ("benchmarks", "benchmarks/", "Engine benchmarks", []),
]


@pytest.fixture(scope="module")
def chromium():
    executable = find_chromium()
    if executable is None:
        message = "headless Chromium is not installed (apt-get install chromium); the site's browser test needs it"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with Chromium(executable) as browser:
        yield browser


def test_pages_render_without_console_errors(built_site, chromium):
    with LoopbackServer(built_site.output_dir) as server:
        visits = [(chromium.visit(server.url + path, screenshot=ARTIFACTS / f"{name}.png"), h1, headings)
                  for name, path, h1, headings in PAGES]
        # a proof that the collector sees errors: a missing page is reported (HTTP 404)
        missing = chromium.visit(server.url + "no-such-page/")
    assert any("404" in error for error in missing.errors), missing.errors
    for visit, h1, headings in visits:
        assert visit.errors == [], f"{visit.url}: {visit.errors}"
        assert visit.h1 == h1, visit.url
        for heading in headings:
            assert heading in visit.headings, f"{visit.url}: no heading {heading!r} in {visit.headings}"
        assert visit.screenshot is not None and visit.screenshot.stat().st_size > 10_000


def test_skill_page_shows_its_metadata_and_links(built_site, chromium):
    with LoopbackServer(built_site.output_dir) as server:
        chromium.visit(server.url + "skills/linear-attention/gated-deltanet/")
        rows = chromium.evaluate("Array.from(document.querySelectorAll('.toolbox-meta th')).map(th => th.textContent)")
        contract_links = chromium.evaluate(
            "Array.from(document.querySelectorAll('.toolbox-meta a')).map(a => a.href).filter(h => h.includes('/contracts/'))")
        # follow one link from the box: it must land on the contract's page
        chromium.visit(contract_links[0])
        landed_h1 = chromium.evaluate("document.querySelector('article h1').textContent")
    assert rows[:5] == ["Version", "Status", "Domain", "Applies to", "Updated"]
    assert len(contract_links) == 3
    assert landed_h1.strip("¶ ").strip()


def test_dark_palette_toggle(built_site, chromium):
    with LoopbackServer(built_site.output_dir) as server:
        chromium.visit(server.url + "contracts/norms-and-activations/rmsnorm/")
        before = chromium.evaluate("document.body.getAttribute('data-md-color-scheme')")
        chromium.evaluate("document.querySelector('form[data-md-component=palette] label:not([hidden])').click()")
        after = chromium.evaluate("document.body.getAttribute('data-md-color-scheme')")
        data = chromium.call("Page.captureScreenshot", format="png")["data"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "contract-rmsnorm-dark.png").write_bytes(base64.b64decode(data))
    assert {before, after} == {"default", "slate"}


def test_search_finds_skill_and_contract_pages(built_site, chromium):
    """Material's client-side search (a web worker over search_index.json) answers in the browser."""
    typed = """(() => {
        const box = document.querySelector('input[data-md-component=search-query]');
        box.focus(); box.value = QUERY;
        box.dispatchEvent(new Event('input', {bubbles: true}));
        box.dispatchEvent(new KeyboardEvent('keyup', {key: 'e', bubbles: true}));
    })()"""
    found = {}
    with LoopbackServer(built_site.output_dir) as server:
        for query, expected in (("deltanet", "/skills/linear-attention/gated-deltanet/"), ("zero-centred", "/contracts/norms-and-activations/rmsnorm/")):
            visit = chromium.visit(server.url)
            assert visit.errors == []
            chromium.evaluate(typed.replace("QUERY", repr(query)))
            hrefs: list[str] = []
            for _ in range(40):  # the worker indexes first; up to 20 s on a busy CI machine
                time.sleep(0.5)
                hrefs = chromium.evaluate("Array.from(document.querySelectorAll('.md-search-result__item a')).map(a => a.href)")
                if hrefs:
                    break
            found[query] = (expected, hrefs)
    for query, (expected, hrefs) in found.items():
        assert any(expected in href for href in hrefs), f"search for {query!r} did not list {expected}: {hrefs[:10]}"
