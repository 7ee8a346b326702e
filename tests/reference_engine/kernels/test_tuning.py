"""Kernel tuning files: validated at the edge, installed into the kernel modules, speed-only (same outputs)."""

from __future__ import annotations

import json

import pytest
from kernel_interpreter import run_script

from reference_engine.kernels import tuning


def test_a_malformed_tuning_file_is_rejected_with_its_path(tmp_path) -> None:
    path = tmp_path / "h200.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "nvfp4_gemv": [{"tokens": 1, "rows": 8, "k_bytes": 32, "config": [1, 8]}]}))
    with pytest.raises(ValueError, match="h200.json"):
        tuning.apply_tuning(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="h200.json"):
        tuning.apply_tuning(path)


def test_device_file_names() -> None:
    assert tuning.device_file("NVIDIA H200").name == "nvidia-h200.json"
    assert tuning.apply_for_device("A device with no tuning file") is None


def test_a_card_without_a_file_takes_its_architectures_file() -> None:
    h200 = tuning.device_file("NVIDIA H200")
    assert h200.exists()
    assert tuning.tuning_path("NVIDIA H200") == h200
    assert tuning.tuning_path("NVIDIA H100 80GB HBM3", (9, 0)) == h200  # same compute capability: the H200's file
    assert tuning.tuning_path("NVIDIA H100 80GB HBM3") is None  # capability unknown: nothing
    assert tuning.tuning_path("NVIDIA A100-SXM4-80GB", (8, 0)) is None  # no file for that architecture
    assert tuning.tuning_path("NVIDIA B200", (10, 0)) is None


