"""Small Markdown writers: escaped table cells, tables, code fences, and the rewriting of relative links."""

from __future__ import annotations

import html
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence

_FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")
_LINK = re.compile(r"(!?\[[^\]\n]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
_CODE_SPAN = re.compile(r"(`+[^`]*`+)")
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


def rewrite_links(markdown: str, resolve: Callable[[str], str | None],
                  code_link: Callable[[str], str | None] | None = None) -> str:
    """Apply `resolve(target) -> new target or None (keep)` to every relative link outside code fences and code spans.

    With `code_link(text) -> target or None`, an inline code span naming something that has a page
    (`gated-deltanet`, `attention/partial-rope`, `references/x.md`) becomes a link to it, except
    inside headings, inside link text and on indented lines (which may be indented code).
    """
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
        spans = [(m.start(), m.end()) for m in _CODE_SPAN.finditer(line)]  # links inside inline code stay text
        line = _LINK.sub(lambda m, spans=spans: m.group(0) if any(a <= m.start() < b for a, b in spans) else _replace(m, resolve), line)
        parts = _CODE_SPAN.split(line)
        for index, part in enumerate(parts):
            if index % 2 == 1 and code_link is not None and not line.lstrip().startswith("#") and not line.startswith(("    ", "\t")):
                inside_link = parts[index - 1].endswith("[") and parts[index + 1].startswith("](")
                target = None if inside_link else code_link(part.strip("`").strip())
                if target is not None:
                    parts[index] = f"[{part}]({target})"
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
