"""Safe, strict loading of our YAML documents (contract files and SKILL.md frontmatter).

What it guarantees: no Python objects are ever constructed (safe tags only); every problem comes
back as a `Finding` (never an exception); keys keep their line numbers so later checks can point
at the right line. It refuses what PyYAML would silently accept or choke on:

* files over `MAX_BYTES`, empty files, bytes that are not UTF-8, a byte-order mark;
* tabs in indentation (reported with their line, before PyYAML gives a confusing error);
* duplicate keys in a mapping (PyYAML keeps the last one silently), merge keys (`<<`);
* more than `MAX_ALIASES` aliases (an alias bomb is refused while composing, before any
  expansion), more than `MAX_NODES` nodes after expansion, nesting deeper than `MAX_DEPTH`;
* a SKILL.md whose frontmatter does not start on line 1 with `---` or is not closed by `---`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from toolbox.findings import Finding

MAX_BYTES = 1024 * 1024
MAX_ALIASES = 8
MAX_NODES = 50_000
MAX_DEPTH = 50
KeyPath = tuple[Any, ...]
_LEADING_TAB = re.compile(r"^ *\t")
_PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map")


@dataclass(frozen=True)
class YamlDocument:
    """Parsed data plus the 1-based line of every key and sequence item, by key path."""

    data: Any
    lines: Mapping[KeyPath, int] = field(default_factory=dict)

    def line_of(self, path: KeyPath) -> int | None:
        """Line of `path`, or of its longest known prefix (a missing key points at its parent)."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


@dataclass(frozen=True)
class FrontmatterDocument:
    frontmatter: YamlDocument | None
    body: str
    body_line: int  # line number of the first body line in the file


class _Refused(Exception):
    def __init__(self, line: int | None, field: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.line, self.field, self.message, self.hint = line, field, message, hint


class _BudgetLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases while composing, so expansion never happens past the budget."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.alias_count = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.alias_count += 1
            if self.alias_count > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise _Refused(
                    mark.line + 1,
                    "",
                    f"more than {MAX_ALIASES} YAML aliases (*name); refused to expand them",
                    "write the values out; anchors and aliases are not needed in these documents",
                )
        return super().compose_node(parent, index)


def read_document_text(path: Path, display: str, root: Path | None = None) -> tuple[str | None, list[Finding]]:
    """Read a file as UTF-8 text after the checks that must come before parsing."""

    def refuse(message: str, hint: str, line: int | None = None) -> tuple[None, list[Finding]]:
        return None, [Finding(display, line, "", "error", message, hint)]

    try:
        if root is not None and path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(root.resolve()):
                return refuse(
                    f"symlink points outside the repository (to {target}); not read",
                    "replace the link by the file itself, or point it inside the repository",
                )
        if not path.is_file():
            return refuse("not a regular file", "give the path of a SKILL.md or a contract .yaml")
        size = path.stat().st_size
        if size > MAX_BYTES:
            return refuse(
                f"file is {size:,} bytes, over the {MAX_BYTES:,}-byte limit; not parsed",
                "move depth into references/ files; documents stay small",
            )
        raw = path.read_bytes()[: MAX_BYTES + 1]
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop
        return refuse(f"cannot read the file: {getattr(error, 'strerror', None) or error}",
                      "check that it exists, is readable and is not a symlink loop")
    if not raw.strip():
        return refuse("file is empty", "fill it from the template: `toolbox new skill` or `toolbox new contract`", 1)
    if raw.startswith(b"\xef\xbb\xbf"):
        return refuse("file starts with a UTF-8 byte-order mark", "save it as UTF-8 without a BOM", 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        return refuse(
            f"bytes that are not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start})",
            "save the file as UTF-8",
            line,
        )
    return text, []


def parse_yaml(text: str, display: str, first_line: int = 1) -> tuple[YamlDocument | None, list[Finding]]:
    """Parse one YAML document; `first_line` is the file line where `text` starts."""
    offset = first_line - 1
    for number, line in enumerate(text.splitlines(), start=first_line):
        if _LEADING_TAB.match(line):
            return None, [
                Finding(display, number, "", "error", "tab character in indentation", "indent YAML with spaces only")
            ]
    try:
        loader = _BudgetLoader(text)  # the reader rejects non-printable characters here
    except yaml.reader.ReaderError as error:
        line = text[: error.position].count("\n") + first_line
        code = error.character if isinstance(error.character, int) else ord(error.character)
        return None, [Finding(display, line, "", "error", f"control character #x{code:04x} is not allowed in YAML",
                              "remove control characters from the file")]
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None, [Finding(display, first_line, "", "error", "document is empty (no YAML content)",
                                      "fill it from the template")]
            lines: dict[KeyPath, int] = {(): node.start_mark.line + 1 + offset}
            builder = _Builder(loader, lines, offset)
            data = builder.build(node, (), 0)
        finally:
            loader.dispose()
    except _Refused as refused:
        line = refused.line + offset if refused.line is not None else None
        return None, [Finding(display, line, refused.field, "error", refused.message, refused.hint)]
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 + offset if mark is not None else None
        problem = " ".join(str(part) for part in (error.context, error.problem) if part)
        return None, [Finding(display, line, "", "error", f"invalid YAML: {problem}",
                              "check indentation, quoting and colons near this line")]
    except yaml.YAMLError as error:
        return None, [Finding(display, first_line, "", "error", f"invalid YAML: {error}", "check the syntax")]
    except RecursionError:
        return None, [Finding(display, first_line, "", "error", "YAML nested too deeply", "flatten the document")]
    if builder.duplicates:
        return None, builder.duplicates_as_findings(display)
    return YamlDocument(data, lines), []


def split_frontmatter(text: str, display: str) -> tuple[str, str, int] | Finding:
    """Split a SKILL.md into (frontmatter text, body, body's first line) or a finding."""
    lines = text.split("\n")
    if lines[0].rstrip("\r") != "---":
        return Finding(display, 1, "frontmatter", "error", "SKILL.md must start with a line `---` opening the YAML frontmatter",
                       "put `---`, the frontmatter keys, then `---` at the top of the file")
    for index in range(1, len(lines)):
        if lines[index].rstrip("\r").rstrip() == "---":
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1 :]), index + 2
    return Finding(display, 1, "frontmatter", "error", "frontmatter is not closed: no line `---` after the opening one",
                   "add a line `---` after the last frontmatter key")


