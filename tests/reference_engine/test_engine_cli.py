"""`toolbox engine generate|quantize` through click's CliRunner, and checkpoint directories through LLM."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from reference_engine import LLM, SamplingParams
from reference_engine.presets import save_preset_checkpoint
from reference_engine.tokenizer import tiny_tokenizer
from toolbox.cli import main

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_greedy_text() -> str:
    llm = LLM(model="tiny", max_model_len=64)
    return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0].outputs[0].text


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = save_preset_checkpoint("tiny", tmp_path_factory.mktemp("tiny-bf16"), seed=0)
    tiny_tokenizer().tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_generate_streams_the_greedy_text(tiny_greedy_text):
    result = CliRunner().invoke(main, ["engine", "generate", "--prompt", PROMPT, "--max-tokens", "5"])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == tiny_greedy_text
    assert "5 tokens, finish reason: length" in result.stderr


def test_generate_sampling_options_are_reproducible():
    args = ["engine", "generate", "--prompt", "Hello", "--max-tokens", "4", "--temperature", "0.9", "--top-p", "0.9",
            "--top-k", "40", "--seed", "3", "--ignore-eos"]
    first, second = CliRunner().invoke(main, args), CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-preset", "--prompt", "x"], "neither a preset"),
        (["--prompt", "x", "--temperature", "-1"], "Invalid value for '--temperature'"),
        (["--prompt", "x", "--top-k", "-5"], "top_k must be"),
        (["--prompt", "x", "--max-tokens", "10", "--max-model-len", "8"], "can never fit"),
    ],
)
def test_generate_errors_are_clear(args, message):
    result = CliRunner().invoke(main, ["engine", "generate", *args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (ValueError, KeyError))


def test_help_has_examples():
    for args in (["engine"], ["engine", "generate"], ["engine", "quantize"]):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "Examples:" in result.output


def test_checkpoint_directory_matches_the_preset(checkpoint, tiny_greedy_text):
    llm = LLM(model=str(checkpoint), max_model_len=64)
    assert llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0].outputs[0].text == tiny_greedy_text


def test_checkpoint_without_tokenizer_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        LLM(model=str(tmp_path))


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_quantize_then_generate(checkpoint, tmp_path, fmt):
    destination = tmp_path / "nvfp4"
    result = CliRunner().invoke(main, ["engine", "quantize", str(checkpoint), str(destination), "--format", fmt, "--exclude", "*.self_attn.o_proj"])
    assert result.exit_code == 0, result.output
    assert "linear modules quantized" in result.stdout
    config = json.loads((destination / "config.json").read_text())
    assert "quantization_config" in config
    assert "model.layers.3.self_attn.o_proj" in json.dumps(config["quantization_config"])  # the extra exclude is listed
    llm = LLM(model=str(destination), max_model_len=64)
    output = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) >= 1


def test_quantize_errors_are_clear(checkpoint, tmp_path):
    result = CliRunner().invoke(main, ["engine", "quantize", str(tmp_path / "missing"), str(tmp_path / "out")])
    assert result.exit_code != 0 and "is not a directory" in result.output
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "file").write_text("x")
    result = CliRunner().invoke(main, ["engine", "quantize", str(checkpoint), str(occupied)])
    assert result.exit_code != 0 and "not empty" in result.output and "Traceback" not in result.output
