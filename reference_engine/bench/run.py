"""The whole benchmark in one run: environment, ceilings, accuracy gate, our figures, peer, floors, profiles, files.

`run_bench(BenchOptions(...))` returns the JSON document (and writes it with the Markdown summary).
It raises `GateFailed` (holding the gate's numbers, also written to the JSON) before any speed is
measured if the fast path disagrees with the plain path.
"""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from reference_engine.bench.ceilings import measure_ceilings
from reference_engine.bench.floor import decode_floor, prefill_floor, step_bytes
from reference_engine.bench.gate import run_gate
from reference_engine.bench.measure import EngineBench
from reference_engine.bench.report import Row, write_results


@dataclass(frozen=True)
class BenchOptions:
    model: str = "full"  # preset: "full" or "tiny"
    device: str = "cuda"
    dtype: str = "bfloat16"
    quantize: str | None = "nvfp4"
    lm_head: str = "bf16"  # "bf16" or "nvfp4"
    prompt_tokens: int = 1024  # TTFT and TPOT prompt
    batch_prompt_tokens: int = 128  # prompt of each sequence in the throughput runs
    output_tokens: int = 256
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    gate_prompts: int = 16  # 80 clear top-1 rows at full size; 4 gave 20, too few for the top-1 bound (benchmarks/NOTES.md, run28)
    gate_steps: int = 8
    gate_prompt_tokens: int = 64  # longest gate prompt
    kernels: str = "triton"  # "triton": Triton kernels where they exist (CUDA); "torch": the torch static ops only
    ttft_repeats: int = 3
    peer: bool = True
    peer_decode_tokens: int = 4
    profile: bool = True
    out_dir: str = "benchmarks/results"
    seed: int = 0
    commit: str | None = None
    name: str | None = None  # file stem; default <date>-<device>-<variant>

    def validate(self) -> None:
        if self.model not in ("full", "tiny"):
            raise ValueError(f"--model must be 'full' or 'tiny', got {self.model!r}")
        if self.kernels not in ("triton", "torch"):
            raise ValueError(f"--kernels must be 'triton' or 'torch', got {self.kernels!r}")
        if self.lm_head not in ("bf16", "nvfp4"):
            raise ValueError(
                f"--lm-head must be 'bf16' or 'nvfp4', got {self.lm_head!r}"
            )
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"device {self.device!r} was asked for, but this machine has no CUDA device"
            )
        if (
            not self.batch_sizes
            or min(self.batch_sizes) < 1
            or self.output_tokens < 2
            or self.prompt_tokens < 1
        ):
            raise ValueError(
                "batch sizes must be positive, output tokens at least 2, prompt tokens at least 1"
            )


class GateFailed(RuntimeError):
    def __init__(self, document: dict) -> None:
        super().__init__(document["gate"]["message"])
        self.document = document


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(device: torch.device, commit: str | None) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device_name": name,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "flash_linear_attention": _version("flash-linear-attention"),
        "commit": commit or _commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tuning_file": _tuning_file(device),
    }


