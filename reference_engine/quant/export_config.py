"""The quantization metadata an NVFP4 checkpoint carries, in the two published conventions.

ModelOpt: `hf_quant_config.json` (`producer`, `quantization.{quant_algo, group_size,
exclude_modules}`) and a `quantization_config` entry in config.json with
`quant_method: modelopt`. compressed-tensors: a `quantization_config` in config.json with
`quant_method: compressed-tensors`, `format: nvfp4-pack-quantized`, one config group targeting
`Linear` (the NVFP4 preset: weights and input activations FP4, tensor_group strategy, groups of
16, FP8 E4M3 group scales) and an `ignore` list of modules kept in high precision.
"""

from __future__ import annotations

from typing import Any

from reference_engine import __version__

PRODUCER = {"name": "inference-skills-toolbox", "version": __version__}
GROUP_SIZE = 16


def modelopt_hf_quant_config(exclude_modules: list[str]) -> dict[str, Any]:
    return {
        "producer": dict(PRODUCER),
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": GROUP_SIZE,
            "exclude_modules": list(exclude_modules),
        },
    }


def modelopt_quantization_config(exclude_modules: list[str]) -> dict[str, Any]:
    return {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": GROUP_SIZE,
        "exclude_modules": list(exclude_modules),
        "producer": dict(PRODUCER),
    }


def _fp4_args(dynamic: bool | str, observer: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "group_size": GROUP_SIZE,
        "strategy": "tensor_group",
        "dynamic": dynamic,
        "scale_dtype": "torch.float8_e4m3fn",
    }
    if observer is not None:
        args["observer"] = observer
    return args


def compressed_tensors_quantization_config(ignore: list[str]) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": _fp4_args(False),
                "input_activations": _fp4_args("local", "static_minmax"),
                "output_activations": None,
                "format": "nvfp4-pack-quantized",
            }
        },
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
    }
