"""Render the `toolbox new` templates and add back-references to existing documents by minimal text edits.

Edits touch one line (or insert one) and are verified by re-parsing; an edit that cannot be made
safely is refused with instructions instead.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from string import Template

from toolbox.yaml_loader import parse_yaml, split_frontmatter


class EditRefused(ValueError):
    """The file's layout is not one the editor knows how to change safely."""


def render(relative: str, **values: str) -> str:
    text = resources.files("toolbox.templates").joinpath(relative).read_text(encoding="utf-8")
    return Template(text).substitute(values)


def yaml_string(text: str) -> str:
    """A double-quoted YAML scalar (JSON strings are valid YAML)."""
    return json.dumps(text, ensure_ascii=False)


def add_contract_to_skill(path: Path, contract_id: str) -> bool:
    """Append `contract_id` to `metadata.contracts` of a SKILL.md; False when already there."""
    text = path.read_text(encoding="utf-8")
    split = split_frontmatter(text, str(path))
    if not isinstance(split, tuple):
        raise EditRefused(f"{path}: frontmatter unreadable")
    lines = text.split("\n")
    closing = split[2] - 2  # index of the closing `---`
    metadata_index = next((i for i in range(1, closing) if re.match(r"^metadata:\s*$", lines[i])), None)
    if metadata_index is None:
        raise EditRefused(f"{path}: no `metadata:` block in the frontmatter")
    children = [i for i in range(metadata_index + 1, closing) if re.match(r"^\s+\S", lines[i])]
    contracts_index = next((i for i in children if re.match(r"^\s+contracts:", lines[i])), None)
    if contracts_index is not None:
        match = re.match(r'^(\s+contracts:\s*)(["\']?)(.*?)\2\s*$', lines[contracts_index])
        if match is None:
            raise EditRefused(f"{path}:{contracts_index + 1}: `contracts:` is not a one-line string")
        if match.group(3).startswith((">", "|", "[", "{", "&", "*", "!")):
            raise EditRefused(f"{path}:{contracts_index + 1}: `contracts:` is not a plain one-line string")
        ids = match.group(3).split()
        if contract_id in ids:
            return False
        lines[contracts_index] = f'{match.group(1)}"{" ".join([*ids, contract_id])}"'
    else:
        indent = re.match(r"^(\s+)", lines[children[0]]).group(1) if children else "  "  # type: ignore[union-attr]
        lines.insert(metadata_index + 1, f'{indent}contracts: "{contract_id}"')
    new_text = "\n".join(lines)
    _verify_skill(new_text, contract_id, path)
    path.write_text(new_text, encoding="utf-8")
    return True


def add_skill_to_contract(path: Path, skill_name: str) -> bool:
    """Append `skill_name` to `skills:` of a contract YAML; False when already there."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    index = next((i for i, line in enumerate(lines) if re.match(r"^skills:", line)), None)
    if index is None:
        raise EditRefused(f"{path}: no top-level `skills:`")
    flow = re.match(r"^skills:\s*\[(.*)\]\s*$", lines[index])
    if flow is not None:
        names = [n.strip().strip("'\"") for n in flow.group(1).split(",") if n.strip()]
        if skill_name in names:
            return False
        lines[index] = f"skills: [{', '.join([*names, skill_name])}]"
    elif re.match(r"^skills:\s*$", lines[index]):
        items = []
        for i in range(index + 1, len(lines)):
            if re.match(r"^\s*-\s", lines[i]):
                items.append(i)
            elif lines[i].strip() and not lines[i].lstrip().startswith("#"):
                break
        if not items:
            raise EditRefused(f"{path}:{index + 1}: `skills:` has no block list items")
        names = [lines[i].split("-", 1)[1].strip().strip("'\"") for i in items]
        if skill_name in names:
            return False
        indent = lines[items[-1]][: len(lines[items[-1]]) - len(lines[items[-1]].lstrip())]
        lines.insert(items[-1] + 1, f"{indent}- {skill_name}")
    else:
        raise EditRefused(f"{path}:{index + 1}: `skills:` is neither a flow nor a block list")
    new_text = "\n".join(lines)
    document, _ = parse_yaml(new_text, str(path))
    if document is None or skill_name not in (document.data or {}).get("skills", []):
        raise EditRefused(f"{path}: could not add {skill_name!r} to `skills:` safely")
    path.write_text(new_text, encoding="utf-8")
    return True


def _verify_skill(text: str, contract_id: str, path: Path) -> None:
    split = split_frontmatter(text, str(path))
    document = parse_yaml(split[0], str(path), 2)[0] if isinstance(split, tuple) else None
    data = document.data if document else None
    contracts = (data or {}).get("metadata", {}).get("contracts", "") if isinstance(data, dict) else ""
    if not isinstance(contracts, str) or contract_id not in contracts.split():
        raise EditRefused(f"{path}: could not add {contract_id!r} to metadata.contracts safely")
