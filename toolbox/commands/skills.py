"""`toolbox skills list|show|path|install`: find the skill to load, and put skills where an agent looks."""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path

import click

from toolbox.knowledge_base import RepositoryNotFound, SkillDocument, default_root, iter_skills, skills_by_name


def _skills() -> tuple[Path, dict[str, SkillDocument], int]:
    try:
        root = default_root()
    except RepositoryNotFound as error:
        raise click.UsageError(str(error)) from None
    documents = iter_skills(root)
    valid = skills_by_name(documents)
    return root, dict(sorted(valid.items())), len(documents) - len(valid)


def _lookup(name: str) -> SkillDocument:
    _, skills, _ = _skills()
    if name in skills:
        return skills[name]
    close = difflib.get_close_matches(name, list(skills), n=3, cutoff=0.5)
    suggestion = f" Did you mean: {', '.join(close)}?" if close else " See `toolbox skills list`."
    click.echo(f"error: no skill named {name!r}.{suggestion}", err=True)
    raise SystemExit(1)


@click.group(
    "skills",
    epilog="""\b
Examples:
  toolbox skills list --domain attention
  toolbox skills path gated-attention          # the file an agent should load
  toolbox skills show nvfp4-format | less
  toolbox skills install --target .claude/skills --link
""",
)
def command() -> None:
    """List, show, locate or install skills for an agent."""


@command.command(
    "list",
    epilog="""\b
Examples:
  toolbox skills list
  toolbox skills list --domain quantization --format json
""",
)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--domain", help="Only skills of this domain (e.g. attention, moe, quantization).")
def list_command(output_format: str, domain: str | None) -> None:
    """List skills: name, version, status, description."""
    root, skills, broken = _skills()
    rows = [s for s in skills.values() if domain is None or s.frontmatter.metadata.domain == domain]  # type: ignore[union-attr]
    if output_format == "json":
        click.echo(json.dumps([_as_dict(s, root) for s in rows], indent=2))
    else:
        width = max((len(s.name) for s in rows), default=4)
        for skill in rows:
            meta = skill.frontmatter.metadata  # type: ignore[union-attr]
            description = " ".join(skill.frontmatter.description.split())  # type: ignore[union-attr]
            description = description if len(description) <= 90 else description[:87] + "..."
            click.echo(f"{skill.name:<{width}}  {meta.version:<8} {meta.status:<10} {description}")
        click.echo(f"{len(rows)} skill(s)", err=True)
    if broken:
        click.echo(f"warning: {broken} skill(s) could not be read; run `toolbox validate knowledge`", err=True)


def _as_dict(skill: SkillDocument, root: Path) -> dict[str, object]:
    frontmatter = skill.frontmatter
    assert frontmatter is not None
    return {
        "name": skill.name,
        "version": frontmatter.metadata.version,
        "status": frontmatter.metadata.status,
        "domain": frontmatter.metadata.domain,
        "description": frontmatter.description,
        "contracts": frontmatter.metadata.contract_ids(),
        "requires": frontmatter.metadata.required_skills(),
        "path": str(skill.path.absolute()),
    }


@command.command(
    "show",
    epilog="""\b
Examples:
  toolbox skills show gated-deltanet
""",
)
@click.argument("name")
def show_command(name: str) -> None:
    """Print a skill's SKILL.md."""
    skill = _lookup(name)
    click.echo(skill.path.read_text(encoding="utf-8"), nl=False)


@command.command(
    "path",
    epilog="""\b
Examples:
  toolbox skills path paged-decode-attention
  cat "$(toolbox skills path nvfp4-format)"
""",
)
@click.argument("name")
def path_command(name: str) -> None:
    """Print the absolute path of a skill's SKILL.md (the file an agent should load)."""
    click.echo(str(_lookup(name).path.absolute()))


@command.command(
    "install",
    epilog="""\b
Examples:
  toolbox skills install --target .claude/skills                 # every skill, copied
  toolbox skills install --target .claude/skills --link gated-attention moe-routing
  toolbox skills install --target ~/.agents/skills --force       # replace what is there
""",
)
@click.option("--target", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder that receives one sub-folder per skill, e.g. .claude/skills.")
@click.option("--link", is_flag=True, help="Symlink the skill folders instead of copying them.")
@click.option("--force", is_flag=True, help="Replace skills already present in the target.")
@click.argument("names", nargs=-1)
def install_command(target: Path, link: bool, force: bool, names: tuple[str, ...]) -> None:
    """Copy (or link) skill folders into TARGET/<name>/. No NAMES: every skill."""
    root, skills, _ = _skills()
    chosen = [_lookup(name) for name in names] if names else list(skills.values())
    existing = [target / s.name for s in chosen if (target / s.name).exists() or (target / s.name).is_symlink()]
    if existing and not force:
        shown = ", ".join(str(p) for p in existing[:5]) + (" ..." if len(existing) > 5 else "")
        click.echo(f"error: already present: {shown}; use --force to replace", err=True)
        raise SystemExit(1)
    target.mkdir(parents=True, exist_ok=True)
    real_root = root.resolve()
    for skill in chosen:
        destination = target / skill.name
        if destination.is_symlink() or destination.is_file():
            destination.unlink()
        elif destination.exists():
            shutil.rmtree(destination)
        source = skill.path.parent
        if link:
            destination.symlink_to(source.resolve(), target_is_directory=True)
        else:
            shutil.copytree(source, destination, ignore=_outside_links(real_root))
    verb = "linked" if link else "copied"
    click.echo(f"{verb} {len(chosen)} skill(s) into {target}")


def _outside_links(real_root: Path):
    """copytree ignore function: never copy what a symlink outside the repository points at."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set()
        for name in names:
            path = Path(directory) / name
            if path.is_symlink() and not path.resolve().is_relative_to(real_root):
                skipped.add(name)
        return skipped

    return ignore
