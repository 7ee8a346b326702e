"""Checks of one skill beyond its schema: Agent Skills rules, folder placement, body length, changelog."""

from __future__ import annotations

import re

from toolbox.findings import Finding
from toolbox.knowledge_base import SkillDocument
from toolbox.validate.markdown import body_line_count, headings, version_entry_lines

MAX_BODY_LINES = 500
# A path into the skill folder mentioned in the body: `references/x.md`, [text](scripts/y.py), assets/z.png.
_BUNDLED_FILE = re.compile(r"(?<![\w/.-])((?:references|scripts|assets)/[\w./-]*\w\.\w+)")
# Domains whose skills describe operations; such a skill without a contract is unverifiable.
OPERATION_DOMAINS = ("attention", "linear-attention", "moe", "quantization", "kv-cache", "sampling", "norms-and-activations")


def check_skill(skill: SkillDocument) -> list[Finding]:
    """Findings for one skill whose frontmatter passed the schema (others only carry their load findings)."""
    if skill.frontmatter is None or skill.yaml is None:
        return list(skill.findings)
    findings = list(skill.findings)
    frontmatter, display, lines = skill.frontmatter, skill.display, skill.yaml
    if frontmatter.name != skill.folder:
        findings.append(Finding(display, lines.line_of(("name",)), "name", "error",
                                f"name `{frontmatter.name}` differs from its folder `{skill.folder}`",
                                f"rename the folder to `{frontmatter.name}` or set `name: {skill.folder}`"))
    domain = frontmatter.metadata.domain
    if domain != skill.domain_folder:
        findings.append(Finding(display, lines.line_of(("metadata", "domain")), "metadata.domain", "error",
                                f"domain `{domain}` differs from the folder `knowledge/{skill.domain_folder}/`",
                                f"move the skill to knowledge/{domain}/ or set `domain: {skill.domain_folder}`"))
    if domain in OPERATION_DOMAINS and not frontmatter.metadata.contract_ids():
        findings.append(Finding(display, lines.line_of(("metadata",)), "metadata.contracts", "warning",
                                f"a `{domain}` skill names no contract, so no implementation can be checked against it",
                                "create one with `toolbox new contract DOMAIN/NAME --skill " + frontmatter.name + "`"))
    findings += _body_findings(skill)
    findings += _bundled_file_findings(skill)
    if not any(f.is_error for f in findings):
        findings += skills_ref_findings(skill)
    return findings


def _body_findings(skill: SkillDocument) -> list[Finding]:
    assert skill.frontmatter is not None
    display, body, version = skill.display, skill.body, skill.frontmatter.metadata.version
    findings = []
    count = body_line_count(body)
    if count > MAX_BODY_LINES:
        findings.append(Finding(display, skill.body_line + MAX_BODY_LINES, "body", "warning",
                                f"body has {count} lines, over {MAX_BODY_LINES}",
                                "move depth into references/*.md and link to it from the body"))
    last_line = skill.body_line + max(count - 1, 0)
    sections = [h for h in headings(body) if h.level <= 2]
    changelog = [h for h in sections if h.level == 2 and h.title.strip().lower() == "changelog"]
    if not changelog:
        findings.append(Finding(display, last_line, "changelog", "error", "body does not end with a `## Changelog` section",
                                f"add `## Changelog` at the end with `- {version} (YYYY-MM-DD): what changed`"))
        return findings
    heading = changelog[-1]
    after = [h for h in sections if h.index > heading.index]
    if after:
        findings.append(Finding(display, skill.body_line + after[0].index, "changelog", "error",
                                f"`## Changelog` must be the last section; `{'#' * after[0].level} {after[0].title}` follows it",
                                "move the changelog to the end of the body"))
    section = "\n".join(body.split("\n")[heading.index + 1 :])
    if not version_entry_lines(section, version):
        findings.append(Finding(display, skill.body_line + heading.index, "changelog", "error",
                                f"`## Changelog` has no entry for the current version {version}",
                                f"add a line `- {version} (YYYY-MM-DD): what changed` under `## Changelog`"))
    return findings


def _bundled_file_findings(skill: SkillDocument) -> list[Finding]:
    """Every `references/...`, `scripts/...` or `assets/...` path the body mentions exists in the skill folder."""
    findings, reported = [], set()
    folder = skill.path.parent
    for index, line in enumerate(skill.body.split("\n")):
        for match in _BUNDLED_FILE.finditer(line):
            relative = match.group(1)
            target = folder / relative
            if relative in reported or (target.is_file() and target.resolve().is_relative_to(folder.resolve())):
                continue
            reported.add(relative)
            findings.append(Finding(skill.display, skill.body_line + index, "body", "error",
                                    f"mentions `{relative}`, which is not a file in the skill folder",
                                    f"add {skill.path.parent.name}/{relative} or fix the path"))
    return findings


def skills_ref_findings(skill: SkillDocument) -> list[Finding]:
    """What the public `skills-ref validate` says (when the package is installed): it must accept every skill."""
    try:
        from skills_ref import validate as skills_ref_validate
    except ImportError:  # a test dependency; the CI and the test suite have it
        return []
    try:
        messages = skills_ref_validate(skill.path.parent)
    except Exception as error:  # noqa: BLE001 - a third-party validator must not crash ours
        messages = [f"skills-ref crashed: {type(error).__name__}: {error}"]
    return [
        Finding(skill.display, 1, "frontmatter", "error", f"skills-ref validate: {' '.join(str(message).split())}",
                "the public validator parses frontmatter with strictyaml: avoid flow style ([a, b], {k: v}) "
                "and `---` inside values")
        for message in messages
    ]