SCRIPT = r"""
import json, tempfile, torch
from reference_engine.kernels import moe_decode, nvfp4_gemv, tuning
from reference_engine.ops import static_moe
from reference_engine.presets import build_preset
from reference_engine.quant.linear import w4a16_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

g = torch.Generator().manual_seed(5)
w = torch.randn(48, 256, generator=g)
packed, scale, scale_2 = quantize_nvfp4(w)
x = torch.randn(1, 256, generator=g)
expected = torch.empty(1, 48)
w4a16_linear(x, packed, scale, scale_2, expected)
block = build_preset("tiny", seed=3, quantize="nvfp4").layers[0].mlp
xs = torch.randn(3, block.router_weight.shape[1], generator=g)
moe_expected = torch.empty_like(xs)
static_moe.moe_block_decode(xs, block.router_weight, block.experts.stacked, block.shared_nvfp4, block.top_k, out=moe_expected)
settings = {"device": "test", "nvfp4_gemv": [{"tokens": 1, "rows": 48, "k_bytes": 128, "config": [1, 8, 64, 2, 4, 1, 1]}],
            "moe_decode": {"LOOP": 3, "GATE_UP_BLOCK_N": 8, "GATE_UP_BLOCK_K": 32, "DOWN_BLOCK_H": 8, "DOWN_BLOCK_I": 16, "WORDS": 1, "DOWN_SPLIT": 2},
            "moe_decode_batch_one": {"LOOP": 0, "GATE_UP_BLOCK_N": 16, "GATE_UP_BLOCK_K": 16, "DOWN_BLOCK_H": 16, "DOWN_BLOCK_I": 16, "WORDS": 2, "DOWN_SPLIT": 3},
            "gdn_step_split": 8, "dequant_min_tokens": 128, "paged_min_tokens_per_split": 16, "paged_waves": 8,
            "gemm_prefetch_linear": 1, "gemm_prefetch_moe": 1, "gemm_swap_linear": 1, "gemm_swap_moe": 1, "gdn_prefill_scan_stages": 2, "gdn_prefill_prepare_warps": 4, "gemm_decode_moe": 2, "moe_prefill_fused_gate_up": 1, "moe_prefill_block_m_max": 32, "moe_prefill_gate_up_block_n": 128, "dequant_cache": True, "norm_row_elements": 2048, "gdn_step_fused_conv_max_batch": 2,
            "gemv_words": 1, "gemm_min_tokens": 16, "gemm_decode": 1, "small_m_gemm": [{"block_m": 16, "rows": 48, "k": 256, "config": [16, 4, 2]}],
            "moe_grouped_decode": {"min_tokens": 4, "gate_up_block_n": 16, "down_block_n": 16, "num_stages": 2}}
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
    json.dump(settings, handle)
tuning.apply_tuning(handle.name)
assert nvfp4_gemv.TUNED[(1, 48, 128)] == (1, 8, 64, 2, 4, 1, 1) and moe_decode.LOOP == 3 and moe_decode.DOWN_BLOCK_I == 16
assert moe_decode.WORDS == 1 and nvfp4_gemv.WORDS == 1 and nvfp4_gemv.GEMM_MIN_TOKENS == 16
assert moe_decode._settings(1) == (0, 16, 16, 16, 16, 2, 3) and moe_decode._settings(3) == (3, 8, 32, 8, 16, 1, 2)
from reference_engine.kernels import gdn_decode_step
assert gdn_decode_step.STEP_SPLIT == 8 and gdn_decode_step.FUSED_CONV_MAX_BATCH == 2 and not gdn_decode_step.FUSED_CONV
from reference_engine.kernels import norms
assert norms.ROW_ELEMENTS == 2048 and norms.rows_per_program(128) == 16
from reference_engine.kernels import nvfp4_dequant, paged_decode
assert nvfp4_dequant.MIN_TOKENS == 128 and paged_decode.MIN_TOKENS_PER_SPLIT == 16 and paged_decode.WAVES == 8 and nvfp4_dequant.CACHE
from reference_engine.kernels import nvfp4_gemm
assert nvfp4_gemm.DECODE == 1 and nvfp4_gemm.plan("linear", 16, 48, 256) == nvfp4_gemm.GemmPlan(16, 16, 32, 4, 3, 2)
from reference_engine.kernels import gdn_chunked_prefill
assert nvfp4_gemm.SWAP_LINEAR == 1 and nvfp4_gemm.SWAP_MOE == 1 and gdn_chunked_prefill.SCAN_STAGES == 2 and nvfp4_gemm.FUSE_GATE_UP == 1
assert nvfp4_gemm.DECODE_MOE == 2 and gdn_chunked_prefill.PREPARE_WARPS == 4
nvfp4_gemm.DECODE_MOE = -1  # the checks below are of the other keys (decode 2 has its own tests)
assert nvfp4_gemm.PREFETCH_LINEAR == 1 and nvfp4_gemm.PREFETCH_MOE == 1 and nvfp4_gemm.plan("moe_gate_up", 8192, 512, 2048, num_experts=256).block_m == 32
assert nvfp4_gemm.plan("moe_gate_up", 8192, 512, 2048, num_experts=256).block_n == 128 and nvfp4_gemm.plan("moe_down", 8192, 2048, 512, num_experts=256).block_n == 128
xs16 = torch.randn(16, 256, generator=g)
gemm_expected = torch.empty(16, 48)
w4a16_linear(xs16, packed, scale, scale_2, gemm_expected)
gemm_out = torch.full((16, 48), float("nan"))
nvfp4_gemv.w4a16_linear(xs16, packed, scale, scale_2, gemm_out)  # 16 tokens >= gemm_min_tokens: the tuned split-K GEMM, word decode, prefetch
assert float((gemm_out - gemm_expected).abs().max()) < 1e-4, (gemm_out - gemm_expected).abs().max()
out = torch.full((1, 48), float("nan"))
nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, out)
assert float((out - expected).abs().max()) < 1e-4, (out - expected).abs().max()
moe_out = torch.full_like(xs, float("nan"))
moe_decode.moe_block_decode(xs, block.router_weight, block.experts.stacked, block.shared_nvfp4, block.top_k, out=moe_out)
assert float((moe_out - moe_expected).norm() / moe_expected.norm()) < 1e-5
one = xs[:1].to(torch.bfloat16)  # one bfloat16 token: the batch-one setting (packed float16 pairs, down split over 3)
one_expected = torch.empty_like(one)
static_moe.moe_block_decode(one, block.router_weight.to(torch.bfloat16), block.experts.stacked, block.shared_nvfp4, block.top_k, out=one_expected)
one_out = torch.full_like(one, float("nan"))
moe_decode.moe_block_decode(one, block.router_weight.to(torch.bfloat16), block.experts.stacked, block.shared_nvfp4, block.top_k, out=one_out)
assert float((one_out.double() - one_expected.double()).norm() / one_expected.double().norm()) < 2e-2
from reference_engine.kernels import moe_grouped_decode
assert moe_grouped_decode.MIN_TOKENS == 4 and moe_grouped_decode.PLAN == moe_grouped_decode.GroupedPlan(gate_up_block_n=16, down_block_n=16, num_stages=2)
calls = []
real = moe_grouped_decode.grouped_experts_with_shared
moe_grouped_decode.grouped_experts_with_shared = lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
xs4 = torch.randn(4, block.router_weight.shape[1], generator=g)  # 4 tokens >= min_tokens: grouped by expert
four_expected = torch.empty_like(xs4)
static_moe.moe_block_decode(xs4, block.router_weight, block.experts.stacked, block.shared_nvfp4, block.top_k, out=four_expected)
four_out = torch.full_like(xs4, float("nan"))
moe_decode.moe_block_decode(xs4, block.router_weight, block.experts.stacked, block.shared_nvfp4, block.top_k, out=four_out)
assert calls == [4], calls  # the 3-token and 1-token blocks above stayed on the per-pair kernels
assert float((four_out - four_expected).norm() / four_expected.norm()) < 1e-5
print("ok")
"""


