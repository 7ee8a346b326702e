"""The sampling op's top-k selection path in two Triton launches (`ops.sampling`, rows filtered to few tokens).

`ops.sampling._top_candidates` builds one unique int64 key per token (the scaled logit's float32 bits mapped to an
order-preserving integer in the high word, V - 1 - id in the low word) and selects the C largest with `torch.topk`,
then draws with some twenty more torch ops. On an H100 that costs about 190 us of device time at batch 1 even
replayed from a CUDA graph, mostly the eight radix passes of the int64 selection (run73). Here:

Launch 1, `_chunk_top_kernel`, grid (B, cdiv(V, CHUNK)): each program scales CHUNK logits of its row by the row's
temperature (correctly rounded division, as torch divides; temperature 0 scales by 1), builds the same keys and keeps
their C largest (`tl.topk`, a bitonic selection in registers) in a workspace [B, chunks, C].

Launch 2, `_merge_draw_kernel`, grid (B,): the row's chunks x C keys, padded to a power of two, again reduced to their
C largest, sorted descending: the row's first C tokens in the order of a stable descending sort (keys are unique).
It decodes values and ids from the keys and does what the torch path does on them: ranks >= top_k masked, softmax
(float32), top-p over the float64 running mass (the crossing token kept, at least one token), the float64 CDF, and the
first index whose CDF exceeds `uniform * total`. Greedy rows (temperature 0) take the first candidate, the row's
maximum with the lowest id among ties: the argmax.

Same kept set, same order, same draw rule as the torch path. The arithmetic differs in rounding only (the exponential,
the order of the softmax's sum and of the running sums), so a draw can differ where the uniform lands within a
rounding of a CDF boundary.

Off by default in the module (`FUSED`); the card's tuning file turns it on (`sampling_fused_select`). On an H100 in
CUDA graphs (run75, `benchmarks/time_sampling.py`) it took 43.6 / 77.9 / 189.9 us at batch 1 / 8 / 32 against the torch
selection path's 194.7 / 286.6 / 774.3 us, drawing the same tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import cdiv, next_power_of_2, require_launchable

FUSED = False  # `ops.sampling` takes these launches for the selection path on CUDA (tuning key `sampling_fused_select`)
CHUNK = 4096  # logits per program of launch 1
MAX_CANDIDATES = 128  # the largest C taken here (launch 2 then holds cdiv(V, CHUNK) * C keys: 7,808 at V = 248,320)
MIN_KEY = tl.constexpr(-(2**63))  # below every key of a finite or infinite logit (a constexpr: compiled kernels read no other globals)


@triton.jit
def _chunk_top_kernel(logits_ptr, temperature_ptr, keys_ptr, V, stride_row, chunks, CHUNK: tl.constexpr, C: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = cols < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=ok, other=0.0).to(tl.float32)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    temperature = tl.where(temperature == 0.0, 1.0, temperature)
    scaled = tl.math.div_rn(x, tl.zeros_like(x) + temperature) + 0.0  # -0.0 becomes +0.0, as the sort ties them
    bits = scaled.to(tl.int32, bitcast=True).to(tl.int64)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keys = (ordered << 32) + (V - 1 - cols).to(tl.int64)
    keys = tl.where(ok, keys, MIN_KEY)
    top = tl.topk(keys, C)
    tl.store(keys_ptr + (row.to(tl.int64) * chunks + chunk) * C + tl.arange(0, C), top)


@triton.jit
def _merge_draw_kernel(keys_ptr, temperature_ptr, top_k_ptr, top_p_ptr, uniform_ptr, out_ptr, V, chunks, C: tl.constexpr,
                       MERGE: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    slots = tl.arange(0, MERGE)
    held = chunks * C
    keys = tl.load(keys_ptr + row.to(tl.int64) * held + slots, mask=slots < held, other=MIN_KEY)
    top = tl.topk(keys, C)  # [C], descending
    ids = (V - 1) - (top & 0xFFFFFFFF)
    ordered = top >> 32
    values = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(tl.int32).to(tl.float32, bitcast=True)
    ranks = tl.arange(0, C)
    k = tl.load(top_k_ptr + row).to(tl.int64)
    k = tl.where((k <= 0) | (k >= V), V, k)
    masked = tl.where(ranks < k, values, float("-inf"))
    largest = tl.max(masked, axis=0)
    weights = tl.exp(masked - largest)
    probs = (weights / tl.sum(weights, axis=0)).to(tl.float64)
    mass_before = tl.cumsum(probs, axis=0) - probs
    top_p = tl.load(top_p_ptr + row).to(tl.float64)
    top_p = tl.where(top_p >= 1.0, 2.0, top_p)  # 1 keeps every token: no running mass reaches 2
    keep = (mass_before < top_p) | (ranks == 0)
    cdf = tl.cumsum(tl.where(keep, probs, 0.0), axis=0)
    total = tl.max(cdf, axis=0)  # the last entry: the CDF does not decrease
    target = tl.load(uniform_ptr + row) * total
    index = tl.minimum(tl.sum((cdf <= target).to(tl.int32), axis=0), C - 1)
    drawn = tl.sum(tl.where(ranks == index, ids, 0), axis=0)
    greedy = tl.sum(tl.where(ranks == 0, ids, 0), axis=0)
    temperature = tl.load(temperature_ptr + row)
    tl.store(out_ptr + row, tl.where(temperature == 0.0, greedy, drawn))


def applies(logits: torch.Tensor, candidates: int) -> bool:
    """Whether `select_and_draw` takes these logits with this many candidates."""
    return logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1 and 0 < candidates <= min(MAX_CANDIDATES, logits.shape[1] - 1)


def select_and_draw(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor,
                    out: torch.Tensor, candidates: int, chunk: int | None = None) -> torch.Tensor:  # fmt: skip
    """out [B] int64 = the token `ops.sampling.sample_tokens_unchecked` draws on its selection path, for logits [B, V]
    float32 (rows contiguous), temperature / top_p [B] float32, top_k [B] int32 or int64, uniform [B] float64 (the rows'
    `uniform_from_seeds`), every sampled row keeping 0 < top_k <= candidates. chunk: logits per program of launch 1
    (default `CHUNK`; tests use less)."""
    require_launchable(logits, temperature, top_k, top_p, uniform, out)
    if not applies(logits, candidates):
        raise ValueError(f"select_and_draw takes float32 [B, V] logits with unit column stride and 0 < candidates <= {MAX_CANDIDATES}, "
                         f"got {logits.dtype} {tuple(logits.shape)} stride {tuple(logits.stride())}, candidates {candidates}")  # fmt: skip
    batch, vocab = logits.shape
    width = next_power_of_2(candidates)
    chunk = chunk or CHUNK
    if chunk < width or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two of at least {width}, got {chunk}")
    chunks = cdiv(vocab, chunk)
    keys = torch.empty((batch, chunks, width), dtype=torch.int64, device=logits.device)
    _chunk_top_kernel[(batch, chunks)](logits, temperature, keys, vocab, logits.stride(0), chunks, CHUNK=chunk, C=width, num_warps=8)
    _merge_draw_kernel[(batch,)](keys, temperature, top_k, top_p, uniform, out, vocab, chunks, C=width,
                                 MERGE=next_power_of_2(chunks * width), num_warps=8)  # fmt: skip
    return out
