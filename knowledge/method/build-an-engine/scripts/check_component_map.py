"""Check the component map of ../SKILL.md (section 2) against the knowledge base it sits in.

Every skill name and contract id in the table must exist, and every contract of the repository
must appear in the table (so a new contract forces the map to be updated). In a cell, a bare
name after a full contract id (`moe/token-permute`, `token-unpermute`) means the same domain.
Run from anywhere inside the repository: python check_component_map.py   (exit 1 on findings)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
SKILL = HERE.parent.parent / "SKILL.md"


def repository_root() -> Path:
    for parent in HERE.parents:
        if (parent / "knowledge").is_dir() and (parent / "contracts").is_dir():
            return parent
    raise SystemExit("no knowledge/ and contracts/ above this script")


def table_rows(text: str) -> list[list[str]]:
    section = text.split("## 2. Map components to skills and contracts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]  # skip the header


def main() -> int:
    root = repository_root()
    skills = {p.parent.name for p in (root / "knowledge").glob("*/*/SKILL.md")}
    contracts = {str(p.relative_to(root / "contracts").with_suffix("")) for p in (root / "contracts").glob("*/*.yaml")}
    findings, named_contracts = [], set()
    for component, skill_cell, contract_cell in table_rows(SKILL.read_text(encoding="utf-8")):
        for name in re.findall(r"`([^`]+)`", skill_cell):
            if name not in skills:
                findings.append(f"{component}: skill `{name}` does not exist")
        domain = None
        for name in re.findall(r"`([^`]+)`", contract_cell):
            if "/" in name:
                domain = name.split("/")[0]
            elif domain is not None:
                name = f"{domain}/{name}"
            else:
                findings.append(f"{component}: `{name}` is neither a contract id nor after one")
                continue
            named_contracts.add(name)
            if name not in contracts:
                findings.append(f"{component}: contract `{name}` does not exist")
    for missing in sorted(contracts - named_contracts):
        findings.append(f"contract `{missing}` exists but is not in the component map")
    print("\n".join(findings) if findings else f"component map ok: {len(named_contracts)} contracts, all present")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
