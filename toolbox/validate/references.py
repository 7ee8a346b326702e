"""Cross references between documents: skills <-> contracts, `requires`, unique names and ids."""

from __future__ import annotations

import difflib

from toolbox.findings import Finding
from toolbox.knowledge_base import ContractDocument, SkillDocument


def check_references(skills: list[SkillDocument], contracts: list[ContractDocument]) -> list[Finding]:
    findings: list[Finding] = []
    # Names and ids that exist, even in broken documents (their own errors are reported on them).
    skill_names = {s.folder for s in skills} | {s.name for s in skills}
    contract_ids = {c.path_id for c in contracts} | {c.id for c in contracts}
    valid_skills = _first_by(skills, lambda s: s.name, lambda s: s.frontmatter is not None)
    valid_contracts = _first_by(contracts, lambda c: c.id, lambda c: c.contract is not None)
    findings += _duplicate_names(skills)

    for skill in skills:
        if skill.frontmatter is None or skill.yaml is None:
            continue
        metadata = skill.frontmatter.metadata
        line_contracts = skill.yaml.line_of(("metadata", "contracts"))
        for contract_id in metadata.contract_ids():
            if contract_id not in contract_ids:
                findings.append(Finding(skill.display, line_contracts, "metadata.contracts", "error",
                                        f"contract `{contract_id}` does not exist", _suggest(contract_id, contract_ids,
                                        f"create contracts/{contract_id}.yaml or remove the id")))
                continue
            target = valid_contracts.get(contract_id)
            if target is not None and not {skill.name, skill.folder} & set(target.contract.skills):  # type: ignore[union-attr]
                findings.append(Finding(skill.display, line_contracts, "metadata.contracts", "error",
                                        f"contract `{contract_id}` does not list skill `{skill.name}` in its `skills:`",
                                        f"add `{skill.name}` to `skills:` in {target.display}, or drop the id here"))
        line_requires = skill.yaml.line_of(("metadata", "requires"))
        for required in metadata.required_skills():
            if required not in skill_names:
                findings.append(Finding(skill.display, line_requires, "metadata.requires", "error",
                                        f"required skill `{required}` does not exist",
                                        _suggest(required, skill_names, "fix the name or remove it")))
            elif required == skill.name:
                findings.append(Finding(skill.display, line_requires, "metadata.requires", "error",
                                        "a skill cannot require itself", f"remove `{required}`"))

    for document in contracts:
        if document.contract is None or document.yaml is None:
            continue
        for index, name in enumerate(document.contract.skills):
            line = document.yaml.line_of(("skills", index))
            if name not in skill_names:
                findings.append(Finding(document.display, line, f"skills[{index}]", "error",
                                        f"skill `{name}` does not exist",
                                        _suggest(name, skill_names, f"create it with `toolbox new skill {name} ...` "
                                                 "or fix the name")))
                continue
            target = valid_skills.get(name)
            if target is not None and not {document.id, document.path_id} & set(target.frontmatter.metadata.contract_ids()):  # type: ignore[union-attr]
                findings.append(Finding(document.display, line, f"skills[{index}]", "error",
                                        f"skill `{name}` does not list contract `{document.id}` in its metadata.contracts",
                                        f"add `{document.id}` to `contracts:` in {target.display}, or drop the skill here"))
    return findings


def _duplicate_names(skills: list[SkillDocument]) -> list[Finding]:
    """Skill names repeat only across domains; contract ids cannot repeat without an id/path mismatch (see contracts.py)."""
    findings = []
    first_skill: dict[str, SkillDocument] = {}
    for skill in skills:
        if skill.frontmatter is None or skill.yaml is None:
            continue
        if skill.name in first_skill:
            findings.append(Finding(skill.display, skill.yaml.line_of(("name",)), "name", "error",
                                    f"skill name `{skill.name}` is also used by {first_skill[skill.name].display}",
                                    "skill names are unique across all domains: rename one of them"))
        else:
            first_skill[skill.name] = skill
    return findings


def _first_by(items, key, keep) -> dict:
    result: dict = {}
    for item in items:
        if keep(item):
            result.setdefault(key(item), item)
    return result


def _suggest(name: str, known: set[str], otherwise: str) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"did you mean `{close[0]}`?" if close else otherwise