def test_tuned_settings_change_tiles_not_results_under_the_interpreter() -> None:
    output = run_script(SCRIPT)
    assert output.strip().endswith("ok"), output


def test_every_committed_tuning_file_validates() -> None:
    """The measured files in kernels/tuned/ (loaded by select_ops on their device) must stay loadable."""
    files = sorted(tuning.TUNED_DIR.glob("*.json"))
    assert files, "no tuning file is committed"
    for path in files:
        settings = tuning.TuningFile.model_validate(json.loads(path.read_text()))
        assert tuning.device_file(settings.device) == path, f"{path.name} is named for another device than {settings.device!r}"


def test_a_switch_is_taken_only_when_faster_overall_and_nowhere_slower() -> None:
    rows = [{"new": 7.5, "old": 8.2}, {"new": 20.9, "old": 20.3}]  # run58's one-launch GDN step, batches 1 and 8
    assert tuning.switch_wins(rows, "new", "old") == (False, pytest.approx(28.4 / 28.5))  # 3% slower at batch 8
    take, total = tuning.switch_wins([{"new": 9.0, "old": 10.0}, {"new": 10.1, "old": 10.0}], "new", "old")
    assert take and total == pytest.approx(0.955)
    assert not tuning.switch_wins([{"new": 9.9, "old": 10.0}], "new", "old")[0]  # 1%: inside the margin


def test_switch_timing_writes_its_records_and_a_valid_setting(tmp_path) -> None:
    tuning_file = tmp_path / "t.json"
    tuning_file.write_text(json.dumps({"device": "x", "gdn_step_split": 4}))
    rows = [{"ok": True, "on": 5.0, "off": 6.0}]
    assert tuning.finish_switch_timing(tmp_path / "r.json", {"rows": rows}, rows, "ok", "on", "off", "moe_expert_prefetch", tuning_file) == 0
    assert json.loads(tuning_file.read_text()) == {"device": "x", "gdn_step_split": 4, "moe_expert_prefetch": 1}
    assert json.loads((tmp_path / "r.json").read_text()) == {"rows": rows}
    bad = [{"ok": False, "on": 1.0, "off": 6.0}]  # the forms disagree: nothing written, exit status 1
    assert tuning.finish_switch_timing(tmp_path / "r.json", {}, bad, "ok", "on", "off", "gdn_step_fused_conv", tuning_file) == 1
    assert "gdn_step_fused_conv" not in json.loads(tuning_file.read_text())
    with pytest.raises(ValueError):
        tuning.write_setting(tuning_file, "moe_expert_prefetch", 3)  # out of range: the file must still validate
    assert json.loads(tuning_file.read_text())["moe_expert_prefetch"] == 1


