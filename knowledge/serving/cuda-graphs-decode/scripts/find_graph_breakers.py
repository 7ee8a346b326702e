"""List calls in Python files that break CUDA-graph capture or freeze values (a static heuristic).

Flags, per function: host syncs (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`,
`torch.cuda.synchronize`), data-dependent shapes (`nonzero`, `unique`, `masked_select`,
one-argument `torch.where`), `torch.multinomial`, and device tensors built from Python data
(`torch.tensor(..., device=...)`; a CPU tensor then `.to(device, non_blocking=True)` is fine); lists `repeat_interleave` without `output_size` as "check:" (it syncs
only when `repeats` is a tensor) without failing. A call inside an `if` whose test calls `capturing(...)`
or `is_current_stream_capturing()` is reported as guarded (it runs only outside capture).
It cannot see boolean-mask indexing or Python branches on tensor values: review those by hand.

Run: python find_graph_breakers.py FILE_OR_DIR...   (exit 1 when unguarded findings exist)
     python find_graph_breakers.py --self-test
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SYNC_METHODS = {"item", "tolist", "cpu", "numpy"}
SHAPE_FUNCTIONS = {"nonzero", "unique", "unique_consecutive", "masked_select", "multinomial"}
GUARDS = {"capturing", "is_current_stream_capturing"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _reason(call: ast.Call) -> str | None:
    name = _name(call.func)
    owner = _name(call.func.value) if isinstance(call.func, ast.Attribute) else ""
    if name in SYNC_METHODS and isinstance(call.func, ast.Attribute) and not call.args:
        return f".{name}() copies to the host (sync)"
    if name == "synchronize":
        return "explicit synchronize"
    if name in SHAPE_FUNCTIONS:
        return f"{name}: data-dependent shape or host sync"
    if name == "repeat_interleave" and not any(k.arg == "output_size" for k in call.keywords):
        return "check: repeat_interleave syncs when `repeats` is a tensor (fine for an int; or pass output_size)"
    if name == "where" and owner == "torch" and len(call.args) == 1:
        return "torch.where(cond) is nonzero (data-dependent shape)"
    if name == "tensor" and owner == "torch":
        device = next((k.value for k in call.keywords if k.arg == "device"), None)
        if device is not None and not (isinstance(device, ast.Constant) and device.value == "cpu"):
            return "torch.tensor(..., device=...) from Python data (a blocking host-to-device copy)"
    return None


class Finder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path, self.function, self.guarded, self.findings = path, "<module>", 0, []

    def visit_FunctionDef(self, node):
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):
        guard = any(isinstance(n, ast.Call) and _name(n.func) in GUARDS for n in ast.walk(node.test))
        self.visit(node.test)
        self.guarded += guard
        for child in node.body:
            self.visit(child)
        self.guarded -= guard
        for child in node.orelse:
            self.visit(child)

    def visit_Call(self, node):
        reason = _reason(node)
        if reason:
            self.findings.append((self.path, node.lineno, self.function, reason, self.guarded > 0))
        self.generic_visit(node)


def scan(paths: list[str]) -> list[tuple]:
    findings = []
    for target in paths:
        files = sorted(Path(target).rglob("*.py")) if Path(target).is_dir() else [Path(target)]
        for file in files:
            finder = Finder(str(file))
            finder.visit(ast.parse(file.read_text(encoding="utf-8"), filename=str(file)))
            findings += finder.findings
    return findings


SAMPLE = '''
import torch
def step(x, ids, capturing):
    n = int(x.sum().item())
    rows = torch.nonzero(ids == 3)
    counts = torch.tensor([1, 2], device="cuda")  # flagged; torch.tensor([1, 2]) on the host is not
    staged = torch.tensor([3, 4]).to(x.device, non_blocking=True)
    if not capturing(x):
        assert (ids < 256).all().item()
    y = ids.repeat_interleave(ids)
    return x.argmax(-1), ids.repeat_interleave(2, output_size=8), y
'''


def self_test() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sample.py"
        path.write_text(SAMPLE)
        found = [(line, guarded) for _, line, _, _, guarded in scan([str(path)])]
    assert found == [(4, False), (5, False), (6, False), (9, True), (10, False)], found
    print("self-test: .item(), nonzero and torch.tensor(device=...) flagged; the guarded check reported as guarded; "
          "repeat_interleave without output_size listed for review; argmax and "
          "repeat_interleave(output_size=...) not flagged")


if __name__ == "__main__":
    if sys.argv[1:] in ([], ["--self-test"]):
        self_test()
        sys.exit(0)
    results = scan(sys.argv[1:])
    for path, line, function, reason, guarded in results:
        print(f"{path}:{line}: {function}: {reason}{' (guarded: outside capture only)' if guarded else ''}")
    sys.exit(1 if any(not guarded and not reason.startswith("check:") for _, _, _, reason, guarded in results) else 0)
