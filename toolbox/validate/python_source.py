"""Read a contract's executable half with `ast` (never importing it): top-level names and imports."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from toolbox.findings import Finding
from toolbox.yaml_loader import read_document_text

ALLOWED_IMPORT_ROOTS = frozenset(sys.stdlib_module_names) | {"torch", "numpy", "__future__"}


@dataclass(frozen=True)
class PythonModuleInfo:
    functions: dict[str, int]  # top-level def name -> line
    other_names: dict[str, int]  # top-level assignments (name = ...), imported names -> line


def read_module(path: Path, display: str, root: Path) -> tuple[PythonModuleInfo | None, list[Finding]]:
    text, findings = read_document_text(path, display, root)
    if text is None:
        return None, findings
    try:
        tree = ast.parse(text, filename=display)
    except SyntaxError as error:
        return None, [Finding(display, error.lineno, "", "error", f"Python syntax error: {error.msg}",
                              "fix the syntax; the harness imports this file")]
    functions: dict[str, int] = {}
    others: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    others.setdefault(target.id, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                others.setdefault((alias.asname or alias.name).split(".")[0], node.lineno)
    return PythonModuleInfo(functions, others), import_findings(tree, display)


def import_findings(tree: ast.Module, display: str) -> list[Finding]:
    """A contract's executable half may import only the standard library, torch and numpy."""
    findings = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = ["." * node.level + (node.module or "")] if node.level else [node.module or ""]
        for module in modules:
            if module.split(".")[0] not in ALLOWED_IMPORT_ROOTS:
                findings.append(Finding(display, node.lineno, "imports", "error",
                                        f"imports `{module}`; a contract's executable half may import only the "
                                        "standard library, torch and numpy",
                                        "inline what you need (an oracle must not inherit an engine or toolbox bug)"))
    return findings
