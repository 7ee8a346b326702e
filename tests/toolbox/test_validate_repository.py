"""The repository's own skills: the public `skills-ref validate` accepts each, and the set is complete.

The count test fails until the skill writers land the knowledge base; that is intended.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from skills_ref import validate as skills_ref_validate

REPO_ROOT = Path(__file__).resolve().parents[2]
SKILL_FILES = sorted((REPO_ROOT / "knowledge").glob("*/*/SKILL.md"))
MINIMUM_SKILLS = 20


@pytest.mark.parametrize("skill_file", SKILL_FILES, ids=[p.parent.name for p in SKILL_FILES])
def test_skills_ref_accepts(skill_file: Path) -> None:
    assert skills_ref_validate(skill_file.parent) == []


def test_skills_ref_rejects_a_known_bad_skill(tmp_path: Path) -> None:
    """The check above can fail: skills-ref refuses a name that differs from its folder."""
    folder = tmp_path / "some-skill"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: other-skill\ndescription: x\n---\nbody\n")
    assert skills_ref_validate(folder) != []


def test_knowledge_base_has_enough_skills() -> None:
    assert len(SKILL_FILES) >= MINIMUM_SKILLS, f"only {len(SKILL_FILES)} skills under knowledge/"
