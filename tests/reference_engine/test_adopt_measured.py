"""`benchmarks/kernels/adopt_measured.py`: the rules that turn GPU timing files into tuning settings.

Synthetic timing records (the shapes the timing scripts write) against a copy of the committed tuning file: each
rule adopts what beats the margin at every batch or shape it must, and leaves the file alone otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUNING = REPO / "reference_engine" / "kernels" / "tuned" / "nvidia-h200.json"


@pytest.fixture(scope="module")
def adopt():
    spec = importlib.util.spec_from_file_location("adopt_measured", REPO / "benchmarks" / "kernels" / "adopt_measured.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(adopt, tmp_path: Path, monkeypatch, drop: tuple[str, ...] = (), grouped: dict | None = None, **records) -> dict:
    """Run the script's main on a copy of the tuning file (without the keys in `drop`, `moe_grouped_half` updated
    with `grouped`) with the given records files; returns the file after."""
    tuning = tmp_path / "tuning.json"
    shutil.copy(TUNING, tuning)
    document = {k: v for k, v in json.loads(tuning.read_text()).items() if k not in drop}
    document["moe_grouped_half"] |= grouped or {}
    tuning.write_text(json.dumps(document))
    argv = ["adopt_measured.py", str(tuning)]
    for flag, content in records.items():
        path = tmp_path / f"{flag}.json"
        path.write_text(json.dumps(content))
        argv += [f"--{flag.replace('_', '-')}", str(path)]
    monkeypatch.setattr(sys, "argv", argv)
    adopt.main()
    return json.loads(tuning.read_text())


def _gemv(rows, k_bytes, config, row_us, tile_us, best=None):
    record = {"rows": rows, "k_bytes": k_bytes, "config": config, "row_major_us": row_us, "tile_major_us": tile_us, "ratio": tile_us / row_us}
    if best is not None:
        record["best_tiled"] = {"config": best[0], "tile_major_us": best[1]}
    return record


def test_gemv_copies_and_a_faster_neighbour_are_written(adopt, tmp_path, monkeypatch):
    before = json.loads(TUNING.read_text())
    committed = next(e["config"] for e in before["nvfp4_gemv"] if e["rows"] == 12288)
    neighbour = [*committed[:3], committed[3] * 2, *committed[4:]]
    after = _run(adopt, tmp_path, monkeypatch, drop=("gemv_tiled",), gemv_tiled={"records": [
        _gemv(12288, 1024, committed, 11.0, 9.7, (neighbour, 9.0)),  # 0.928 of the committed tile: taken
        _gemv(2048, 2048, [1, 64, 64, 16, 4, 0, 2], 6.2, 5.9, ([1, 64, 64, 16, 4, 1, 2], 5.8)),  # 0.983: not taken
        _gemv(248320, 1024, [1, 64, 64, 1, 4, 0, 2], 100.0, 120.0) | {"lm_head": True},  # information only: does not block
    ]})
    assert after["gemv_tiled"] == 1
    entries = {e["rows"]: e["config"] for e in after["nvfp4_gemv"]}
    assert entries[12288] == neighbour
    assert entries[2048] == next(e["config"] for e in before["nvfp4_gemv"] if e["rows"] == 2048)


def test_gemv_copies_are_refused_when_one_shape_gets_slower(adopt, tmp_path, monkeypatch):
    before = json.loads(TUNING.read_text())
    after = _run(adopt, tmp_path, monkeypatch, drop=("gemv_tiled",), gemv_tiled={"records": [
        _gemv(12288, 1024, [1, 256, 64, 8, 4, 1, 3], 11.0, 8.0, ([1, 256, 64, 16, 4, 1, 3], 7.0)),
        _gemv(2048, 2048, [1, 64, 64, 16, 4, 0, 2], 6.0, 6.1),  # slower: nothing is written
    ]})
    assert "gemv_tiled" not in after
    assert after["nvfp4_gemv"] == before["nvfp4_gemv"]


def _grouped(tokens, row_us, tile_us, per_pair_us=None, sweep=()):
    record = {"tokens": tokens, "row_major_us": row_us, "tile_major_us": tile_us, "ratio": tile_us / row_us,
              "sweep": [{"change": change, "tile_major_us": us} for change, us in sweep]}  # fmt: skip
    if per_pair_us is not None:
        record["per_pair_us"] = per_pair_us
    return record


def test_grouped_variant_must_win_at_every_batch(adopt, tmp_path, monkeypatch):
    after = _run(adopt, tmp_path, monkeypatch, tiled={"records": [
        _grouped(16, 120, 100, sweep=[({"down_block_b": 8}, 90), ({"num_warps": 8}, 80)]),
        _grouped(32, 190, 160, sweep=[({"down_block_b": 8}, 150), ({"num_warps": 8}, 170)]),  # 8 warps loses here
    ]})
    settings = after["moe_grouped_half"]
    assert settings["tiled"] == 1 and settings["down_block_b"] == 8 and settings["num_warps"] == json.loads(TUNING.read_text())["moe_grouped_half"]["num_warps"]


def test_min_tokens_drops_only_through_batches_that_all_win(adopt, tmp_path, monkeypatch):
    after = _run(adopt, tmp_path, monkeypatch, grouped={"min_tokens": 16}, tiled={"records": [
        _grouped(2, 50, 48, per_pair_us=45),  # per-pair faster: the bound stops above 2
        _grouped(4, 60, 50, per_pair_us=60),
        _grouped(8, 80, 60, per_pair_us=75),
        _grouped(12, 95, 70, per_pair_us=90),
        _grouped(16, 120, 100, per_pair_us=150),
    ]})
    assert after["moe_grouped_half"]["min_tokens"] == 4
    after = _run(adopt, tmp_path, monkeypatch, grouped={"min_tokens": 16}, tiled={"records": [
        _grouped(4, 60, 50, per_pair_us=60),
        _grouped(8, 80, 79, per_pair_us=80),  # within the margin: no batch below 16 qualifies past it
        _grouped(12, 95, 70, per_pair_us=90),
    ]})
    assert after["moe_grouped_half"]["min_tokens"] == 12
    after = _run(adopt, tmp_path, monkeypatch, grouped={"min_tokens": 16}, tiled={"records": [_grouped(8, 80, 79, per_pair_us=80)]})
    assert after["moe_grouped_half"]["min_tokens"] == 16  # no batch wins: the bound stays


def test_gemm_copies_need_every_shape_and_batch(adopt, tmp_path, monkeypatch):
    records = [{"rows": 12288, "cols": 2048, "tokens": t, "row_major_us": 10.0, "tile_major_us": us, "ratio": us / 10.0}
               for t, us in ((8, 9.0), (32, 12.0), (64, 9.0))]  # fmt: skip
    assert "gemm_tiled" not in _run(adopt, tmp_path, monkeypatch, gemm_tiled={"records": records})
    for record in records:
        record["tile_major_us"], record["ratio"] = 9.0, 0.9
    assert _run(adopt, tmp_path, monkeypatch, gemm_tiled={"records": records})["gemm_tiled"] == 1
