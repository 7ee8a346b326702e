"""mkdocs-gen-files script: writes every generated page (see toolbox.site_build) into the build; nothing is committed.

It also points each page's edit link at the repository file a contributor edits, and gives
mkdocs-llmstxt one entry per skill and contract with its description.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files
from mkdocs.structure.files import InclusionLevel

from toolbox.site_build import NAV_FILE, generate_site
from toolbox.site_build.layout import Repository

HAND_WRITTEN_EDIT_PATHS = {"index.md": "site/docs/index.md", "about.md": "site/docs/about.md"}

config = mkdocs_gen_files.config
root = Path(config.config_file_path).resolve().parent.parent  # site/mkdocs.yml -> the repository
repository = Repository(url=config.repo_url or Repository().url)
site = generate_site(root, repository)

for page, text in site.pages.items():
    with mkdocs_gen_files.open(page, "w") as handle:
        handle.write(text)
for page, source in {**site.edit_paths, **HAND_WRITTEN_EDIT_PATHS}.items():
    mkdocs_gen_files.set_edit_path(page, source)

# The nav file feeds mkdocs-literate-nav only; it is not a page of the site.
nav_file = mkdocs_gen_files.FilesEditor.current().files.get_file_from_path(NAV_FILE)
if nav_file is not None:
    nav_file.inclusion = InclusionLevel.EXCLUDED

llmstxt = config.plugins.get("llmstxt")
if llmstxt is not None:
    llmstxt.config.sections = site.llms_sections