def _tuning_file(device: torch.device) -> str | None:
    """The kernel tuning file the Triton op set applies on this card (its own or its architecture's), or None."""
    if device.type != "cuda":
        return None
    from reference_engine.kernels.tuning import tuning_path

    path = tuning_path(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    return None if path is None else path.name


def _device_label(device_name: str) -> str:
    match = re.search(
        r"(H100|H200|B200|B300|A100|L40S|GH200|GB200)", device_name.upper()
    )
    return (
        match.group(1).lower()
        if match
        else re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    )


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_bench(options: BenchOptions, log: Callable[[str], None] = print) -> dict:
    options.validate()
    from reference_engine.presets import build_preset
    from reference_engine.tokenizer import load_tokenizer

    device = torch.device(options.device)
    env = environment(device, options.commit)
    variant = f"{options.quantize or 'dense'}-lmhead-{options.lm_head}"
    if options.output_tokens < 256 or tuple(options.batch_sizes) != (1, 8, 32, 64):
        variant += "-quick"
    stem = (
        options.name
        or f"{env['date'][:10]}-{_device_label(env['device_name'])}-{variant}"
    )
    dtype = {
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
        "float16": torch.float16,
    }[options.dtype]
    log(
        f"building the {options.model} model ({options.quantize or 'dense'} linears, LM head {options.lm_head}) on {device}"
    )
    model = build_preset(
        options.model,
        device=device,
        dtype=dtype,
        seed=options.seed,
        quantize=options.quantize,
        lm_head_quantize=options.lm_head == "nvfp4" and options.quantize is not None,
    )
    tokenizer = load_tokenizer(options.model)
    fast_mode = "graphs" if device.type == "cuda" else "static"
    document: dict = {
        "name": stem, "environment": env, "options": {**asdict(options), "batch_sizes": list(options.batch_sizes)},
        "model": {"preset": options.model, "quantize": options.quantize or "dense", "lm_head": options.lm_head, "dtype": options.dtype,
                  "weight_bytes_held": model.nbytes()},
    }  # fmt: skip

    use_triton = options.kernels == "triton"
    log("accuracy gate: fast path vs plain path")
    gate = run_gate(
        model,
        tokenizer,
        fast_mode,
        num_prompts=options.gate_prompts,
        decode_steps=options.gate_steps,
        seed=options.seed,
        max_prompt_tokens=options.gate_prompt_tokens,
        use_triton=use_triton,
    )
    document["gate"] = gate.as_dict()
    log(gate.message)
    if not gate.passed and use_triton and device.type == "cuda":
        # the Triton kernels disagree with the plain path: record it, then judge the torch static ops alone
        document["gate_with_triton_kernels"] = gate.as_dict()
        log("the gate failed with the Triton kernels; trying the torch ops alone")
        use_triton = False
        gate = run_gate(model, tokenizer, fast_mode, num_prompts=options.gate_prompts, decode_steps=options.gate_steps, seed=options.seed,
                        max_prompt_tokens=options.gate_prompt_tokens, use_triton=False)  # fmt: skip
        document["gate"] = gate.as_dict()
        log(gate.message)
    if not gate.passed:
        write_results(
            {
                **document,
                "table": [],
                "ceilings": {
                    "copy_bandwidth": float("nan"),
                    "matmul_rate": float("nan"),
                    "matmul_dtype": "-",
                },
            },
            options.out_dir,
            stem + "-gate-failed",
        )
        raise GateFailed(document)
    _free(device)

    log("ceilings: copy bandwidth and matrix rate")
    ceilings = measure_ceilings(device)
    document["ceilings"] = asdict(ceilings)
    log(
        f"copy {ceilings.copy_bandwidth / 1e12:.3f} TB/s, matrix {ceilings.matmul_rate / 1e12:.1f} TFLOP/s"
    )

    generator = torch.Generator().manual_seed(options.seed + 1)
    prompt = torch.randint(
        1, model.config.vocab_size, (options.prompt_tokens,), generator=generator
    ).tolist()

    def save(partial: bool) -> None:
        document["partial"] = partial
        document["table"] = [
            row.as_dict()
            for row in _rows(
                model.config, options, ceilings, document["ours"], document.get("peer")
            )
        ]
        document["floors"] = _floor_details(model.config, options)
        json_path, md_path = write_results(document, options.out_dir, stem)
        log(f"wrote {json_path} and {md_path}" + (" (partial)" if partial else ""))

    log(
        f"our engine ({fast_mode}): TTFT and TPOT at {options.prompt_tokens} prompt tokens"
    )
    bench = EngineBench(model, tokenizer, fast_mode, options.prompt_tokens, options.batch_prompt_tokens, options.output_tokens,
                        max(options.batch_sizes), seed=options.seed, use_triton=use_triton)  # fmt: skip
    ours: dict = {"throughput": {}}
    document["ours"] = ours
    ours["ttft"], our_logits = bench.ttft(prompt, repeats=options.ttft_repeats)
    ours["tpot"] = bench.tpot(prompt)
    ours["decode_mode"] = bench.decode_mode()
    ours["prefill_mode"] = bench.prefill_mode()
    save(partial=True)

    for batch in options.batch_sizes:
        log(f"our engine: output tokens/s at batch {batch}")
        ours["throughput"][str(batch)] = bench.throughput(batch)
        ours["decode_mode"] = bench.decode_mode()
        save(partial=options.peer or options.profile or batch != options.batch_sizes[-1])
    del bench
    _free(device)
    if options.peer:
        _measure_peer(model, dtype, prompt, our_logits, options, document, log)
        save(partial=options.profile)

    # The profiles come last: once torch.profiler has traced CUDA activity in a process, later launches and
    # graph replays pay for it (measured on the H200: TTFT 103 ms before any profile, 135-230 ms after one;
    # the batch-1 step 2.57 ms vs 2.93 ms with the same graph time), so no timed figure may follow them.
    if options.profile:
        log("profiling one decode step (static path, eager)")
        from reference_engine.bench.profile import profile_decode_step

        document["profile"] = profile_decode_step(
            model,
            tokenizer,
            batch=1,
            context_tokens=min(options.prompt_tokens, 256),
            seed=options.seed,
            use_triton=use_triton,
        )
        if 32 in options.batch_sizes:  # the throughput target's batch: where its step's time goes
            log("profiling one decode step at batch 32 (static path, eager)")
            document["profile_b32"] = profile_decode_step(model, tokenizer, batch=32, context_tokens=min(options.batch_prompt_tokens, 256),
                                                          seed=options.seed, use_triton=use_triton)  # fmt: skip
        log(f"profiling one prefill of {options.prompt_tokens} tokens (eager)")
        from reference_engine.bench.profile import profile_prefill

        document["profile_prefill"] = profile_prefill(model, tokenizer, prompt_tokens=options.prompt_tokens, seed=options.seed)
        _free(device)
        save(partial=False)

    return document


def _measure_peer(model, dtype: torch.dtype, prompt: list[int], our_logits: torch.Tensor, options: BenchOptions,
                  document: dict, log: Callable[[str], None]) -> None:  # fmt: skip
    """Build the peer on our device with our weights parked on the host (both do not fit an 80 GB card), time it,
    drop it, bring our weights back; record its figures and its agreement with our TTFT logits in `document`."""
    from reference_engine.bench.offload import weights_parked_on_host
    from reference_engine.bench.peer import build_peer, measure_peer

    device = model.device
    log("peer: transformers Qwen3_5MoeForCausalLM on the same (dequantised) weights")
    with weights_parked_on_host(model) as parked:
        if parked is not None:
            log(f"our weights parked on the host while the peer runs: {parked.bytes / 1e9:.1f} GB in {parked.storages} storages")
        peer_model = build_peer(model, dtype, device)
        peer, peer_logits = measure_peer(peer_model, prompt, decode_tokens=options.peer_decode_tokens)
        del peer_model
        _free(device)
    document["peer"] = peer.as_dict()
    log(peer.note)
    reference, candidate = peer_logits.double(), our_logits.double()
    log_ref, log_got = torch.log_softmax(reference, -1), torch.log_softmax(candidate, -1)
    document["peer_agreement"] = {
        "kl": float((log_ref.exp() * (log_ref - log_got)).sum()),
        "same_top1": bool(reference.argmax() == candidate.argmax()),
    }


def _rows(
    config, options: BenchOptions, ceilings, ours: dict, peer: dict | None
) -> list[Row]:
    bandwidth, rate = ceilings.copy_bandwidth, ceilings.matmul_rate
    linears = "nvfp4" if options.quantize else "bf16"
    ttft_floor = prefill_floor(
        config, options.prompt_tokens, bandwidth, rate, linears, options.lm_head
    )
    tpot_floor = decode_floor(
        config,
        1,
        options.prompt_tokens + options.output_tokens // 2,
        bandwidth,
        rate,
        linears,
        options.lm_head,
    )
    rows = []
    if "ttft" in ours:
        rows.append(Row(f"TTFT, {options.prompt_tokens} prompt tokens", "ms", 1e3 * ours["ttft"]["seconds"], 1e3 * ttft_floor.seconds,
                        1e3 * peer["ttft_seconds"] if peer else None))  # fmt: skip
    if "tpot" in ours:
        rows.append(
            Row(
                "TPOT, batch 1",
                "ms",
                1e3 * ours["tpot"]["seconds"],
                1e3 * tpot_floor.seconds,
                1e3 * peer["tpot_seconds"] if peer else None,
            )
        )
        for key, figure in (("async_engine_step_seconds", "TPOT, batch 1, async engine step"),  # what `LLM` gives
                            ("sampled_engine_step_seconds", "TPOT, batch 1, sampled, engine step"),
                            ("async_sampled_engine_step_seconds", "TPOT, batch 1, sampled, async engine step")):
            if ours["tpot"].get(key):
                rows.append(Row(figure, "ms", 1e3 * ours["tpot"][key], 1e3 * tpot_floor.seconds, 1e3 * peer["tpot_seconds"] if peer else None))  # fmt: skip
    for batch in options.batch_sizes:
        figures = ours["throughput"].get(str(batch))
        if figures is None:
            continue
        floor = decode_floor(
            config,
            batch,
            options.batch_prompt_tokens + options.output_tokens // 2,
            bandwidth,
            rate,
            linears,
            options.lm_head,
        )
        peer_rate = 1.0 / peer["tpot_seconds"] if (peer and batch == 1) else None
        rows.append(
            Row(
                f"output tokens/s, batch {batch}",
                "tok/s",
                figures["tokens_per_second"],
                batch / floor.seconds,
                peer_rate,
            )
        )
        if figures.get("async_tokens_per_second"):
            rows.append(Row(f"output tokens/s, batch {batch}, async engine", "tok/s", figures["async_tokens_per_second"], batch / floor.seconds,
                            peer_rate))  # fmt: skip
    return rows


def _floor_details(config, options: BenchOptions) -> dict:
    linears = "nvfp4" if options.quantize else "bf16"
    details = {}
    for batch in options.batch_sizes:
        context = options.batch_prompt_tokens + options.output_tokens // 2
        moved = step_bytes(config, batch, context, 1, linears, options.lm_head)
        details[f"decode_batch_{batch}"] = {
            **asdict(moved),
            "total": moved.total,
            "context_tokens": context,
        }
    return details
