"""Say which quantisation layout a Hugging Face checkpoint folder holds, per linear module.

Standard library only: reads config.json, hf_quant_config.json and the safetensors headers (an
8-byte little-endian length, then a JSON table of name -> dtype, shape, offsets); no tensor data
is loaded. Implements the decision procedure of ../SKILL.md section 4 and cross-checks the
declared metadata against the tensors.

Run:  python detect_quant_format.py /path/to/checkpoint      (summary per format and module kind)
      python detect_quant_format.py --self-test              (builds four tiny fake checkpoints)
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
from collections import Counter
from pathlib import Path


def read_headers(folder: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype string, shape) over every *.safetensors file of the folder."""
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        tensors.update({name: (info["dtype"], info["shape"]) for name, info in header.items() if name != "__metadata__"})
    return tensors


def declared_scheme(folder: Path) -> tuple[str, str]:
    """(family, algorithm) declared by the metadata files: steps 1-3 of the decision procedure."""
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    quant = config.get("quantization_config") or config.get("text_config", {}).get("quantization_config") or {}
    hf_quant = folder / "hf_quant_config.json"
    if hf_quant.is_file() or quant.get("quant_method") == "modelopt":
        declared = json.loads(hf_quant.read_text()).get("quantization", {}) if hf_quant.is_file() else quant
        return "modelopt", str(declared.get("quant_algo", "?")).upper()
    if quant.get("quant_method") == "compressed-tensors":
        formats = {quant.get("format")} | {g.get("format") for g in (quant.get("config_groups") or {}).values()}
        return "compressed-tensors", ",".join(sorted(f for f in formats if f))
    if quant:
        return str(quant.get("quant_method")), "?"
    return "none", ""


def classify(tensors: dict[str, tuple[str, list[int]]]) -> dict[str, str]:
    """module -> layout, from the tensors alone: step 4 of the decision procedure."""
    layouts = {}
    for name, (dtype, shape) in tensors.items():
        if name.endswith(".weight_packed"):
            module = name.removesuffix(".weight_packed")
            layouts[module] = "ct-nvfp4-w4a4" if module + ".input_global_scale" in tensors else "ct-nvfp4-w4a16"
        elif name.endswith(".weight") and len(shape) == 2:
            module = name.removesuffix(".weight")
            if dtype == "U8" and module + ".weight_scale_2" in tensors:
                layouts[module] = "modelopt-nvfp4-w4a4" if module + ".input_scale" in tensors else "modelopt-nvfp4-w4a16"
            elif dtype == "F8_E4M3":
                layouts[module] = "fp8"
            elif dtype in ("BF16", "F16", "F32"):
                layouts[module] = "dense-" + dtype.lower()
            else:
                layouts[module] = "unknown-" + dtype
    return layouts


def module_kind(module: str) -> str:
    parts = module.split(".")
    if "experts" in parts:
        return "routed expert " + parts[-1]
    return ".".join(p for p in parts[-2:] if not p.isdigit())


def report(folder: Path) -> dict[str, Counter]:
    family, algorithm = declared_scheme(folder)
    tensors = read_headers(folder)
    layouts = classify(tensors)
    print(f"{folder}: declared {family} {algorithm}".rstrip())
    by_layout: dict[str, Counter] = {}
    for module, layout in layouts.items():
        by_layout.setdefault(layout, Counter())[module_kind(module)] += 1
    for layout, kinds in sorted(by_layout.items()):
        print(f"  {layout}: {sum(kinds.values())} modules  ({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))})")
    quantised = {layout.split("-")[0] for layout in layouts.values() if not layout.startswith(("dense", "unknown"))}
    mismatch = (family == "none" and quantised) or (family == "modelopt" and "ct" in quantised) or (
        family == "compressed-tensors" and "modelopt" in quantised
    )
    if mismatch:
        print(f"  WARNING: the tensors ({sorted(quantised)}) contradict the declared {family!r} scheme")
    fused = [n for n in tensors if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]
    print(f"  experts: {'fused 3-D tensors' if fused else 'per expert (unfused) or none'}")
    return by_layout


def _write(folder: Path, tensors: dict[str, tuple[str, list[int]]], config: dict, hf_quant: dict | None = None) -> None:
    folder.mkdir(parents=True)
    sizes = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + count * sizes[dtype]]}
        offset += count * sizes[dtype]
    blob = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    (folder / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))


def self_test() -> None:
    n, k = 32, 64
    root = Path(tempfile.mkdtemp())
    p = "model.language_model.layers.0."
    dense = {p + "self_attn.q_proj.weight": ("BF16", [n, k]), p + "mlp.gate.weight": ("BF16", [8, k])}
    modelopt = dict(dense)
    modelopt.pop(p + "self_attn.q_proj.weight")
    for e in range(2):
        m = f"{p}mlp.experts.{e}.gate_proj"
        modelopt.update({m + ".weight": ("U8", [n, k // 2]), m + ".weight_scale": ("F8_E4M3", [n, k // 16]), m + ".weight_scale_2": ("F32", [])})
    modelopt.update({p + "self_attn.q_proj.weight": ("F8_E4M3", [n, k]), p + "self_attn.q_proj.weight_scale": ("F32", []), p + "self_attn.q_proj.input_scale": ("F32", [])})
    ct = dict(dense)
    ct.pop(p + "self_attn.q_proj.weight")
    m = p + "self_attn.q_proj"
    ct.update({m + ".weight_packed": ("U8", [n, k // 2]), m + ".weight_scale": ("F8_E4M3", [n, k // 16]), m + ".weight_global_scale": ("F32", [1]), m + ".input_global_scale": ("F32", [1])})
    mixed = {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {}, "exclude_modules": ["lm_head"]}}
    _write(root / "bf16", dense, {})
    _write(root / "modelopt", modelopt, {"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}}, mixed)
    _write(root / "ct", ct, {"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {}}})
    _write(root / "liar", ct, {})
    results = {name: report(root / name) for name in ("bf16", "modelopt", "ct", "liar")}
    assert set(results["bf16"]) == {"dense-bf16"}
    assert results["modelopt"]["modelopt-nvfp4-w4a16"]["routed expert gate_proj"] == 2 and "fp8" in results["modelopt"]
    assert "ct-nvfp4-w4a4" in results["ct"] and declared_scheme(root / "ct") == ("compressed-tensors", "nvfp4-pack-quantized")
    assert declared_scheme(root / "liar") == ("none", "")  # the tensors say otherwise: report() warns
    print("self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    elif len(sys.argv) == 2 and Path(sys.argv[1]).is_dir():
        report(Path(sys.argv[1]))
    else:
        sys.exit("usage: detect_quant_format.py CHECKPOINT_DIR | --self-test")
