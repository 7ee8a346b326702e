"""A kernel module rebuilt from its source with one deliberate edit (the interpreter scripts' known-wrong variants)."""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import tempfile


def wrong_module(kernel_module, name: str, old: str, new: str):
    """`kernel_module` loaded again from its source with `old` (which must occur exactly once) replaced by `new`."""
    source = inspect.getsource(kernel_module)
    assert source.count(old) == 1, (name, old)
    path = pathlib.Path(tempfile.mkdtemp()) / f"wrong_{name}.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location(f"wrong_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
