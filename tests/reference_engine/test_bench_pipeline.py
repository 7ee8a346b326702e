"""The whole bench pipeline at tiny size on the CPU: gate, ceilings, figures, profile, peer, JSON and Markdown.

Timing numbers are not asserted (only that they exist and are positive). A known-wrong fast path
(decode attention with the wrong scale) must fail the gate, and then no speed may be reported.
"""

from __future__ import annotations

import json

import pytest
import torch

from reference_engine.bench.gate import compare_logits, run_gate
from reference_engine.bench.report import markdown
from reference_engine.bench.run import BenchOptions, run_bench
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer

QUICK = {
    "model": "tiny",
    "device": "cpu",
    "dtype": "float32",
    "prompt_tokens": 32,
    "batch_prompt_tokens": 8,
    "output_tokens": 3,
    "batch_sizes": (1, 2),
    "gate_prompts": 2,
    "gate_steps": 3,
    "gate_prompt_tokens": 16,
    "ttft_repeats": 1,
    "peer_decode_tokens": 2,
}


@pytest.fixture
def wrong_decode_attention(monkeypatch):
    """A fast path whose decode attention uses twice the softmax scale (a known-wrong kernel)."""
    from reference_engine.ops import backend, static_attention

    original = static_attention.paged_decode
    original_gated = static_attention.paged_decode_gated

    def wrong(query, k_cache, v_cache, block_tables, seq_lens, out, scale):
        return original(
            query, k_cache, v_cache, block_tables, seq_lens, out=out, scale=2 * scale
        )

    def wrong_gated(query, k_cache, v_cache, block_tables, seq_lens, q_gate, out, scale):
        return original_gated(query, k_cache, v_cache, block_tables, seq_lens, q_gate, out=out, scale=2 * scale)

    # the torch OpSet the static path calls (the fused layer calls the gated form)
    monkeypatch.setattr(backend, "paged_decode", wrong)
    monkeypatch.setattr(backend, "paged_decode_gated", wrong_gated)


def test_bench_writes_json_and_markdown(tmp_path) -> None:
    document = run_bench(
        BenchOptions(**QUICK, out_dir=str(tmp_path), name="tiny-run"),
        log=lambda line: None,
    )
    saved = json.loads((tmp_path / "tiny-run.json").read_text())
    summary = (tmp_path / "tiny-run.md").read_text()
    assert saved["gate"]["passed"] and saved["gate"]["positions"] > 0
    assert (
        saved["environment"]["torch"] == torch.__version__
        and saved["environment"]["device_name"] == "cpu"
    )
    assert (
        saved["ceilings"]["copy_bandwidth"] > 0 and saved["ceilings"]["matmul_rate"] > 0
    )
    figures = [row["figure"] for row in saved["table"]]
    assert figures == [
        "TTFT, 32 prompt tokens",
        "TPOT, batch 1",
        "TPOT, batch 1, async engine step",
        "TPOT, batch 1, sampled, engine step",
        "TPOT, batch 1, sampled, async engine step",
        "output tokens/s, batch 1",
        "output tokens/s, batch 1, async engine",
        "output tokens/s, batch 2",
        "output tokens/s, batch 2, async engine",
    ]
    for row in saved["table"]:
        assert row["ours"] > 0 and row["floor"] > 0 and row["ours_over_floor"] > 0
    assert (
        saved["table"][0]["peer"] > 0
        and saved["table"][1]["peer"] > 0
        and all(row["peer"] is None for row in saved["table"] if "batch 2" in row["figure"])
    )
    assert (
        saved["peer_agreement"]["same_top1"] and saved["peer_agreement"]["kl"] < 1e-6
    )  # the peer computes the same function
    assert "flash-linear-attention" in saved["peer"]["note"]
    assert saved["profile"]["kernels"] and saved["profile"]["total_us"] > 0
    assert saved["ours"]["throughput"]["2"]["decode_steps"] >= 1
    assert saved["ours"]["throughput"]["2"]["graph_captured_in_timed_run"] is False and "WARNING" not in summary
    flagged = json.loads(json.dumps(saved))
    flagged["ours"]["throughput"]["2"]["graph_captured_in_timed_run"] = True
    assert "WARNING: the decode graph of batch 2 was captured inside the timed run" in markdown(flagged)
    assert (
        "| figure | ours | floor | ours/floor | peer | peer/ours |" in summary
        and "TPOT, batch 1" in summary
    )
    assert document["name"] == "tiny-run"


