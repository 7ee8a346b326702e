"""The tensors of a safetensors checkpoint (one file or index.json shards): names, shapes and dtypes from the
headers alone (no data read), and one tensor at a time on demand.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the tensor and says what was expected."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    file: Path


def _read_header(path: Path) -> dict:
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100_000_000:
            raise CheckpointError(f"{path} is not a safetensors file (header length {length})")
        try:
            return json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CheckpointError(f"{path}: unreadable safetensors header ({error})") from None


class CheckpointFiles:
    """Index of every tensor in a checkpoint directory (or a single .safetensors file)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_file():
            files = [path]
        elif not path.is_dir():
            raise CheckpointError(f"checkpoint path {path} does not exist")
        else:
            indexes = sorted(path.glob("*.safetensors.index.json"))
            if indexes:
                weight_map = json.loads(indexes[0].read_text()).get("weight_map", {})
                files = sorted({path / name for name in weight_map.values()})
                missing = [str(f) for f in files if not f.is_file()]
                if missing:
                    raise CheckpointError(f"{indexes[0].name} names shard files that are missing: {missing[:3]}")
            else:
                files = sorted(path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"no .safetensors files in {path}")
        self.tensors: dict[str, TensorInfo] = {}
        for file in files:
            for name, entry in _read_header(file).items():
                if name == "__metadata__":
                    continue
                dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
                if dtype is None:
                    raise CheckpointError(f"tensor {name!r} in {file.name} has unsupported dtype {entry.get('dtype')!r}")
                self.tensors[name] = TensorInfo(name, tuple(entry["shape"]), dtype, file)
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        info = self.tensors[name]
        handle = self._handles.get(info.file)
        if handle is None:
            handle = safe_open(str(info.file), framework="pt", device="cpu")
            self._handles[info.file] = handle
        return handle.get_tensor(name)

    def close(self) -> None:
        self._handles.clear()
