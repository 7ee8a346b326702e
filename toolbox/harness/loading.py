"""Finding and loading contracts: the YAML document (pydantic `Contract`) and its sibling executable `.py`."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import yaml
from pydantic import ValidationError

from toolbox.documents.contract import Contract
from toolbox.harness.statuses import ContractError, UsageError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONTRACTS_DIR = REPO_ROOT / "contracts"


@dataclass(frozen=True)
class LoadedContract:
    contract: Contract
    path: Path  # the .yaml
    module: ModuleType  # the sibling .py

    @property
    def id(self) -> str:
        return self.contract.id

    def function(self, name: str):
        """A function of the executable half; a ContractError naming the file when it is missing."""
        function = getattr(self.module, name, None)
        if not callable(function):
            raise ContractError(f"{self.path.with_suffix('.py')} has no function {name!r} (named by {self.id})")
        return function


_CACHE: dict[Path, LoadedContract] = {}


def contract_paths(contracts_dir: Path | None = None) -> list[Path]:
    """Every contract YAML under `contracts_dir` (default: the repository's `contracts/`), sorted."""
    root = Path(contracts_dir) if contracts_dir is not None else DEFAULT_CONTRACTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*/*.yaml") if p.is_file())


def resolve_contract_path(spec: str | Path, contracts_dir: Path | None = None) -> Path:
    """A contract given by path to its YAML, or by id `domain/name` looked up under `contracts_dir`."""
    candidate = Path(spec)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise UsageError(f"no contract file {spec}")
        return candidate.resolve()
    root = Path(contracts_dir) if contracts_dir is not None else DEFAULT_CONTRACTS_DIR
    path = root / f"{spec}.yaml"
    if str(spec).count("/") != 1 or not path.is_file():
        known = ", ".join(p.relative_to(root).with_suffix("").as_posix() for p in contract_paths(root)) or "none"
        raise UsageError(f"unknown contract {str(spec)!r} (looked for {path}); known contracts: {known}")
    return path.resolve()


def load_contract(spec: str | Path, contracts_dir: Path | None = None) -> LoadedContract:
    """Load (once per process) the contract document and import its executable half by file path."""
    path = resolve_contract_path(spec, contracts_dir)
    if path in _CACHE:
        return _CACHE[path]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        contract = Contract.model_validate(data)
    except (yaml.YAMLError, ValidationError) as error:
        raise ContractError(f"{path}: not a valid contract: {error}") from None
    code_path = path.with_suffix(".py")
    if not code_path.is_file():
        raise ContractError(f"{path}: the executable half {code_path.name} is missing")
    digest = hashlib.sha1(str(code_path).encode()).hexdigest()[:12]
    module_name = f"_toolbox_contract_{contract.id.replace('/', '__').replace('-', '_')}_{digest}"
    spec_ = importlib.util.spec_from_file_location(module_name, code_path)
    if spec_ is None or spec_.loader is None:
        raise ContractError(f"cannot import {code_path}")
    module = importlib.util.module_from_spec(spec_)
    sys.modules[module_name] = module
    try:
        spec_.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        raise ContractError(f"{code_path}: importing it raised {type(error).__name__}: {error}") from None
    loaded = LoadedContract(contract, path, module)
    _CACHE[path] = loaded
    return loaded


def import_function(target: str):
    """Import `package.module:function` (the function part may be dotted: `module:Class.method`)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"implementation {target!r} is not of the form package.module:function")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import {module_name!r} for {target!r}: {error}") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{module_name!r} has no attribute {attribute!r} (from {target!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{target!r} is not callable")
    return obj
