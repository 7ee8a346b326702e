"""The committed JSON Schemas equal what the pydantic models export, and they accept real documents."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from toolbox.knowledge_base import iter_contracts
from toolbox.schema_export import SCHEMA_DIR, SCHEMAS, rendered, write


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_committed_schema_matches_models(name: str, repo_root: Path) -> None:
    committed = repo_root / SCHEMA_DIR / name
    assert committed.is_file(), f"{committed} missing: run `python -m toolbox.schema_export`"
    assert committed.read_text(encoding="utf-8") == rendered()[name], (
        f"{committed} drifted from the pydantic models: run `python -m toolbox.schema_export`")


def test_write_only_touches_changed_files(tmp_path: Path) -> None:
    assert len(write(tmp_path)) == len(SCHEMAS)
    assert write(tmp_path) == []
    stale = tmp_path / SCHEMA_DIR / "contract.schema.json"
    stale.write_text("{}")
    assert write(tmp_path) == [stale]


def test_schemas_accept_the_fixture_documents_and_reject_a_bad_one() -> None:
    root = Path(__file__).resolve().parent / "malformed" / "valid-tree"
    schema = json.loads(rendered()["contract.schema.json"])
    jsonschema.Draft202012Validator.check_schema(schema)
    documents = iter_contracts(root)
    assert documents
    for document in documents:
        jsonschema.validate(document.yaml.data, schema)
    bad = dict(documents[0].yaml.data, version="1.0")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
