"""Triton kernels read no plain Python globals (a CPU check of what only a GPU compile would refuse).

Compiled kernels may read module globals only when they are `tl.constexpr` (or functions, modules, Triton types);
a plain `MIN_KEY = -(2**63)` used inside a `@triton.jit` function works under `TRITON_INTERPRET=1` and fails at the
first compile on the GPU (`NameError: Cannot access global variable ...`; run74, `kernels/sampling_select.py`). Here
every jitted function of `reference_engine.kernels` is scanned for names it loads that resolve to a module-level int,
float, bool or str; a deliberately wrong kernel shows the scan catches one.
"""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

triton = pytest.importorskip("triton")

import reference_engine.kernels as kernels_package  # noqa: E402

PLAIN = (int, float, bool, str)


def _jitted(module: types.ModuleType):
    for name, value in vars(module).items():
        fn = getattr(value, "fn", None)
        if isinstance(value, triton.runtime.jit.JITFunction) and isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__:
            yield name, fn


def _names(code: types.CodeType):
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def plain_globals(fn: types.FunctionType) -> list[str]:
    """Names `fn` loads that are plain Python values among its module's globals (and not its own locals)."""
    found = []
    for name in sorted(set(_names(fn.__code__))):
        value = fn.__globals__.get(name, None)
        if name in fn.__globals__ and isinstance(value, PLAIN):
            found.append(name)
    return found


def _modules():
    for info in pkgutil.iter_modules(kernels_package.__path__):
        yield importlib.import_module(f"{kernels_package.__name__}.{info.name}")


def test_no_kernel_reads_a_plain_global():
    offenders = []
    for module in _modules():
        for name, fn in _jitted(module):
            offenders += [f"{module.__name__}.{name}: {g}" for g in plain_globals(fn)]
    assert not offenders, "jitted functions read plain globals (make them tl.constexpr): " + ", ".join(offenders)


LIMIT = -(2**63)


def _wrong(x):
    return x + LIMIT  # a plain global read inside a kernel body


def test_the_scan_catches_a_plain_global():
    assert plain_globals(_wrong) == ["LIMIT"]
    assert plain_globals(lambda x: x + 1) == []
