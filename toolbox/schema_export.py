"""Export the JSON Schemas of the document models to contracts/schema/ (`python -m toolbox.schema_export`).

The committed files must equal what the models produce; a test fails when they drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from toolbox.documents.contract import Contract
from toolbox.documents.skill import SkillFrontmatter

SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "skill-frontmatter.schema.json": (SkillFrontmatter, "Frontmatter of knowledge/<domain>/<name>/SKILL.md"),
    "contract.schema.json": (Contract, "A contract document, contracts/<domain>/<name>.yaml"),
}
SCHEMA_DIR = Path("contracts") / "schema"


def render(model: type[BaseModel], title: str) -> str:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    document = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **{
        key: value for key, value in schema.items() if key != "title"}}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    return {name: render(model, title) for name, (model, title) in SCHEMAS.items()}


def write(root: Path) -> list[Path]:
    folder = root / SCHEMA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main() -> int:
    from toolbox.knowledge_base import RepositoryNotFound, find_repo_root

    try:
        root = find_repo_root()
    except RepositoryNotFound as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    written = write(root)
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    if not written:
        print(f"{SCHEMA_DIR}/ is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
