"""Small Markdown helpers for skill bodies: headings outside code fences, the changelog section."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Heading:
    level: int
    title: str
    index: int  # 0-based line index in the body


def headings(body: str) -> list[Heading]:
    result, fence = [], None
    for index, line in enumerate(body.split("\n")):
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            fence = None if fence == marker else (fence or marker)
            continue
        if fence is None:
            heading = _HEADING.match(line)
            if heading:
                result.append(Heading(len(heading.group(1)), heading.group(2), index))
    return result


def body_line_count(body: str) -> int:
    return len(body.rstrip("\n").split("\n")) if body.strip() else 0


def mentions_version(text: str, version: str) -> bool:
    """True when `version` appears as a whole token (1.2.0 does not match 1.2.0.1 or 11.2.0)."""
    pattern = r"(?<![\w.])v?" + re.escape(version) + r"(?![\w-]|\.\d)"
    return re.search(pattern, text) is not None


def version_entry_lines(section: str, version: str) -> list[int]:
    """0-based line indexes in `section` where an entry for `version` starts (a list item or heading)."""
    found = []
    for index, line in enumerate(section.split("\n")):
        stripped = line.strip()
        if stripped.startswith(("-", "*", "+", "#")) and mentions_version(stripped, version):
            found.append(index)
    return found
