"""Turn pydantic validation errors into findings that name the field, the line and a fix."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from toolbox.findings import Finding
from toolbox.yaml_loader import YamlDocument, dotted

SPEC_TOP_LEVEL = ("name", "description", "license", "compatibility", "allowed-tools", "metadata")

# Model-level errors carry no location; these message fragments name the field they are about.
_ROOT_FIELDS = (
    ("needs `run`", "run"),
    ("at least one output", "outputs"),
    ("tolerance names", "tolerance"),
    ("aliases", "outputs"),
    ("case names repeat", "cases"),
)
_PATTERN_HINTS = {
    "version": 'a semantic version such as "1.0.0", quoted',
    "updated": 'an ISO date such as "2026-01-31", quoted (unquoted YAML turns it into a date)',
    "date": 'an ISO date such as "2026-01-31", quoted',
    "name": "kebab-case: lowercase letters and digits in words joined by single hyphens, e.g. `gated-attention`",
    "id": "`<domain>/<name>` in kebab-case, e.g. `attention/partial-rope`",
    "mutate": "a Python identifier naming a function in the sibling .py",
    "reference": "a Python identifier naming a function in the sibling .py",
    "make_inputs": "a Python identifier naming a function in the sibling .py",
    "run": "a Python identifier naming a function in the sibling .py",
}


def schema_findings(
    error: ValidationError, model: type[BaseModel], document: YamlDocument, display: str, kind: str
) -> list[Finding]:
    """One finding per pydantic error. `kind` is "skill" or "contract" (it shapes the hints)."""
    findings = []
    for item in error.errors(include_url=False):
        location = tuple(item["loc"])
        findings.append(_one(item, location, model, document, display, kind))
    return findings


def _one(item: dict[str, Any], location: tuple, model: type[BaseModel], document: YamlDocument, display: str,
         kind: str) -> Finding:
    error_type = item["type"]
    field = dotted(location) or "(document)"
    last = next((part for part in reversed(location) if isinstance(part, str)), "")
    given = item.get("input")
    message = str(item["msg"]).removeprefix("Value error, ")
    hint = ""
    if error_type == "missing":
        message = f"required field `{last}` is missing"
        parent = dotted(location[:-1])
        hint = f"add `{last}:` under `{parent}`" if parent else f"add `{last}:` at the top level"
        if kind == "skill" and location[:1] == ("metadata",):
            hint += ' (a string, e.g. version: "1.0.0")' if last == "version" else " (metadata values are strings)"
    elif error_type == "extra_forbidden":
        allowed = _allowed_keys(model, location[:-1])
        if kind == "skill" and len(location) == 1:
            message = f"unknown top-level key `{last}`; the Agent Skills spec allows only {', '.join(SPEC_TOP_LEVEL)}"
            hint = "put project keys under `metadata:` as strings, or remove the key"
        else:
            message = f"unknown key `{last}`"
            hint = f"allowed keys here: {', '.join(allowed)}" if allowed else "remove the key"
    elif error_type.endswith("_type") or error_type in ("string_type", "dict_type", "list_type"):
        message = f"{message}; got {_describe(given)}"
        if kind == "skill" and location[:1] == ("metadata",) and isinstance(given, list):
            message = f"metadata values must be strings (Agent Skills spec); got {_describe(given)}"
            hint = f'write one space-separated string: {last}: "{" ".join(map(str, given))}"'
        elif error_type == "string_type" and not isinstance(given, (dict, list)):
            hint = f'quote the value: {last}: "{given}"'
            if kind == "skill" and location[:1] == ("metadata",):
                message = f"metadata values must be strings (Agent Skills spec); got {_describe(given)}"
        else:
            hint = "see the schema in contracts/schema/ for the expected type"
    elif error_type == "string_pattern_mismatch":
        message = f"{_short(given)} does not have the required form"
        hint = _PATTERN_HINTS.get(last, f"it must match {item.get('ctx', {}).get('pattern', 'the pattern')}")
    elif error_type in ("string_too_long", "string_too_short", "too_short", "too_long"):
        message = f"{message} (it has {len(given) if hasattr(given, '__len__') else '?'})"
        hint = "shorten it" if "long" in error_type else "add content"
    elif error_type == "literal_error":
        message = f"{message}; got {_short(given)}"
        hint = "use one of the listed values"
    elif error_type == "value_error":
        hint = _value_error_hint(message)
        if not location:
            field = next((name for fragment, name in _ROOT_FIELDS if fragment in message), field)
            location = (field,) if field in model.model_fields else location
    else:
        message = f"{message}; got {_short(given)}" if given is not None and not isinstance(given, dict) else message
    if not hint:
        hint = f"see `{field}` in contracts/schema/{'skill-frontmatter' if kind == 'skill' else 'contract'}.schema.json"
    return Finding(display, document.line_of(location), field, "error", message, hint)


def _value_error_hint(message: str) -> str:
    if "angle brackets" in message:
        return "write the words out instead of < and > (agents' loaders may treat them as markup)"
    if "namespaced" in message:
        return "prefix the tag with its namespace, e.g. `stage:decode`"
    if "not an output" in message or "not an input" in message:
        return "check the spelling against `outputs:` / `inputs:`"
    if "interface custom" in message:
        return "add `run: <function>` naming the driver in the sibling .py"
    if "case names repeat" in message:
        return "give every case and error case its own name"
    return "see the field's description in contracts/schema/"


def _describe(value: Any) -> str:
    kind = type(value).__name__
    if isinstance(value, (dict, list)):
        return f"a {kind}"
    return f"{kind} {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed_keys(model: type[BaseModel], location: tuple) -> list[str]:
    """Keys the model accepts at `location` (best effort, for hints)."""
    annotation: Any = model
    for part in location:
        annotation = _unwrap(annotation)
        if isinstance(part, int):
            args = typing.get_args(annotation)
            annotation = args[0] if args else None
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            fields = {(info.alias or name): info for name, info in annotation.model_fields.items()}
            if part not in fields:
                return []
            annotation = fields[part].annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [info.alias or name for name, info in annotation.model_fields.items()]
    return []


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        candidates = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        models = [arg for arg in candidates if isinstance(arg, type) and issubclass(arg, BaseModel)]
        return models[0] if models else candidates[0]
    return annotation
