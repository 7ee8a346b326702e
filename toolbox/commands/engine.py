"""`toolbox engine generate|quantize|bench`: the reference engine from the command line (thin layer over reference_engine)."""

from __future__ import annotations

import sys

import click

_USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, KeyError)


@click.group(
    "engine",
    epilog="""\b
Examples:
  toolbox engine generate --prompt "The capital of France is"
  toolbox engine generate --model /models/qwen3.6-35b-a3b --device cuda --dtype bfloat16 --prompt "Hi"
  toolbox engine quantize /models/bf16 /models/nvfp4 --format modelopt
  toolbox engine bench --output-tokens 32 --batch-sizes 1,8
""",
)
def command() -> None:
    """The reference engine: generate text, quantize a checkpoint to NVFP4, benchmark it."""


@command.command(
    "generate",
    epilog="""\b
Examples:
  toolbox engine generate --prompt "Hello"                     # tiny random-weight model, greedy, CPU
  toolbox engine generate --prompt "Once upon a time" --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 7
  toolbox engine generate --model full --device cuda --dtype bfloat16 --prompt "Hello"
  toolbox engine generate --model /models/qwen3.6-35b-a3b-nvfp4 --device cuda --dtype bfloat16 --prompt "Hi"
""",
)
@click.option("--model", default="tiny", show_default=True, help='A preset ("tiny", "full": seeded random weights) or a checkpoint directory.')
@click.option("--prompt", required=True, help="The text to continue.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True, help="Tokens to generate at most.")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True, help="Nucleus mass kept.")
@click.option("--top-k", type=int, default=-1, show_default=True, help="Tokens kept; -1 disables the filter.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Seed of the request (reproducible sampling).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the end-of-sequence token.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=1), default=None, help="Longest sequence (prompt + output); default min(4096, the model's).")
def generate_command(model, prompt, max_tokens, temperature, top_p, top_k, seed, ignore_eos, device, dtype, max_model_len) -> None:
    """Generate a continuation of PROMPT, printing tokens as they are produced."""
    from reference_engine.llm import LLM
    from reference_engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos)
        llm = LLM(model=model, device=device, dtype=dtype, max_num_seqs=1, max_model_len=max_model_len)
        final = None
        for piece, output in llm.stream_outputs(prompt, params):
            if piece:
                click.echo(piece, nl=False)
                sys.stdout.flush()
            final = output
    except _USER_ERRORS as error:
        raise click.ClickException(str(error).strip("'\"")) from None
    click.echo()
    if final is not None:
        completion = final.outputs[0]
        click.echo(f"[{len(completion.token_ids)} tokens, finish reason: {completion.finish_reason}]", err=True)


@command.command(
    "quantize",
    epilog="""\b
Examples:
  toolbox engine quantize /models/bf16 /models/nvfp4-modelopt --format modelopt
  toolbox engine quantize /models/bf16 /models/nvfp4-ct --format compressed-tensors --exclude "*.self_attn.*"
""",
)
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["modelopt", "compressed-tensors"]), default="modelopt", show_default=True,
              help="Checkpoint layout to write.")
@click.option("--exclude", "patterns", multiple=True, metavar="PATTERN",
              help="Module-name glob kept unquantised, added to the defaults (lm_head, embeddings, norms, router, "
                   "shared_expert_gate, in_proj_a/b, conv1d, visual, mtp). Repeatable.")
def quantize_command(src, dst, fmt, patterns) -> None:
    """Quantize the linear layers of the bf16 checkpoint SRC to NVFP4 and write it to DST."""
    from pathlib import Path

    from reference_engine.quant.export import DEFAULT_EXCLUDE, quantize_checkpoint

    if not Path(src).is_dir():
        raise click.ClickException(f"{src} is not a directory")
    try:
        report = quantize_checkpoint(src, dst, fmt=fmt, exclude=tuple(DEFAULT_EXCLUDE) + tuple(patterns), progress=True)
    except _USER_ERRORS as error:
        raise click.ClickException(str(error).strip("'\"")) from None
    click.echo(
        f"wrote {fmt} NVFP4 checkpoint to {dst}: {len(report.quantized_modules)} linear modules quantized, "
        f"{len(report.excluded_modules)} kept, {len(report.shards)} shard(s)"
    )