def test_the_fused_sampling_switch_is_applied(tmp_path, monkeypatch) -> None:
    from reference_engine.kernels import sampling_select

    monkeypatch.setattr(sampling_select, "FUSED", False)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "sampling_fused_select": 1}))
    tuning.apply_tuning(path)
    assert sampling_select.FUSED is True
    path.write_text(json.dumps({"device": "x", "sampling_fused_select": 2}))
    with pytest.raises(ValueError, match="sampling_fused_select"):
        tuning.apply_tuning(path)


def test_the_one_launch_moe_keys_are_applied_and_checked(tmp_path, monkeypatch) -> None:
    from reference_engine.kernels import moe_pairs_fused

    for name, value in (("MAX_TOKENS", 0), ("BLOCK", False), ("DOWN_BLOCK_H", 8), ("NUM_WARPS", 4), ("SPIN_NS", 0)):
        monkeypatch.setattr(moe_pairs_fused, name, value)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "moe_pairs_fused_max_tokens": 4, "moe_pairs_fused_block": 1, "moe_pairs_fused_down_rows": 16,
                                "moe_pairs_fused_spin_ns": 1000}))  # fmt: skip
    tuning.apply_tuning(path)
    assert (moe_pairs_fused.MAX_TOKENS, moe_pairs_fused.BLOCK, moe_pairs_fused.DOWN_BLOCK_H, moe_pairs_fused.NUM_WARPS) == (4, True, 16, 4)
    assert moe_pairs_fused.SPIN_NS == 1000
    for key, bad in (("moe_pairs_fused_warps", 3), ("moe_pairs_fused_down_rows", 12), ("moe_pairs_fused_block", 2), ("moe_pairs_fused_spin_ns", -1)):
        path.write_text(json.dumps({"device": "x", key: bad}))
        with pytest.raises(ValueError, match=key):
            tuning.apply_tuning(path)


def test_small_batch_moe_settings_pick_the_first_ceiling_that_covers_a_batch(tmp_path, monkeypatch) -> None:
    from reference_engine.kernels import moe_decode

    for name, value in (("BATCH_ONE", None), ("SMALL_BATCHES", ()), ("LOOP", 0), ("GATE_UP_BLOCK_N", 32), ("GATE_UP_BLOCK_K", 64),
                        ("DOWN_BLOCK_H", 32), ("DOWN_BLOCK_I", 64), ("WORDS", 2), ("DOWN_SPLIT", 1)):  # fmt: skip
        monkeypatch.setattr(moe_decode, name, value)
    four = {"LOOP": 3, "GATE_UP_BLOCK_N": 16, "GATE_UP_BLOCK_K": 128, "DOWN_BLOCK_H": 16, "DOWN_BLOCK_I": 128, "WORDS": 3}
    two = {"LOOP": 3, "GATE_UP_BLOCK_N": 8, "GATE_UP_BLOCK_K": 256, "DOWN_BLOCK_H": 8, "DOWN_BLOCK_I": 256, "WORDS": 3}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "moe_decode_small_batches": [{"max_tokens": 4, **four}, {"max_tokens": 2, **two}]}))  # out of order
    tuning.apply_tuning(path)
    assert moe_decode._settings(1) == (0, 32, 64, 32, 64, 2, 1)  # no batch-one setting: the module's
    assert moe_decode._settings(2) == (3, 8, 256, 8, 256, 3, 1)
    assert moe_decode._settings(3) == moe_decode._settings(4) == (3, 16, 128, 16, 128, 3, 1)
    assert moe_decode._settings(5) == (0, 32, 64, 32, 64, 2, 1)
    path.write_text(json.dumps({"device": "x", "moe_decode_small_batches": [{"max_tokens": 1, **two}]}))  # batch one has its own key
    with pytest.raises(ValueError, match="moe_decode_small_batches"):
        tuning.apply_tuning(path)
