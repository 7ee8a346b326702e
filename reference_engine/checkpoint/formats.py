"""Which quantisation format a checkpoint declares: none (bf16/fp32), ModelOpt (NVFP4, FP8, mixed) or compressed-tensors NVFP4.

Read from `config.json` (`quantization_config`) and ModelOpt's `hf_quant_config.json`. Per-layer
formats are then read from the tensors themselves (see `plan.py`); the declared lists of excluded /
ignored modules are cross-checked against them.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_engine.checkpoint.files import CheckpointError

MODELOPT_ALGOS = ("NVFP4", "MIXED_PRECISION", "FP8")
COMPRESSED_TENSORS_FORMATS = ("nvfp4-pack-quantized", "dense")


@dataclass(frozen=True)
class QuantScheme:
    kind: str  # "none" | "modelopt" | "compressed-tensors"
    algorithm: str = ""  # ModelOpt quant_algo, or compressed-tensors format
    excluded: tuple[str, ...] = ()  # module patterns kept unquantised (ModelOpt globs; compressed-tensors names or "re:" regexes)

    def is_excluded(self, module: str) -> bool:
        """Whether the checkpoint declares `module` (full stored name, no `.weight`) unquantised."""
        for pattern in self.excluded:
            if pattern.startswith("re:"):
                if re.fullmatch(pattern[3:], module) or re.match(pattern[3:], module):
                    return True
            elif fnmatch.fnmatchcase(module, pattern) or module == pattern or module.endswith("." + pattern):
                return True
        return False


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None


def detect_scheme(directory: str | Path, config: dict[str, Any] | None = None) -> QuantScheme:
    directory = Path(directory)
    if config is None:
        config_path = directory / "config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
    quant = config.get("quantization_config") or config.get("text_config", {}).get("quantization_config")
    hf_quant_path = directory / "hf_quant_config.json"
    if hf_quant_path.is_file() or (quant and quant.get("quant_method") == "modelopt"):
        declared = _read_json(hf_quant_path).get("quantization", {}) if hf_quant_path.is_file() else dict(quant or {})
        algorithm = str(declared.get("quant_algo", "")).upper()
        if algorithm not in MODELOPT_ALGOS:
            raise CheckpointError(f"ModelOpt quant_algo {algorithm or None!r} is not supported; expected one of {list(MODELOPT_ALGOS)}")
        group_size = declared.get("group_size", 16)
        if algorithm == "NVFP4" and group_size != 16:
            raise CheckpointError(f"ModelOpt NVFP4 group_size {group_size} is not supported; expected 16")
        return QuantScheme("modelopt", algorithm, tuple(declared.get("exclude_modules") or ()))
    if not quant:
        return QuantScheme("none")
    method = quant.get("quant_method")
    if method == "compressed-tensors":
        formats = {quant.get("format")} | {group.get("format") for group in (quant.get("config_groups") or {}).values()}
        formats.discard(None)
        unknown = sorted(f for f in formats if f not in COMPRESSED_TENSORS_FORMATS)
        if unknown or not formats:
            raise CheckpointError(
                f"compressed-tensors format {unknown or None} is not supported; expected 'nvfp4-pack-quantized'"
            )
        for name, group in (quant.get("config_groups") or {}).items():
            weights = group.get("weights") or {}
            if weights and (weights.get("num_bits"), weights.get("type"), weights.get("group_size")) != (4, "float", 16):
                raise CheckpointError(
                    f"compressed-tensors config group {name!r}: weights {weights.get('num_bits')}-bit {weights.get('type')} "
                    f"group {weights.get('group_size')} is not NVFP4 (expected 4-bit float, group 16)"
                )
        return QuantScheme("compressed-tensors", "nvfp4-pack-quantized", tuple(quant.get("ignore") or ()))
    raise CheckpointError(f"quantization_config.quant_method {method!r} is not supported; expected 'modelopt' or 'compressed-tensors'")
