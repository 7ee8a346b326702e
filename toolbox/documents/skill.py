"""The Agent Skills frontmatter, exactly as the specification allows, plus our keys under `metadata`."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
SEMVER_PATTERN = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
ISO_DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
DOMAINS = (
    "attention",
    "linear-attention",
    "moe",
    "quantization",
    "kv-cache",
    "sampling",
    "norms-and-activations",
    "serving",
    "measurement",
    "hardware",
    "method",
)
SKILL_STATUSES = ("draft", "stable", "deprecated")
CONTRACT_ID_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*/[a-z0-9]+(-[a-z0-9]+)*$"


class SkillMetadata(BaseModel):
    """Our keys, all strings, under the spec's free-form `metadata` map."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    version: str = Field(pattern=SEMVER_PATTERN, description="Semantic version of the skill document.")
    status: Literal["draft", "stable", "deprecated"]
    domain: Literal[DOMAINS]  # type: ignore[valid-type]
    contracts: str = Field(
        default="",
        description="Space-separated contract ids (`<domain>/<name>`) this skill specifies; empty for method, measurement and hardware skills.",
    )
    requires: str = Field(default="", description="Space-separated names of skills to read first.")
    applies_to: str = Field(alias="applies-to", description="Space-separated targets, e.g. `sm_90 sm_100`.")
    updated: str = Field(pattern=ISO_DATE_PATTERN, description="ISO date of the last change.")

    @field_validator("contracts")
    @classmethod
    def _contract_ids(cls, value: str) -> str:
        for item in value.split():
            if not re.match(CONTRACT_ID_PATTERN, item):
                raise ValueError(f"contract id {item!r} is not of the form <domain>/<name> in kebab-case")
        return value

    @field_validator("requires")
    @classmethod
    def _skill_names(cls, value: str) -> str:
        for item in value.split():
            if not re.match(NAME_PATTERN, item) or len(item) > 64:
                raise ValueError(f"required skill {item!r} is not a kebab-case skill name")
        return value

    def contract_ids(self) -> list[str]:
        return self.contracts.split()

    def required_skills(self) -> list[str]:
        return self.requires.split()


class SkillFrontmatter(BaseModel):
    """Top-level keys allowed by the Agent Skills specification, and no others."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    description: str = Field(min_length=1, max_length=1024)
    license: str | None = None
    compatibility: str | None = Field(default=None, max_length=500)
    metadata: SkillMetadata
    allowed_tools: str | None = Field(default=None, alias="allowed-tools")

    @field_validator("description")
    @classmethod
    def _no_angle_brackets(cls, value: str) -> str:
        if "<" in value or ">" in value:
            raise ValueError("description must not contain angle brackets (< or >)")
        return value