def load_yaml_file(path: Path, display: str, root: Path | None = None) -> tuple[YamlDocument | None, list[Finding]]:
    text, findings = read_document_text(path, display, root)
    if text is None:
        return None, findings
    return parse_yaml(text, display)


def load_frontmatter_file(path: Path, display: str, root: Path | None = None) -> tuple[FrontmatterDocument | None, list[Finding]]:
    text, findings = read_document_text(path, display, root)
    if text is None:
        return None, findings
    split = split_frontmatter(text, display)
    if isinstance(split, Finding):
        return None, [split]
    frontmatter_text, body, body_line = split
    if not frontmatter_text.strip():
        return None, [Finding(display, 2, "frontmatter", "error", "frontmatter is empty", "add name, description and metadata")]
    document, findings = parse_yaml(frontmatter_text, display, first_line=2)
    return FrontmatterDocument(document, body, body_line), findings


class _Builder:
    """Turns composed nodes into plain data, recording lines, duplicates and the size budget."""

    def __init__(self, loader: _BudgetLoader, lines: dict[KeyPath, int], offset: int) -> None:
        self.loader, self.lines, self.offset = loader, lines, offset
        self.nodes = 0
        self.duplicates: list[tuple[int, KeyPath, Any, int]] = []

    def build(self, node: yaml.Node, path: KeyPath, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            limit = f"more than {MAX_NODES} values" if self.nodes > MAX_NODES else f"nesting deeper than {MAX_DEPTH}"
            raise _Refused(node.start_mark.line + 1, "", f"document too large: {limit}", "keep documents small")
        if isinstance(node, yaml.ScalarNode):
            return self.loader.construct_object(node)
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)) and node.tag not in _PLAIN_COLLECTION_TAGS:
            raise _Refused(node.start_mark.line + 1, "", f"YAML tag {node.tag!r} is not allowed",
                           "remove the tag; these documents hold plain maps, lists and scalars")
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                self.lines.setdefault(path + (index,), item.start_mark.line + 1 + self.offset)
                items.append(self.build(item, path + (index,), depth + 1))
            return items
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        raise _Refused(node.start_mark.line + 1, "", f"unsupported YAML node {type(node).__name__}")

    def _mapping(self, node: yaml.MappingNode, path: KeyPath, depth: int) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1 + self.offset
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(line - self.offset, "", "mapping key is not a plain value", "use a plain string key")
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(line - self.offset, "", "merge keys (`<<`) are not allowed", "write the keys out")
            key = self.loader.construct_object(key_node)
            if key in first_line:
                self.duplicates.append((line, path, key, first_line[key]))
                continue
            first_line[key] = line
            self.lines[path + (key,)] = line
            result[key] = self.build(value_node, path + (key,), depth + 1)
        return result

    def duplicates_as_findings(self, display: str) -> list[Finding]:
        return [
            Finding(display, line, dotted(path + (key,)), "error", f"duplicate key {key!r} (first defined at line {first})",
                    "keep one of them; YAML would silently use the last")
            for line, path, key, first in self.duplicates
        ]


def dotted(path: KeyPath) -> str:
    """('cases', 0, 'axes') -> 'cases[0].axes'."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
