"""Checks of one contract beyond its schema: id and path, its .py, axis names, cases, changelog."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from toolbox.documents.contract import Contract
from toolbox.expressions import ExpressionError, evaluate, names_in
from toolbox.findings import Finding
from toolbox.knowledge_base import ContractDocument, display_path
from toolbox.validate.python_source import read_module


def check_contract(document: ContractDocument, root: Path, path_owners: dict[str, str] | None = None) -> list[Finding]:
    """`path_owners`: contract id -> the file whose path gives that id (to name a duplicate id)."""
    findings = list(document.findings)
    contract, lines = document.contract, document.yaml
    if contract is None or lines is None:
        return findings
    display = document.display

    def add(path: tuple, field: str, message: str, hint: str, severity: str = "error") -> None:
        findings.append(Finding(display, lines.line_of(path), field, severity, message, hint))  # type: ignore[arg-type]

    if contract.id != document.path_id:
        owner = (path_owners or {}).get(contract.id)
        also = f"; `{contract.id}` is already the id of {owner}" if owner and owner != display else ""
        add(("id",), "id", f"id `{contract.id}` does not match its path, which gives `{document.path_id}`{also}",
            f"set `id: {document.path_id}`" + ("" if also else f" or move the file to contracts/{contract.id}.yaml"))
    if not any(entry.version == contract.version for entry in contract.changelog):
        add(("changelog",), "changelog", f"changelog has no entry for the current version {contract.version}",
            f"add `- {{version: \"{contract.version}\", date: \"YYYY-MM-DD\", changes: \"...\"}}` to changelog")
    findings += _function_findings(document, contract, root, add)
    _axis_findings(contract, add)
    return findings


def _function_findings(document: ContractDocument, contract: Contract, root: Path, add) -> list[Finding]:
    python_path = document.python_path
    python_display = display_path(python_path, root)
    if not python_path.exists() and not python_path.is_symlink():
        add(("reference",), "reference", f"the executable half {python_display} does not exist",
            "create it with make_inputs and reference (see `toolbox new contract`)")
        return []
    module, findings = read_module(python_path, python_display, root)
    if module is None:
        return findings
    # A dps contract needs reference and make_inputs; a custom one its `run`, make_inputs when it has
    # error cases (the harness makes their inputs), and whatever else it names explicitly.
    custom = contract.interface == "custom"
    named = contract.model_fields_set
    wanted: list[tuple[tuple, str, str]] = []
    if not custom or "reference" in named:
        wanted.append((("reference",), "reference", contract.reference))
    if not custom or "make_inputs" in named or contract.errors:
        wanted.append((("make_inputs",), "make_inputs", contract.make_inputs))
    if contract.run:
        wanted.append((("run",), "run", contract.run))
    wanted += [(("invariants", i), f"invariants[{i}]", name) for i, name in enumerate(contract.invariants)]
    wanted += [(("errors", i, "mutate"), f"errors[{i}].mutate", e.mutate) for i, e in enumerate(contract.errors)]
    for path, field, name in wanted:
        if name in module.functions:
            continue
        if name in module.other_names:
            continue  # bound at module level (an alias or an import); fine without executing anything
        close = difflib.get_close_matches(name, list(module.functions), n=1)
        hint = f"did you mean `{close[0]}`?" if close else f"define `def {name}(...)` at module level in {python_display}"
        add(path, field, f"function `{name}` is not defined in {python_display}", hint)
    return findings


def _axis_findings(contract: Contract, add) -> None:
    axes = set(contract.axes)
    params = set(contract.params)

    def check_names(expression: str | int, known: set[str], path: tuple, field: str, what: str) -> None:
        if isinstance(expression, int):
            return
        try:
            names = names_in(str(expression))
        except ExpressionError as error:
            add(path, field, f"bad expression: {error}", "use + - * / // % ** min max ceil_div over axis names")
            return
        unknown = sorted(names - known)
        if unknown and set(unknown) <= params:
            add(path, field, f"{what} `{expression}` names param {_join(unknown)}; it is evaluated with axis values only",
                "make it an axis (cases can set axes), or check the param inside the implementation's error cases")
        elif unknown:
            add(path, field, f"{what} `{expression}` names unknown axis {_join(unknown)}",
                f"declare it under `axes:` or use one of: {', '.join(sorted(axes)) or '(none declared)'}")

    for group in ("inputs", "outputs"):
        for name, spec in getattr(contract, group).items():
            for index, entry in enumerate(spec.shape):
                check_names(entry, axes, (group, name, "shape", index), f"{group}.{name}.shape", "shape entry")
    for index, constraint in enumerate(contract.constraints):
        check_names(constraint, axes, ("constraints", index), f"constraints[{index}]", "constraint")
    if contract.roofline is not None:
        for term in ("bytes", "flops"):
            check_names(getattr(contract.roofline, term), axes | params | {"itemsize"}, ("roofline", term),
                        f"roofline.{term}", "roofline term")
    variable = sorted(name for name, axis in contract.axes.items() if axis.value is None)
    groups: list[tuple[str, Iterable, bool]] = [
        ("cases", contract.cases, True), ("benchmarks", contract.benchmarks, True), ("errors", contract.errors, True)
    ]
    for group, items, need_all in groups:
        for index, item in enumerate(items):
            where = f"{group}[{index}]"
            unknown = sorted(set(item.axes) - axes)
            if unknown:
                add((group, index, "axes", unknown[0]), f"{where}.axes", f"{group[:-1]} `{item.name}` sets unknown axis "
                    f"{_join(unknown)}", f"axes declared: {', '.join(sorted(axes)) or '(none)'}")
            missing = [name for name in variable if name not in item.axes]
            if need_all and missing:
                add((group, index, "axes"), f"{where}.axes", f"{group[:-1]} `{item.name}` gives no value for variable "
                    f"axis {_join(missing)}", "every axis without a `value` needs one in each case and benchmark")
            unknown_params = sorted(set(item.params) - params)
            if unknown_params:
                add((group, index, "params"), f"{where}.params", f"{group[:-1]} `{item.name}` sets unknown param "
                    f"{_join(unknown_params)}", f"params declared: {', '.join(sorted(params)) or '(none)'}")
            unset = [name for name, spec in contract.params.items() if spec.default is None and name not in item.params]
            if unset:
                add((group, index), f"{where}.params", f"{group[:-1]} `{item.name}` gives no value for param "
                    f"{_join(unset)}, which has no default", "set it in the case's `params` or give it a `default`")
            if need_all and not unknown and not missing:
                _constraint_findings(contract, item, group, index, add)


def _constraint_findings(contract: Contract, item, group: str, index: int, add) -> None:
    env: dict[str, int | float] = {name: axis.value for name, axis in contract.axes.items() if axis.value is not None}
    env.update(item.axes)
    for constraint in contract.constraints:
        try:
            holds = evaluate(constraint, env)
        except ExpressionError:
            continue  # unknown names are reported above
        if not holds:
            used = {name: env[name] for name in sorted(names_in(constraint)) if name in env}
            shown = ", ".join(f"{k}={v}" for k, v in used.items())
            add((group, index), f"{group}[{index}]", f"{group[:-1]} `{item.name}` violates constraint `{constraint}` "
                f"({shown})", "change the case's axis values so every constraint holds")


def _join(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)
