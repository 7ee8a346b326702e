"""Where each document lands on the site (paths relative to the docs folder) and how pages link to each other.

Skills: `skills/<domain>/<name>/index.md` (its references under `references/`, its scripts under
`scripts/<file>.md`); contracts: `contracts/<domain>/<name>.md`; domain indexes:
`domains/<domain>.md`; the dashboard `status.md`; engine benchmarks `benchmarks.md`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

DEFAULT_REPO_URL = "https://github.com/inference-skills/toolbox"
DEFAULT_BRANCH = "main"
STATUS_PAGE = "status.md"
BENCHMARKS_PAGE = "benchmarks.md"
SKILLS_INDEX = "skills/index.md"
CONTRACTS_INDEX = "contracts/index.md"
DOMAINS_INDEX = "domains/index.md"


def skill_page(domain: str, name: str) -> str:
    return f"skills/{domain}/{name}/index.md"


def skill_reference_page(domain: str, name: str, relative: str) -> str:
    """`relative` is the file's path inside the skill folder, e.g. `references/chunked-derivation.md`."""
    return f"skills/{domain}/{name}/{relative}"


def skill_script_page(domain: str, name: str, relative: str) -> str:
    """`scripts/x.py` -> `skills/<domain>/<name>/scripts/x.py.md` (the extension stays, so x.py and x.sh never collide)."""
    return f"skills/{domain}/{name}/{relative}.md"


def contract_page(contract_id: str) -> str:
    return f"contracts/{contract_id}.md"


def domain_page(domain: str) -> str:
    return f"domains/{domain}.md"


def relative_link(from_page: str, to_page: str) -> str:
    """A link from one docs-relative page to another, relative to the first page's folder (what mkdocs resolves)."""
    return posixpath.relpath(to_page, posixpath.dirname(from_page) or ".")


def page_href(from_page: str, to_page: str) -> str:
    """An href for raw HTML (which mkdocs does not rewrite): the URL as the built site serves it (`x/index.md` -> `x/`, `y.md` -> `y/`)."""
    relative = relative_link(from_page, to_page)
    from_folder = from_page.endswith("index.md")
    prefix = "" if from_folder else "../"  # a page y.md is served as y/index.html: one folder deeper
    if relative.endswith("index.md"):
        target = relative[: -len("index.md")]
    else:
        target = relative[: -len(".md")] + "/"
    return (prefix + target) or "./"


DOMAIN_TITLES = {"kv-cache": "KV cache", "moe": "MoE", "norms-and-activations": "Norms and activations"}


def domain_title(domain: str) -> str:
    return DOMAIN_TITLES.get(domain, domain.replace("-", " ").capitalize())


@dataclass(frozen=True)
class Repository:
    """The public repository pages link to (edit links, files that are not pages)."""

    url: str = DEFAULT_REPO_URL
    branch: str = DEFAULT_BRANCH

    def blob(self, path: str) -> str:
        return f"{self.url.rstrip('/')}/blob/{self.branch}/{path}"
