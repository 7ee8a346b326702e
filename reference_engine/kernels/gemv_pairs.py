"""x handed to the batch-1 GEMV as float16 pairs by the kernel that wrote x (no launch added).

Every program of the packed-float16 GEMV (`nvfp4_half_dot._w4a16_gemv_half_kernel`) converts the same bfloat16 x into
the block dot's float16 pairs: about 30% of a thread's instructions in the GDN in_proj tile (offline sm_90 SASS,
benchmarks/NOTES.md, twenty-ninth session). With `X_PAIRS` 1 or 2 (tuning key `gemv_x_pairs`; the kernel's two load
forms) the kernels that write the batch-1 GEMVs' inputs write them once more in both pair orders (plain and E4M3, 4 KB
each at width 2048): the RMSNorm before a mixer (`norms.rms_norm(pairs_out=, pairs_fp8=None)`) for its input
projection, the Gated DeltaNet step (`gdn_decode_step(pairs_out=)`) for out_proj and the gated paged decode
(`paged_decode_gated(pairs_out=)`) for o_proj. Each GEMV reads the pairs in its own order.

The hand-over is scoped: `given(x, pairs)` holds for the duration of a `with` block (the decoder wraps the mixer call
in it, the mixers their output projection) and `lookup` answers only for a GEMV input at x's address with x's shape
while x is unmodified by torch (an in-place torch op bumps x's version counter; inference tensors, as in the engine's
decode, keep none, so there the scope alone guards it: the consumers only read x). Outside any block, or for another
tensor, the GEMV converts x itself, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

X_PAIRS = 0  # 0 off; 1 or 2: the GEMV's pair load form (`nvfp4_half_dot._half_rows_dot`), tuning key `gemv_x_pairs`


@dataclass(frozen=True, eq=False)  # compared by identity (scopes nest: the mixer's input, then out_proj's)
class PairsTwin:
    source: torch.Tensor  # bfloat16 [1, K]
    pairs: torch.Tensor  # int32 [1, 2, K / 2]: plain order, then the E4M3 order
    version: int | None  # source._version when handed over (None for an inference tensor: it keeps no counter)


_ACTIVE: list[PairsTwin] = []


def pairs_buffer(x: torch.Tensor) -> torch.Tensor:
    """An int32 [T, 2, K / 2] buffer for both pair orders of x [T, K]."""
    return torch.empty((*x.shape[:-1], 2, x.shape[-1] // 2), dtype=torch.int32, device=x.device)


def check_pairs_out(pairs_out: torch.Tensor, out: torch.Tensor, block_width: int, both: bool = True) -> None:
    """ValueError unless `pairs_out` is contiguous int32 [..., 2, K / 2] (both orders; [..., K / 2] for one) on out's
    device, `out` [..., K] is contiguous bfloat16, and the columns one producer program writes (`block_width`: a row, a
    head) hold whole 16-element blocks."""
    expected = (*out.shape[:-1], *((2,) if both else ()), out.shape[-1] // 2)
    if out.dtype != torch.bfloat16 or not out.is_contiguous() or block_width % 16 or pairs_out.dtype != torch.int32 \
            or tuple(pairs_out.shape) != expected or not pairs_out.is_contiguous() or pairs_out.device != out.device:
        raise ValueError(f"pairs_out must be contiguous int32 {list(expected)} on {out.device} for a contiguous bfloat16 out whose "
                         f"{block_width}-column blocks are multiples of 16, got {pairs_out.dtype} {list(pairs_out.shape)} on "
                         f"{pairs_out.device} for {out.dtype} {list(out.shape)} (contiguous: {out.is_contiguous()})")  # fmt: skip


def applies(x: torch.Tensor) -> bool:
    """Whether pairs would be used for x: the setting is on and x is one contiguous bfloat16 token of whole blocks."""
    return bool(X_PAIRS) and x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.bfloat16 and x.shape[1] % 16 == 0 and x.is_contiguous()


def _version(tensor: torch.Tensor) -> int | None:
    return None if tensor.is_inference() else tensor._version


@contextlib.contextmanager
def given(source: torch.Tensor, pairs: torch.Tensor) -> Iterator[None]:
    """Within the block, a GEMV whose input is `source` reads `pairs` (written by the producer of `source`)."""
    check_pairs_out(pairs, source, source.shape[-1])
    twin = PairsTwin(source, pairs, _version(source))
    _ACTIVE.append(twin)
    try:
        yield
    finally:
        _ACTIVE.remove(twin)


def lookup(x2d: torch.Tensor, fp8: bool) -> torch.Tensor | None:
    """int32 [1, K / 2] pairs of x2d in the order `fp8` selects, or None (the GEMV converts x itself)."""
    if not X_PAIRS:
        return None
    for twin in reversed(_ACTIVE):
        source = twin.source
        if x2d.data_ptr() == source.data_ptr() and x2d.shape == source.shape and x2d.dtype == source.dtype and _version(source) == twin.version:
            return twin.pairs[:, int(fp8)]
    return None
