"""One strict build of the real repository's site per test session, shared by the site tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.knowledge_base import find_repo_root
from toolbox.site_build.build import BuildResult, build, missing_packages

REPO_ROOT = find_repo_root(Path(__file__).resolve().parent)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> BuildResult:
    missing = missing_packages()
    if missing:
        pytest.fail(f"the site packages are not installed ({', '.join(missing)}): pip install -e \".[site]\"")
    result = build(REPO_ROOT, tmp_path_factory.mktemp("site") / "build", strict=True)
    assert result.returncode == 0, f"strict site build failed:\n{result.log[-6000:]}"
    return result
