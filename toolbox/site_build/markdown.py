"""Small Markdown writers: escaped table cells, tables, code fences, and the rewriting of relative links."""

from __future__ import annotations

import html
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence

_FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")
_LINK = re.compile(r"(!?\[[^\]\n]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def cell(value: object) -> str:
    """One table cell: no pipes or newlines, HTML-escaped; None and empty strings become an en dash."""
    if value is None or value == "":
        return "–"
    text = " ".join(str(value).split())
    return html.escape(text, quote=False).replace("|", "\\|")


def code_cell(value: object) -> str:
    if value is None or value == "":
        return "–"
    text = " ".join(str(value).split()).replace("|", "\\|")
    return f"<code>{html.escape(text, quote=False)}</code>"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; cells must already be escaped (use `cell` / `code_cell`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fence(text: str, language: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run inside `text`."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}\n"


def rewrite_links(markdown: str, resolve: Callable[[str], str | None]) -> str:
    """Apply `resolve(target) -> new target or None (keep)` to every relative link outside code fences and code spans."""
    out, fence_marker = [], None
    for line in markdown.splitlines(keepends=True):
        match = _FENCE_LINE.match(line)
        if fence_marker is None and match:
            fence_marker = match.group(1)[0] * 3
            out.append(line)
            continue
        if fence_marker is not None:
            if line.strip().startswith(fence_marker):
                fence_marker = None
            out.append(line)
            continue
        parts = re.split(r"(`+[^`]*`+)", line)  # keep inline code untouched
        for index, part in enumerate(parts):
            if index % 2 == 0:
                parts[index] = _LINK.sub(lambda m: _replace(m, resolve), part)
        out.append("".join(parts))
    return "".join(out)


def _replace(match: re.Match, resolve: Callable[[str], str | None]) -> str:
    target = match.group(2)
    if target.startswith(("#", "/")) or _SCHEME.match(target):
        return match.group(0)
    new = resolve(target)
    return match.group(0) if new is None else f"{match.group(1)}{new}{match.group(3)}"


def repo_relative(source_file: str, target: str) -> tuple[str, str]:
    """Resolve a link target written in repository file `source_file` to (repository path, #anchor or '')."""
    path, _, anchor = target.partition("#")
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(source_file), path)) if path else source_file
    return joined, (f"#{anchor}" if anchor else "")
