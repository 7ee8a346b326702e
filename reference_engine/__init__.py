"""A reference inference engine for the Qwen3.6-35B-A3B architecture (hybrid Gated DeltaNet + gated attention, 256-expert MoE, NVFP4).

    from reference_engine import LLM, SamplingParams
    llm = LLM(model="tiny")
    out = llm.generate(["Hello"], SamplingParams(max_tokens=8))
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "contract_implementations"]

# Packages whose modules declare contract implementations with `ops.registry.satisfies`.
_DECLARING_PACKAGES = (
    "reference_engine.ops",
    "reference_engine.quant",
    "reference_engine.cache",
    "reference_engine.kernels",
    "reference_engine.contract_entries",
)


def contract_implementations() -> dict[str, list[dict[str, Any]]]:
    """Contract id -> implementations declared in this engine (plain dicts, so callers need none of our types)."""
    for package_name in _DECLARING_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ModuleNotFoundError as error:
            if error.name == package_name:
                continue
            raise
        if hasattr(package, "__path__"):
            for info in pkgutil.walk_packages(package.__path__, prefix=package_name + "."):
                importlib.import_module(info.name)
    from reference_engine.ops.registry import registered

    return {
        contract_id: [
            {"impl": entry.target, "major": entry.major, "devices": list(entry.devices), "backend": entry.backend}
            for entry in entries
        ]
        for contract_id, entries in registered().items()
    }


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from reference_engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from reference_engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'reference_engine' has no attribute {name!r}")