def _batch_sizes(_context, _param, value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"batch sizes must be positive integers, got {value!r}")
    return sizes


@command.command(
    "bench",
    epilog="""\b
Examples:
  toolbox engine bench                                         # full size, NVFP4 linears, bf16 LM head, on cuda
  toolbox engine bench --lm-head nvfp4
  toolbox engine bench --output-tokens 32 --batch-sizes 1,8    # a quick run
  toolbox engine bench --model tiny --device cpu --output-tokens 4 --batch-sizes 1,2 --out-dir /tmp/bench
""",
)
@click.option("--model", type=click.Choice(["full", "tiny"]), default="full", show_default=True, help="Preset architecture (seeded random weights).")
@click.option("--device", default="cuda", show_default=True, help="cuda, cuda:N or cpu.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32", "float16"]), default=None, help="Activation dtype; default bfloat16 on cuda, float32 on cpu.")
@click.option("--quantize", type=click.Choice(["nvfp4", "none"]), default="nvfp4", show_default=True, help="Linears and experts in NVFP4 or dense.")
@click.option("--lm-head", type=click.Choice(["bf16", "nvfp4"]), default="bf16", show_default=True, help="Precision of the LM head.")
@click.option("--kernels", type=click.Choice(["triton", "torch"]), default="triton", show_default=True,
              help="Decode ops: Triton kernels where they exist (CUDA; falls back to torch if they fail the gate), or torch only.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=1024, show_default=True, help="Prompt of the TTFT and TPOT runs.")
@click.option("--batch-prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Prompt of each sequence in the throughput runs.")
@click.option("--output-tokens", type=click.IntRange(min=2), default=256, show_default=True, help="Tokens generated per sequence (ignore_eos).")
@click.option("--batch-sizes", default="1,8,32,64", show_default=True, callback=_batch_sizes, help="Comma-separated batch sizes of the throughput runs.")
@click.option("--gate-prompts", type=click.IntRange(min=1), default=16, show_default=True, help="Prompts in the accuracy gate (16: enough decode rows for its top-1 bound).")
@click.option("--gate-steps", type=click.IntRange(min=2), default=8, show_default=True, help="Decode steps compared per gate prompt.")
@click.option("--peer/--no-peer", default=True, show_default=True, help="Measure transformers on the same weights.")
@click.option("--peer-decode-tokens", type=click.IntRange(min=1), default=4, show_default=True, help="Timed peer decode steps.")
@click.option("--profile/--no-profile", default=True, show_default=True, help="Per-kernel breakdown of one decode step.")
@click.option("--out-dir", default="benchmarks/results", show_default=True, help="Where the JSON and Markdown go.")
@click.option("--name", default=None, help="File stem; default <date>-<device>-<variant>.")
@click.option("--commit", default=None, help="Commit to record (default: git rev-parse HEAD, or 'unknown').")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def bench_command(model, device, dtype, quantize, lm_head, kernels, prompt_tokens, batch_prompt_tokens, output_tokens, batch_sizes, gate_prompts,
                  gate_steps, peer, peer_decode_tokens, profile, out_dir, name, commit, seed) -> None:
    """Benchmark the engine: accuracy gate first, then TTFT, TPOT and tokens/s against floors and a peer."""
    from reference_engine.bench.run import BenchOptions, GateFailed, run_bench

    options = BenchOptions(
        model=model, device=device, dtype=dtype or ("bfloat16" if device.startswith("cuda") else "float32"),
        quantize=None if quantize == "none" else quantize, lm_head=lm_head, kernels=kernels, prompt_tokens=prompt_tokens,
        batch_prompt_tokens=batch_prompt_tokens, output_tokens=output_tokens, batch_sizes=batch_sizes, gate_prompts=gate_prompts,
        gate_steps=gate_steps, peer=peer, peer_decode_tokens=peer_decode_tokens, profile=profile, out_dir=out_dir, seed=seed,
        commit=commit, name=name,
    )  # fmt: skip
    try:
        document = run_bench(options, log=lambda line: click.echo(line, err=True))
    except GateFailed as failure:
        click.echo(f"accuracy gate failed, no speed reported: {failure}", err=True)
        sys.exit(1)
    except _USER_ERRORS as error:
        raise click.ClickException(str(error).strip("'\"")) from None
    from reference_engine.bench.report import markdown

    click.echo(markdown(document))
