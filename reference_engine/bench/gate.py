"""Accuracy gate: the fast decode path against the plain torch path on the same weights, same tokens.

float32 models: one scheduler drives two runners (`TwinRunner`): the plain eager runner, whose
sampled tokens are committed, and the fast runner (CUDA graphs, or the static path on the CPU),
teacher-forced on those tokens with its own caches. Every decode step's logits are compared row by
row: KL(plain || fast) in nats and top-1 agreement counted where the plain path's two best logits
differ by more than a margin; the same metric definitions as the model/logits contract, and the
same bounds per dtype.

16-bit models: two 16-bit paths that round in different places drift apart over 40 layers of a
random-weight model by more than either drifts from exact arithmetic, so comparing them with each
other measures rounding, not correctness. The reference is then the model's float32 twin
(`model/cast.py`: the same NVFP4 weights, float32 activations) run eagerly and committing the tokens;
the plain 16-bit path and the fast path are both teacher-forced and both measured against it. The
fast path passes when it is no worse than the plain path, with slack: KL mean <= 2 x plain + 1e-3,
KL max <= 2 x plain + 1e-2, top-1 agreement >= plain - 0.1 (the per-dtype absolute bounds, written
for small models, would fail a fast path exactly as good as the plain one at full size). The top-1 bound needs rows:
on 20 clear rows its standard error is about 0.1, the slack itself (the bench runs 16 prompts: 80 rows). A wrong kernel (a wrong scale, a missing gate, a wrong cache row) moves the fast path far
from the reference and fails; the plain path's own distance is reported beside it.
A benchmark refuses to report speed when the gate fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import torch

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.runner import ModelRunner
from reference_engine.sampling_params import SamplingParams

# (mean KL bound, max KL bound, minimum top-1 agreement, top-1 margin) per activation dtype
GATE_BOUNDS = {
    "float32": (1e-8, 1e-7, 1.0, 1e-3),
    "bfloat16": (3e-2, 0.3, 0.75, 0.1),
    "float16": (1e-3, 1e-2, 0.95, 0.05),
}


@dataclass(frozen=True)
class GateResult:
    passed: bool
    kl_mean: float
    kl_max: float
    top1_agreement: float
    positions: int  # decode rows compared
    counted_for_top1: int  # rows whose reference margin is clear
    bounds: dict
    fast_mode: str
    message: str
    reference: str = "plain path"  # what both were measured against
    plain: dict | None = None  # 16-bit models: the plain path's own KL mean / max / top-1 against the float32 reference

    def as_dict(self) -> dict:
        return asdict(self)


class TripleRunner:
    """The float32 reference runner commits the tokens; the plain and the fast 16-bit runners follow them."""

    def __init__(self, reference: ModelRunner, plain: ModelRunner, fast: ModelRunner) -> None:
        self.reference, self.plain, self.fast = reference, plain, fast
        self.plain_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def execute(self, plan, rows):
        tokens, logprobs = self.reference.execute(plan, rows)
        self.plain.execute(plan, rows)
        self.fast.execute(plan, rows)
        if plan.is_decode:
            reference = self.reference.last_logits.detach().to("cpu", torch.float64)
            self.plain_pairs.append((reference, self.plain.last_logits.detach().to("cpu", torch.float64)))
            self.pairs.append((reference, self.fast.last_logits.detach().to("cpu", torch.float64)))
        return tokens, logprobs


class TwinRunner:
    """Runs each plan on the plain runner (its tokens count) and on the fast one; keeps the decode logits of both."""

    def __init__(self, plain: ModelRunner, fast: ModelRunner) -> None:
        self.plain, self.fast = plain, fast
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def execute(self, plan, rows):
        tokens, logprobs = self.plain.execute(plan, rows)
        self.fast.execute(plan, rows)
        if plan.is_decode:
            self.pairs.append(
                (
                    self.plain.last_logits.detach().to("cpu", torch.float64),
                    self.fast.last_logits.detach().to("cpu", torch.float64),
                )
            )
        return tokens, logprobs


def compare_logits(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    bounds: tuple[float, float, float, float],
) -> tuple[float, float, float, int, int]:
    """(KL mean, KL max, top-1 agreement, positions, counted) over the rows of (reference, candidate) pairs."""
    kls, agree, counted, positions = [], 0, 0, 0
    for reference, candidate in pairs:
        if not torch.isfinite(candidate).all():
            return float("inf"), float("inf"), 0.0, reference.shape[0], 0
        log_ref, log_got = (
            torch.log_softmax(reference, -1),
            torch.log_softmax(candidate, -1),
        )
        kls.append((log_ref.exp() * (log_ref - log_got)).sum(-1))
        top2 = reference.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > bounds[3]
        agree += int((reference.argmax(-1) == candidate.argmax(-1))[clear].sum())
        counted += int(clear.sum())
        positions += reference.shape[0]
    if not kls:
        raise ValueError("the gate compared no decode step")
    kl = torch.cat(kls)
    return (
        float(kl.mean()),
        float(kl.max()),
        agree / max(counted, 1),
        positions,
        counted,
    )


def run_gate(
    model,
    tokenizer,
    fast_mode: str,
    num_prompts: int = 4,
    decode_steps: int = 8,
    seed: int = 0,
    max_prompt_tokens: int = 64,
    use_triton: bool = True,
) -> GateResult:
    """Greedy decode of `num_prompts` random prompts (16..max_prompt_tokens tokens) on both paths; judged by GATE_BOUNDS."""
    dtype = str(model.dtype).removeprefix("torch.")
    bounds = GATE_BOUNDS[dtype]
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    lengths = torch.randint(min(16, max_prompt_tokens), max_prompt_tokens + 1, (num_prompts,), generator=generator).tolist()
    prompts = [
        torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths
    ]
    block_size = 16
    max_model_len = max(lengths) + decode_steps + 1
    num_blocks = num_prompts * -(-max_model_len // block_size) + 1
    config = EngineConfig(
        device=str(model.device),
        dtype=dtype,
        max_num_seqs=num_prompts,
        max_model_len=max_model_len,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=max(2048, sum(lengths)),
    )
    sixteen_bit = dtype != "float32"
    if sixteen_bit:  # reference: the float32 twin, eager; it commits the tokens
        from reference_engine.model.cast import float32_twin

        twin_model = float32_twin(model)
        engine = LLMEngine(twin_model, tokenizer, dataclasses.replace(config, dtype="float32"), decode_mode="eager", use_triton=False)
        plain = ModelRunner(model, config, num_blocks, decode_mode="eager", use_triton=False)  # the torch path, prefill included
        fast = ModelRunner(model, config, num_blocks, decode_mode=fast_mode, use_triton=use_triton)
        runners = TripleRunner(engine.runner, plain, fast)
    else:
        engine = LLMEngine(model, tokenizer, config, decode_mode="eager", use_triton=False)  # the torch path, prefill included
        fast = ModelRunner(model, config, num_blocks, decode_mode=fast_mode, use_triton=use_triton)
        runners = TwinRunner(engine.runner, fast)
    engine.runner = runners
    for index, prompt in enumerate(prompts):
        engine.add_request(
            f"gate-{index}",
            prompt_token_ids=prompt,
            params=SamplingParams(
                temperature=0, max_tokens=decode_steps + 1, ignore_eos=True
            ),
        )
    while engine.has_unfinished():
        engine.step()
    kl_mean, kl_max, top1, positions, counted = compare_logits(runners.pairs, bounds)
    if fast.decoder is not None and fast.decoder.capture_error:
        fast_mode = f"static (graph capture failed: {fast.decoder.capture_error})"
    elif fast.decoder is not None and fast.decoder.use_graphs:
        fast_mode = f"graphs (buckets captured: {list(fast.decoder.captured_buckets)})"
    if fast.ops is not None:
        kernels = sorted(name for name, backend in fast.ops.backends.items() if backend == "triton")
        fast_mode += f"; Triton kernels: {', '.join(kernels) if kernels else 'none (torch ops)'}"
    mean_bound, max_bound, top1_bound, margin = bounds
    reference, plain_figures = "plain path (eager)", None
    if sixteen_bit:
        plain_mean, plain_max, plain_top1, _, _ = compare_logits(runners.plain_pairs, bounds)
        plain_figures = {"kl_mean": plain_mean, "kl_max": plain_max, "top1_agreement": plain_top1}
        reference = "float32 twin (eager)"
        mean_bound = 2 * plain_mean + 1e-3  # no worse than the plain path, with slack for independent rounding
        max_bound = 2 * plain_max + 1e-2
        top1_bound = plain_top1 - 0.1
    passed = kl_mean <= mean_bound and kl_max <= max_bound and top1 >= top1_bound
    plain_text = (
        f"; the plain {dtype} path against the same reference: KL mean {plain_figures['kl_mean']:.3e}, max {plain_figures['kl_max']:.3e}, "
        f"top-1 {plain_figures['top1_agreement']:.4f}"
        if plain_figures
        else ""
    )
    message = (
        f"gate {'PASSED' if passed else 'FAILED'} ({fast_mode} vs {reference}, {dtype}): KL mean {kl_mean:.3e} (bound {mean_bound:.1e}), "
        f"max {kl_max:.3e} (bound {max_bound:.1e}), top-1 agreement {top1:.4f} (bound {top1_bound:.3g}, margin {margin}) "
        f"over {positions} decode rows ({counted} with a clear top-1){plain_text}"
    )
    bound_names = {
        "kl_mean": mean_bound,
        "kl_max": max_bound,
        "top1_min": top1_bound,
        "top1_margin": margin,
    }
    return GateResult(
        passed,
        kl_mean,
        kl_max,
        top1,
        positions,
        counted,
        bound_names,
        fast_mode,
        message,
        reference,
        plain_figures,
    )
