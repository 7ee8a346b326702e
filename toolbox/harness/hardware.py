"""Hardware profiles (`toolbox/data/hardware.yaml`): memory bandwidth and peak FLOP/s, each with its source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from toolbox.harness.statuses import UsageError

HARDWARE_YAML = Path(__file__).resolve().parents[1] / "data" / "hardware.yaml"


@dataclass(frozen=True)
class Ceiling:
    value: float
    source: str


@dataclass(frozen=True)
class HardwareProfile:
    key: str
    name: str
    memory_bandwidth: Ceiling  # B/s
    peak_flops: dict[str, Ceiling]  # dtype name (or "default") -> FLOP/s
    datasheet: dict[str, Ceiling]

    def peak_for(self, dtype: str) -> Ceiling:
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if "default" in self.peak_flops:
            return self.peak_flops["default"]
        raise UsageError(f"profile {self.key} has no peak FLOP/s for {dtype} and no default")


def _ceiling(data: dict, where: str) -> Ceiling:
    if not isinstance(data, dict) or "value" not in data or not str(data.get("source", "")).strip():
        raise ValueError(f"{where}: needs `value` and a non-empty `source`")
    value = float(data["value"])
    if value <= 0:
        raise ValueError(f"{where}: value must be positive")
    return Ceiling(value, str(data["source"]))


def load_profiles(path: Path = HARDWARE_YAML) -> dict[str, HardwareProfile]:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    profiles = {}
    for key, body in data["profiles"].items():
        profiles[key] = HardwareProfile(
            key=key,
            name=str(body["name"]),
            memory_bandwidth=_ceiling(body["memory_bandwidth"], f"{key}.memory_bandwidth"),
            peak_flops={k: _ceiling(v, f"{key}.peak_flops.{k}") for k, v in body["peak_flops"].items()},
            datasheet={k: _ceiling(v, f"{key}.datasheet.{k}") for k, v in body.get("datasheet", {}).items()},
        )
    return profiles


def profile(key: str) -> HardwareProfile:
    profiles = load_profiles()
    if key not in profiles:
        raise UsageError(f"unknown hardware profile {key!r}; known: {', '.join(sorted(profiles))}")
    return profiles[key]
