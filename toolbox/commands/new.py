"""`toolbox new skill|contract`: scaffold documents that pass `toolbox validate` as generated."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import click

from toolbox.documents.skill import CONTRACT_ID_PATTERN, DOMAINS, NAME_PATTERN, SkillFrontmatter
from toolbox.knowledge_base import (
    CONTRACTS_DIR,
    KNOWLEDGE_DIR,
    RepositoryNotFound,
    find_repo_root,
    iter_contracts,
    iter_skills,
    skills_by_name,
)
from toolbox.templates.render import EditRefused, add_contract_to_skill, add_skill_to_contract, render, yaml_string

BUMP_NOTE = "bump its version and add a changelog line before the pull request (`toolbox validate --since`)"


def _root() -> Path:
    try:
        return find_repo_root()
    except RepositoryNotFound as error:
        raise click.UsageError(str(error)) from None


def _today() -> str:
    return datetime.date.today().isoformat()


@click.group(
    "new",
    epilog="""\b
Examples:
  toolbox new skill my-technique --domain method
  toolbox new skill fused-rope --domain attention --contract attention/partial-rope
  toolbox new contract attention/fused-rope --skill fused-rope
""",
)
def command() -> None:
    """Scaffold a new skill or contract that validates as generated."""


@command.command(
    "skill",
    epilog="""\b
Examples:
  toolbox new skill decode-profiling --domain measurement --description "How to profile decode steps."
  toolbox new skill fused-rope --domain attention --contract attention/partial-rope

\b
Each --contract must exist; the contract's `skills:` gets the new skill added.
""",
)
@click.argument("name")
@click.option("--domain", required=True, type=click.Choice(DOMAINS), help="The knowledge/ folder it goes into.")
@click.option("--description", help="What the skill covers and when to load it (1-1024 chars, no angle brackets).")
@click.option("--contract", "contracts", multiple=True, metavar="ID", help="A contract this skill specifies (repeatable).")
def skill_command(name: str, domain: str, description: str | None, contracts: tuple[str, ...]) -> None:
    """Create knowledge/DOMAIN/NAME/SKILL.md from the template."""
    root = _root()
    if not re.match(NAME_PATTERN, name) or len(name) > 64:
        raise click.UsageError(f"{name!r} is not a skill name: kebab-case, at most 64 characters (e.g. fused-rope)")
    folder = root / KNOWLEDGE_DIR / domain / name
    if folder.exists():
        raise click.UsageError(f"{folder} already exists")
    taken = {skill.name for skill in iter_skills(root)} | {p.parent.name for p in (root / KNOWLEDGE_DIR).glob("*/*/SKILL.md")}
    if name in taken:
        raise click.UsageError(f"a skill named {name!r} already exists (skill names are unique across domains)")
    existing = {document.id: document for document in iter_contracts(root)}
    for contract_id in contracts:
        if not re.match(CONTRACT_ID_PATTERN, contract_id):
            raise click.UsageError(f"{contract_id!r} is not a contract id of the form <domain>/<name>")
        if contract_id not in existing:
            raise click.UsageError(
                f"contract {contract_id!r} does not exist; create the skill without it, then "
                f"`toolbox new contract {contract_id} --skill {name}` links the two")
    description = description or (
        f"TODO: what {name} covers and when an agent should load it (implementing, verifying or debugging what).")
    title = name.replace("-", " ").capitalize()
    verification = "\n".join(f"- `toolbox test {c} --impl your_package.module:function`" for c in contracts) or \
        "TODO: how to check an implementation (which contract cases, which numbers to compare)."
    text = render("skill/SKILL.md.tmpl", name=name, description=yaml_string(description), domain=domain,
                  contracts=" ".join(contracts), date=_today(), title=title, verification=verification)
    _check_frontmatter(text)
    folder.mkdir(parents=True)
    path = folder / "SKILL.md"
    path.write_text(text, encoding="utf-8")
    click.echo(f"created {path.relative_to(root)}")
    for contract_id in contracts:
        path = existing[contract_id].path
        _link(lambda path=path: add_skill_to_contract(path, name), path, root, f"added {name} to `skills:` of")


@command.command(
    "contract",
    epilog="""\b
Examples:
  toolbox new contract attention/fused-rope --skill fused-rope
  toolbox new contract moe/expert-histogram --skill moe-routing --skill fused-moe-kernels

\b
Each --skill must exist; its metadata.contracts gets the new contract id added.
""",
)
@click.argument("contract_id", metavar="DOMAIN/NAME")
@click.option("--skill", "skills", multiple=True, required=True, help="A skill documenting it (repeatable).")
@click.option("--title", help="One-line title (default: from the name).")
def contract_command(contract_id: str, skills: tuple[str, ...], title: str | None) -> None:
    """Create contracts/DOMAIN/NAME.yaml and its executable half NAME.py from the templates."""
    root = _root()
    if not re.match(CONTRACT_ID_PATTERN, contract_id):
        raise click.UsageError(f"{contract_id!r} is not a contract id: <domain>/<name> in kebab-case")
    domain, name = contract_id.split("/")
    yaml_path = root / CONTRACTS_DIR / domain / f"{name}.yaml"
    python_path = yaml_path.with_suffix(".py")
    if yaml_path.exists() or python_path.exists():
        raise click.UsageError(f"{yaml_path} or {python_path.name} already exists")
    known = skills_by_name(iter_skills(root))
    for skill in skills:
        if skill not in known:
            raise click.UsageError(f"skill {skill!r} does not exist (or does not validate); create it first with "
                                   f"`toolbox new skill {skill} --domain ...`")
    title = title or name.replace("-", " ").capitalize()
    text = render("contract/contract.yaml.tmpl", id=contract_id, title=yaml_string(title), skill=skills[0],
                  date=_today())
    text = text.replace(f"  - {skills[0]}\n", "".join(f"  - {s}\n" for s in skills), 1)
    yaml_path.parent.mkdir(parents=True, exist_ok=True)
    yaml_path.write_text(text, encoding="utf-8")
    python_path.write_text(render("contract/contract.py.tmpl", id=contract_id), encoding="utf-8")
    click.echo(f"created {yaml_path.relative_to(root)} and {python_path.relative_to(root)}")
    for skill in skills:
        path = known[skill].path
        _link(lambda path=path: add_contract_to_skill(path, contract_id), path, root, f"added {contract_id} to metadata.contracts of")


def _link(edit, path: Path, root: Path, what: str) -> None:
    try:
        changed = edit()
    except EditRefused as error:
        click.echo(f"warning: {error}; make the reference two-way by hand", err=True)
        return
    if changed:
        click.echo(f"{what} {path.relative_to(root)}: {BUMP_NOTE}")


def _check_frontmatter(text: str) -> None:
    """Refuse a description the schema would reject, before anything is written."""
    from pydantic import ValidationError

    from toolbox.yaml_loader import parse_yaml, split_frontmatter

    split = split_frontmatter(text, "SKILL.md")
    document = parse_yaml(split[0], "SKILL.md")[0] if isinstance(split, tuple) else None
    try:
        SkillFrontmatter.model_validate(document.data if document else None)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors(include_url=False))
        raise click.UsageError(f"the skill would not validate: {problems}") from None
