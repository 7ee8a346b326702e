"""The contract document (`contracts/<domain>/<name>.yaml`).

Field names follow the FlashInfer Trace definition where they fit (axes, inputs, outputs,
reference) so the two can be exchanged. Shapes, constraints and roofline terms are small
arithmetic expressions over axis names (see `toolbox.expressions`).

Calling conventions the harness relies on (the executable half, `<name>.py`, imports only the
standard library, torch and numpy):

* ``make_inputs(axes: dict[str, int], params: dict, dtype: torch.dtype, device: str,
  generator: torch.Generator) -> dict[str, torch.Tensor]``: fresh seeded random inputs, never zeros.
* ``reference(**inputs, **params) -> dict[str, torch.Tensor]``: every output, computed as
  plainly as possible (float64 where it helps).
* ``interface: dps`` (destination passing): an implementation is called as
  ``impl(**inputs, **outputs, **params)`` with every output preallocated and poisoned (NaN for
  floating outputs; integer outputs are run twice with two different fill patterns). An output
  with ``aliases: <input>`` is updated in place in that input instead.
* ``interface: custom``: the contract's ``run`` function drives the implementation:
  ``run(impl, axes, params, dtype, device, generator) -> dict`` with optional keys
  ``max_abs_error``, ``max_rel_error``, ``message``; it raises AssertionError when the
  implementation is wrong.
* ``invariants``: functions ``fn(inputs, outputs, params) -> None`` raising AssertionError.
* error cases: ``mutate(inputs, params) -> (inputs, params)`` makes a valid input invalid; the
  implementation must raise one of ``raises``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolbox.documents.skill import CONTRACT_ID_PATTERN, ISO_DATE_PATTERN, NAME_PATTERN, SEMVER_PATTERN

DTYPES = (
    "float64",
    "float32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
CASE_DTYPE = "$dtype"  # an input or output whose dtype is the case's dtype
PY_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
EXCEPTIONS = ("ValueError", "TypeError", "IndexError", "RuntimeError", "KeyError", "AssertionError", "MemoryError")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Axis(_Strict):
    """A named dimension: `value` for the Qwen3.6-35B-A3B constant (cases may override it at small sizes); no value for a variable."""

    value: int | None = Field(default=None, ge=1)
    description: str = Field(min_length=1)


class TensorSpec(_Strict):
    shape: list[str | int] = Field(description="Axis names, integers, or expressions over axis names such as `K // 2`.")
    dtype: str = Field(description=f"One of {', '.join(DTYPES)}, or `{CASE_DTYPE}` for the case's dtype.")
    description: str = ""

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value != CASE_DTYPE and value not in DTYPES:
            raise ValueError(f"unknown dtype {value!r}; expected one of {', '.join(DTYPES)} or {CASE_DTYPE}")
        return value


class OutputSpec(TensorSpec):
    aliases: str | None = Field(
        default=None, description="Name of an input updated in place; the harness reads that input after the call."
    )


class ParamSpec(_Strict):
    type: Literal["float", "int", "bool", "str"]
    default: Any = None
    min: float | None = None
    max: float | None = None
    choices: list[Any] | None = None
    description: str = Field(min_length=1)


class Tolerance(_Strict):
    """How one output is compared with the reference. Bounds may be one number or a map dtype -> number."""

    metric: Literal["rel_fro", "max_abs", "allclose", "exact"]
    bound: float | dict[str, float] | None = None
    atol: float | dict[str, float] | None = None
    rtol: float | dict[str, float] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _bounds_present(self) -> "Tolerance":
        if self.metric in ("rel_fro", "max_abs") and self.bound is None:
            raise ValueError(f"metric {self.metric} needs `bound`")
        if self.metric == "allclose" and (self.atol is None or self.rtol is None):
            raise ValueError("metric allclose needs `atol` and `rtol`")
        return self


class Case(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    seed: int = Field(ge=0)
    axes: dict[str, int] = Field(default_factory=dict)
    dtype: str = "float32"
    device: Literal["cpu", "cuda"] = "cpu"
    params: dict[str, Any] = Field(default_factory=dict)
    description: str = ""

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {value!r}; expected one of {', '.join(DTYPES)}")
        return value


class ErrorCase(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    description: str = Field(min_length=1)
    seed: int = Field(default=0, ge=0)
    axes: dict[str, int] = Field(default_factory=dict)
    dtype: str = "float32"
    params: dict[str, Any] = Field(default_factory=dict)
    mutate: str = Field(pattern=PY_IDENTIFIER, description="Function in the sibling .py: (inputs, params) -> (inputs, params).")
    raises: list[Literal[EXCEPTIONS]] = Field(default_factory=lambda: ["ValueError"])  # type: ignore[valid-type]


class Benchmark(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    axes: dict[str, int] = Field(default_factory=dict)
    dtype: str = "bfloat16"
    params: dict[str, Any] = Field(default_factory=dict)
    description: str = ""


class Roofline(_Strict):
    bytes: str = Field(description="Fewest bytes moved through device memory, an expression over axes and `itemsize`.")
    flops: str = Field(description="Arithmetic operations, an expression over axes.")
    notes: str = ""


class ChangelogEntry(_Strict):
    version: str = Field(pattern=SEMVER_PATTERN)
    date: str = Field(pattern=ISO_DATE_PATTERN)
    changes: str = Field(min_length=1)


class Contract(_Strict):
    id: str = Field(pattern=CONTRACT_ID_PATTERN)
    version: str = Field(pattern=SEMVER_PATTERN)
    title: str = Field(min_length=1, max_length=120)
    status: Literal["draft", "stable", "deprecated"]
    skills: list[str] = Field(min_length=1)
    tags: list[str] = Field(default_factory=list)
    summary: str = Field(min_length=1)
    interface: Literal["dps", "custom"] = "dps"
    signature: str = Field(default="", description="The call an implementation must accept, for people.")
    axes: dict[str, Axis] = Field(default_factory=dict)
    inputs: dict[str, TensorSpec] = Field(default_factory=dict)
    outputs: dict[str, OutputSpec] = Field(default_factory=dict)
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    constraints: list[str] = Field(default_factory=list)
    reference: str = Field(default="reference", pattern=PY_IDENTIFIER)
    make_inputs: str = Field(default="make_inputs", pattern=PY_IDENTIFIER)
    run: str | None = Field(default=None, pattern=PY_IDENTIFIER, description="Driver for interface: custom.")
    tolerance: dict[str, Tolerance] = Field(default_factory=dict)
    invariants: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=120.0, gt=0)
    cases: list[Case] = Field(min_length=1)
    errors: list[ErrorCase] = Field(default_factory=list)
    benchmarks: list[Benchmark] = Field(default_factory=list)
    roofline: Roofline | None = None
    changelog: list[ChangelogEntry] = Field(min_length=1)

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, value: list[str]) -> list[str]:
        import re

        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"skill name {name!r} is not kebab-case")
        return value

    @field_validator("tags")
    @classmethod
    def _namespaced_tags(cls, value: list[str]) -> list[str]:
        for tag in value:
            if ":" not in tag:
                raise ValueError(f"tag {tag!r} is not namespaced (e.g. `model:qwen3.6-35b-a3b`, `stage:decode`, `quant:nvfp4`)")
        return value

    @field_validator("invariants")
    @classmethod
    def _identifiers(cls, value: list[str]) -> list[str]:
        import re

        for name in value:
            if not re.match(PY_IDENTIFIER, name):
                raise ValueError(f"invariant {name!r} is not a Python identifier")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Contract":
        if self.interface == "custom" and not self.run:
            raise ValueError("interface custom needs `run` (the driver function in the sibling .py)")
        if self.interface == "dps" and not self.outputs:
            raise ValueError("interface dps needs at least one output")
        for name in self.tolerance:
            if name not in self.outputs:
                raise ValueError(f"tolerance names {name!r}, which is not an output")
        for name, spec in self.outputs.items():
            if spec.aliases is not None and spec.aliases not in self.inputs:
                raise ValueError(f"output {name!r} aliases {spec.aliases!r}, which is not an input")
        names = [case.name for case in self.cases] + [error.name for error in self.errors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"case names repeat: {', '.join(duplicates)}")
        return self

    @property
    def domain(self) -> str:
        return self.id.split("/", 1)[0]

    @property
    def major(self) -> int:
        return int(self.version.split(".", 1)[0])