def test_gate_passes_static_and_fails_a_wrong_fast_path(wrong_decode_attention) -> None:
    model = build_preset("tiny", seed=1)
    result = run_gate(
        model, load_tokenizer("tiny"), "static", num_prompts=2, decode_steps=3
    )
    assert not result.passed and result.kl_mean > 1e-8, result.message


def test_gate_failure_reports_no_speed(tmp_path, wrong_decode_attention) -> None:
    from click.testing import CliRunner

    from toolbox.commands.engine import command

    result = CliRunner().invoke(
        command,
        [
            "bench",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--output-tokens",
            "2",
            "--batch-sizes",
            "1",
            "--prompt-tokens",
            "16",
            "--gate-prompts",
            "2",
            "--gate-steps",
            "2",
            "--no-peer",
            "--no-profile",
            "--quantize",
            "none",
            "--out-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 1
    assert "accuracy gate failed" in result.output and "KL mean" in result.output
    assert "tokens/s" not in result.output
    written = list(tmp_path.glob("*.json"))
    assert len(written) == 1 and written[0].name.endswith("-gate-failed.json")
    assert json.loads(written[0].read_text())["table"] == []


def test_compare_logits_metrics() -> None:
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(4, 50, generator=generator, dtype=torch.float64) * 3
    kl_mean, _, top1, positions, counted = compare_logits(
        [(reference, reference.clone())], (1e-8, 1e-7, 1.0, 1e-3)
    )
    assert (
        kl_mean == pytest.approx(0.0, abs=1e-12)
        and top1 == 1.0
        and positions == 4
        and counted == 4
    )
    shuffled = reference[:, torch.randperm(50, generator=generator)]
    kl_mean, _, top1, _, _ = compare_logits(
        [(reference, shuffled)], (1e-8, 1e-7, 1.0, 1e-3)
    )
    assert kl_mean > 0.1 and top1 < 1.0
    nan = reference.clone()
    nan[0, 0] = float("nan")
    assert compare_logits([(reference, nan)], (1e-8, 1e-7, 1.0, 1e-3))[0] == float(
        "inf"
    )


def test_cli_rejects_bad_batch_sizes() -> None:
    from click.testing import CliRunner

    from toolbox.commands.engine import command

    result = CliRunner().invoke(command, ["bench", "--batch-sizes", "1,x"])
    assert result.exit_code == 2 and "comma-separated integers" in result.output
    result = CliRunner().invoke(command, ["bench", "--help"])
    assert result.exit_code == 0 and "Examples:" in result.output


@pytest.mark.cuda
def test_bench_tiny_on_cuda_with_graphs(tmp_path) -> None:
    """The GPU pipeline at tiny size: the gate compares graph replay with the eager path in bf16."""
    options = BenchOptions(
        **{**QUICK, "device": "cuda", "dtype": "bfloat16"},
        out_dir=str(tmp_path),
        name="tiny-cuda",
    )
    document = run_bench(options, log=lambda line: None)
    assert document["gate"]["passed"], document["gate"]["message"]
    assert document["gate"]["fast_mode"].startswith("graphs"), document["gate"][
        "fast_mode"
    ]
    assert document["ours"]["decode_mode"].startswith("graphs"), document["ours"][
        "decode_mode"
    ]
    # batch 2 of 8-token prompts prefills in one step; the warm-up must still reach the batch's decode graph
    assert not any(figures["graph_captured_in_timed_run"] for figures in document["ours"]["throughput"].values())
    assert (
        document["profile"]["clock"].startswith("device")
        and document["profile"]["kernels"]
    )
    assert (tmp_path / "tiny-cuda.md").is_file()


def test_bf16_gate_is_measured_against_the_float32_twin_and_catches_a_wrong_fast_path(wrong_decode_attention) -> None:
    model = build_preset("tiny", seed=1, dtype=torch.bfloat16, quantize="nvfp4")
    result = run_gate(model, load_tokenizer("tiny"), "static", num_prompts=2, decode_steps=4)
    assert result.reference == "float32 twin (eager)" and result.plain is not None
    assert not result.passed and result.kl_mean > 2 * result.plain["kl_mean"] + 1e-3, result.message


def test_bf16_gate_passes_the_static_path() -> None:
    model = build_preset("tiny", seed=1, dtype=torch.bfloat16, quantize="nvfp4")
    result = run_gate(model, load_tokenizer("tiny"), "static", num_prompts=2, decode_steps=4)
    assert result.passed, result.message
    assert 0 < result.plain["kl_mean"] < 1e-2  # the plain bf16 path differs from float32 by rounding only


def test_profiles_run_after_every_timed_figure(tmp_path, monkeypatch) -> None:
    """torch.profiler slows every later launch in its process, so the bench must profile last."""
    from reference_engine.bench import measure, profile

    order: list[str] = []
    for module, name in ((measure.EngineBench, "ttft"), (measure.EngineBench, "tpot"), (measure.EngineBench, "throughput")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda self, *args, _f=original, _n=name, **kw: order.append(_n) or _f(self, *args, **kw))
    for name in ("profile_decode_step", "profile_prefill"):
        original = getattr(profile, name)
        monkeypatch.setattr(profile, name, lambda *args, _f=original, _n=name, **kw: order.append(_n) or _f(*args, **kw))
    run_bench(BenchOptions(**{**QUICK, "batch_sizes": (1, 32), "output_tokens": 2}, out_dir=str(tmp_path), name="order", peer=False), log=lambda line: None)
    profiled = [i for i, name in enumerate(order) if name.startswith("profile")]
    timed = [i for i, name in enumerate(order) if not name.startswith("profile")]
    assert profiled and timed and min(profiled) > max(timed), order
    assert order.count("profile_decode_step") == 2  # batch 1 and batch 32
    summary = (tmp_path / "order.md").read_text()
    assert "batch 32, host" in summary and "batch 1, host" in summary


def test_the_peer_runs_after_our_timed_figures_with_our_weights_parked(tmp_path, monkeypatch) -> None:
    """The peer comes after our figures (our engine is gone, so our weights can leave the device) and before the profiles."""
    from reference_engine.bench import measure, offload, peer, profile

    order: list[str] = []
    for name in ("ttft", "tpot", "throughput"):
        original = getattr(measure.EngineBench, name)
        monkeypatch.setattr(measure.EngineBench, name, lambda self, *args, _f=original, _n=name, **kw: order.append(_n) or _f(self, *args, **kw))
    original_peer = peer.measure_peer
    monkeypatch.setattr(peer, "measure_peer", lambda *args, **kw: order.append("peer") or original_peer(*args, **kw))
    original_park = offload.weights_parked_on_host
    monkeypatch.setattr(offload, "weights_parked_on_host", lambda model: order.append("park") or original_park(model))
    original_profile = profile.profile_decode_step
    monkeypatch.setattr(profile, "profile_decode_step", lambda *args, **kw: order.append("profile") or original_profile(*args, **kw))
    document = run_bench(BenchOptions(**{**QUICK, "batch_sizes": (1, 2), "output_tokens": 2}, out_dir=str(tmp_path), name="peer-order"),
                         log=lambda line: None)  # fmt: skip
    assert order.index("park") < order.index("peer") < order.index("profile"), order
    assert max(i for i, name in enumerate(order) if name in ("ttft", "tpot", "throughput")) < order.index("park"), order
    assert document["peer"]["ttft_seconds"] > 0 and not document["partial"]
    assert document["peer_agreement"]["same_top1"] and document["peer_agreement"]["kl"] < 1e-6
