"""The routed experts' prefill launches in Gluon (`kernels/moe_prefill_gluon.py`), the decoded weights as wgmma's
register operand.

Gluon has no interpreter, so on the CPU both kernels are compiled for sm_90 ahead of time (Triton's bundled ptxas) at
the tiles `nvfp4_gemm._gluon_moe` accepts. The compile itself checks that the decoded codes reach wgmma's register
fragment with no data movement (`convert_layout(..., assert_trivial=True)`); the report checks no register spills, no
shared-memory stores (every tile arrives by cp.async, three stages: the activation tile and the packed weight words by
16-byte copies, the block scales by 4-byte copies), two 16-byte shared loads of packed words (and their scales) per
thread, step and weight tile, no decoded tile in shared memory, and eight `wgmma.mma_async` of K 16 per 128-element step
and weight tile (gate/up: two tiles).
The decode's PTX (`_decode_asm`) runs through a small reference interpreter of its six instructions over every pair of
codes at every position and every positive E4M3 scale: exact, and two known-wrong edits of it are caught.
`_gluon_moe` must keep every CPU and interpreter path on the Triton kernels. CUDA: the whole experts op with the Gluon
gate/up launch, with both Gluon launches (one with a register cap) and with the Gluon down launch alone, against the
Triton launches at the real layer (1024 tokens) and at a ragged 37 tokens, outputs NaN-poisoned first; known wrong: the
gate's tensor scale times 4, and the activations left in natural K order, must both miss by far.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

COMPILE_SCRIPT = r'''
import json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from reference_engine.kernels import moe_prefill_gluon as g

ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
common = {"order_ptr": "*i32", "blocks_ptr": "*i32", "words_ptr": "*i32", "scale_words_ptr": "*i32", "scale_2_ptr": "*fp32", "MAX_BLOCKS": "i32"}
gate_up = common | {"x_ptr": "*bf16", "act_ptr": "*bf16", "stride_x": "i32"}
down = common | {"act_ptr": "*bf16", "weights_ptr": "*fp32", "pair_out_ptr": "*fp32"}
configs = []
for tokens in (32, 64):
    for rows in (64, 128):
        # the two classes of a split 64-token table: 32-wide for its blocks of at most 32 tokens, 64-wide for the rest
        tile = {"BLOCK_M": tokens, "BLOCK_N": rows, "STAGES": 3, "TABLE_M": 64, "ROWS_ABOVE": 32 if tokens == 64 else 0, "num_warps": rows // 16}
        configs.append((f"gate_up {tokens}x{rows}", g.moe_gate_up_gluon_kernel, gate_up, {"I": 512, "H_BYTES": 1024, "TOP_K": 8, "PERMUTED_ACT": 1} | tile))
        configs.append((f"down {tokens}x{rows}", g.moe_down_gluon_kernel, down, {"H": 2048, "I_BYTES": 256} | tile))
report = {}
for name, kernel, sig, consts in configs:
    names = [p.name for p in kernel.params]
    aligned = [n for n, t in sig.items() if t.startswith("*") or n == "stride_x"]  # as a real launch specialises them
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    compiled = triton.compile(GluonASTSource(kernel, sig | {k: "constexpr" for k in consts}, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": consts["num_warps"]})
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(ptx)
    info = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", handle.name, "-o", os.devnull], capture_output=True, text=True, check=True).stderr
    os.unlink(handle.name)
    report[name] = {"spill_bytes": int(re.search(r"(\d+) bytes spill stores", info).group(1)), "wgmma": ptx.count("wgmma.mma_async"),
                    "shared_loads": ptx.count("ld.shared"), "shared_stores": ptx.count("st.shared"), "wide_loads": ptx.count("ld.global.v4"),
                    "copies_16": len(re.findall(r"cp\.async\.cg\.shared\.global[^;]*, 0x10;", ptx)),
                    "copies_4": len(re.findall(r"cp\.async\.ca\.shared\.global[^;]*, 0x4;", ptx)), "shared": compiled.metadata.shared}
print("JSON" + json.dumps(report))
'''


def test_gluon_kernels_compile_for_sm90_without_spills():
    from kernel_interpreter import sm90_compile_report

    report = sm90_compile_report(COMPILE_SCRIPT)
    assert sorted(report) == sorted(f"{kind} {tokens}x{rows}" for kind in ("gate_up", "down") for tokens in (32, 64) for rows in (64, 128))
    for name, info in report.items():
        kind, tile = name.split()
        tokens, rows = (int(v) for v in tile.split("x"))
        weight_tiles = 2 if kind == "gate_up" else 1  # gate and up, or down
        assert info["spill_bytes"] == 0, (name, info)
        # the weights pass through shared memory as packed words only: each thread reads back its own two rows' words
        # (one 16-byte load each) and their scales per weight tile; no decoded tile is stored
        assert info["shared_stores"] == 0, (name, info)  # every tile arrives by cp.async
        assert info["shared_loads"] == 4 * weight_tiles, (name, info)
        assert info["wide_loads"] == 0, (name, info)
        assert info["wgmma"] == 8 * weight_tiles, (name, info)  # one 128-element K step: eight K-16 instructions per weight tile
        threads = 32 * rows // 16
        per_step = tokens * 128 * 2 // (16 * threads) + 2 * weight_tiles  # activation tile, then two weight rows per tile
        assert info["copies_16"] == 3 * per_step, (name, info)  # 3 stages: two steps ahead, then one step per iteration
        assert info["copies_4"] == 3 * weight_tiles, (name, info)  # a row's 8 block scales per step: one 4-byte copy per thread
        assert info["shared"] == 3 * (tokens * 128 * 2 + weight_tiles * rows * (64 + 8)), (name, info)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 bits (round to nearest even), as uint32."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def run_ptx(asm: str, operands: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A reference interpreter for the instructions `moe_prefill_gluon._decode_asm` uses (b32 shifts and logic,
    cvt.rn.bf16x2.f32, mul.rn.bf16x2), over uint32 arrays: the PTX's arithmetic checked on the CPU, where Gluon has no
    interpreter."""
    regs = dict(operands)

    def value(token):
        token = token.strip()
        if token in regs:
            return regs[token]
        return np.uint32(int(token, 16) if token.lower().startswith("0x") else int(token))

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        a, b = value(src[0]), value(src[1])
        if op == "shl.b32":
            out = (a.astype(np.uint64) << np.uint64(b)).astype(np.uint32)
        elif op == "shr.b32":
            out = a >> np.uint32(b)
        elif op == "and.b32":
            out = a & b
        elif op == "or.b32":
            out = a | b
        elif op == "cvt.rn.bf16x2.f32":  # d = {bf16(a) high, bf16(b) low}
            out = (_bf16_bits(a.view(np.float32)) << 16) | _bf16_bits(b.view(np.float32))
        elif op == "mul.rn.bf16x2":  # each half: the exact float product, rounded to bfloat16
            low = _bf16_bits(_bf16_values(a & 0xFFFF) * _bf16_values(b & 0xFFFF))
            high = _bf16_bits(_bf16_values(a >> 16) * _bf16_values(b >> 16))
            out = (high << 16) | low
        else:
            raise ValueError(f"instruction {op!r} not modelled")
        regs[dst] = np.asarray(out, dtype=np.uint32)
    return regs


def _decode_mismatches(asm: str) -> int:
    """Run a decode asm over words that hold every pair of codes at every position (random codes elsewhere), against
    every finite positive E4M3 block scale; count the outputs that are not e2m1 * scale * 2^-7 exactly (the epilogue
    multiplies by 2^7)."""
    from reference_engine.kernels.moe_prefill_gluon import SCALE_SHIFT

    rng = np.random.default_rng(0)
    words = []
    for i in range(4):
        for low, high in itertools.product(range(16), repeat=2):
            word = int(rng.integers(0, 2**32))
            word &= ~((0xF << (4 * i)) | (0xF << (4 * i + 16)))
            words.append(word | (low << (4 * i)) | (high << (4 * i + 16)))
    scales = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    word_grid, scale_grid = np.meshgrid(np.array(words, dtype=np.uint32), scales, indexing="ij")
    shifted = (scale_grid * SCALE_SHIFT.value).astype(np.float32).view(np.uint32)  # the kernel passes scale * 2^119 as float32
    operands = {f"${4 + j}": word_grid for j in range(8)} | {f"${12 + j}": shifted for j in range(8)}
    regs = run_ptx(asm, operands)
    table = np.array(E2M1)
    wrong = 0
    for i in range(4):
        for half, code in ((0, i), (1, i + 4)):  # output i holds codes i (low half) and i + 4 (high half)
            got = _bf16_values((regs[f"${i}"] >> (16 * half)) & 0xFFFF)
            expected = table[(word_grid >> (4 * code)) & 0xF] * scale_grid * 2.0**-7
            wrong += int(np.sum((got != expected) | (np.signbit(got) != np.signbit(expected))))
    return wrong


def test_decode_asm_gives_exact_scaled_e2m1_pairs():
    from reference_engine.kernels.moe_prefill_gluon import _decode_asm

    assert _decode_mismatches(_decode_asm()) == 0
    # Known wrong: the sign moved one bit short (bit 14, an exponent bit) must be caught.
    assert _decode_mismatches(_decode_asm().replace("shl.b32 g, t, 6;", "shl.b32 g, t, 5;")) > 0
    # Known wrong: a magnitude mask that drops the mantissa bit must be caught.
    assert _decode_mismatches(_decode_asm().replace("0x01C001C0", "0x01800180")) > 0


def test_permute_steps_moves_each_element_to_its_operand_position():
    from reference_engine.kernels.moe_prefill_gluon import permute_steps

    x = torch.randn(3, 256)
    moved = permute_steps(x)
    for natural in range(256):
        step, r = divmod(natural, 128)
        c, wl, e0, e2, e1 = r >> 5, (r >> 3) & 3, (r >> 2) & 1, (r >> 1) & 1, r & 1
        assert torch.equal(moved[:, 128 * step + 32 * wl + 16 * e2 + 8 * e1 + 2 * c + e0], x[:, natural])


def test_token_classes_cover_every_block_once():
    from reference_engine.kernels import nvfp4_gemm

    assert nvfp4_gemm._token_classes(nvfp4_gemm.GemmPlan(64, 64, 32, 8, 3, split_m=0)) == [(64, 0)]
    assert nvfp4_gemm._token_classes(nvfp4_gemm.GemmPlan(64, 64, 32, 8, 3, split_m=64)) == [(64, 0)]  # not below block_m: one launch
    classes = nvfp4_gemm._token_classes(nvfp4_gemm.GemmPlan(64, 64, 32, 8, 3, split_m=32))
    assert classes == [(32, 0), (64, 32)]
    for count in range(1, 65):  # `moe_prefill_gluon._takes_block`'s rule: above rows_above, at most the launch's width
        assert sum(rows_above < count <= width for width, rows_above in classes) == 1, count


def test_cpu_and_interpreter_paths_never_take_the_gluon_kernels():
    from reference_engine.kernels import nvfp4_gemm

    x = torch.randn(8, 2048).bfloat16()
    assert nvfp4_gemm.GLUON_GATE_UP == 0 and nvfp4_gemm.GLUON_DOWN == 0  # off unless a tuning file switches them on
    for switch in (0, 1):
        assert not nvfp4_gemm._gluon_moe(x, nvfp4_gemm.GemmPlan(64, 128, 32, 8, 3), False, 2048, switch)  # a CPU tensor
    assert not nvfp4_gemm._gluon_moe(x, nvfp4_gemm.GemmPlan(64, 128, 32, 8, 3, gluon=1), False, 2048, 0)


@pytest.fixture(scope="module")
def real_experts():
    from real_moe_layer import EXPERTS, HIDDEN, INTER, cuda_experts

    return cuda_experts(EXPERTS, HIDDEN, INTER, torch.Generator().manual_seed(0))


LAUNCHES = [  # (block_m, gate/up rows, Gluon gate/up, Gluon down, register cap, split_m)
    (64, 128, True, False, 0, 0), (64, 64, True, False, 0, 0), (32, 128, True, False, 0, 0), (64, 128, True, True, 0, 0), (32, 64, True, True, 0, 0),
    (64, 64, True, True, 168, 0),
    (64, 64, False, True, 0, 0),  # Triton gate/up, Gluon down: the host puts act in step order
    (64, 64, True, True, 0, 32),  # blocks of at most 32 tokens in 32-wide launches, the rest 64-wide
]


@pytest.mark.cuda
@pytest.mark.parametrize(("block_m", "rows", "gate_up", "down", "cap", "split"), LAUNCHES)
@pytest.mark.parametrize("tokens", [1024, 37])
def test_gluon_launches_match_the_triton_launches_on_cuda(tokens, block_m, rows, gate_up, down, cap, split, real_experts, monkeypatch):
    from real_moe_layer import EXPERTS, HIDDEN, INTER, TOP_K

    from reference_engine.kernels import nvfp4_gemm

    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, generator=generator).bfloat16().cuda()
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(tokens)]).int().cuda()
    weights = torch.softmax(torch.randn(tokens, TOP_K, generator=generator), dim=1).cuda()
    outs = []
    for gluon in (0, 1):
        plans = (nvfp4_gemm.GemmPlan(block_m, rows, 32, 8, 3, gluon=gluon if gate_up else 0, max_registers=cap, split_m=split),
                 nvfp4_gemm.GemmPlan(block_m, 128, 32, 8, 3, gluon=gluon if down else 0, max_registers=cap, split_m=split))  # fmt: skip
        assert nvfp4_gemm._gluon_moe(x, plans[0], False, HIDDEN, 0) == bool(gluon and gate_up)
        act_like = torch.empty(8, INTER, dtype=torch.bfloat16, device="cuda")
        assert nvfp4_gemm._gluon_moe(act_like, plans[1], False, INTER, 0) == bool(gluon and down)
        out = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
        nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, real_experts, out, plans=plans)
        outs.append(out)
    assert torch.isfinite(outs[1]).all()
    error = float((outs[1].double() - outs[0].double()).norm() / outs[0].double().norm())
    assert error < 5e-3, error  # the same products; float32 sums in another order, the activation rounded to bf16 after them (test_nvfp4_gemm.BOUNDS)
    # Known wrong, through the same Gluon launches: the gate's tensor scale off by 4 must miss by far.
    scaled = real_experts.gate_up_scale_2 * torch.tensor([4.0, 1.0], device="cuda")
    wrong = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, dataclasses.replace(real_experts, gate_up_scale_2=scaled.contiguous()), wrong, plans=plans)
    assert float((wrong.double() - outs[0].double()).norm() / outs[0].double().norm()) > 5e-2
    # Known wrong: activations left in natural K order (no `permute_steps`) pair the decoded weights with the wrong
    # elements and must miss by far too.
    from reference_engine.kernels import moe_prefill_gluon

    monkeypatch.setattr(moe_prefill_gluon, "permute_steps", lambda t: t.contiguous())
    unpermuted = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, real_experts, unpermuted, plans=plans)
    assert float((unpermuted.double() - outs[0].double()).norm() / outs[0].double().norm()) > 5e-2


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1024, 37])
def test_gluon_gate_up_reads_the_callers_steps_copy_on_cuda(tokens, real_experts):
    """`x_steps` (x already in step order, as the norm before the block writes it) gives the bits of the launch's own
    copy; x_steps in natural order (a copy never permuted) must miss by far, so the launch really reads it. With the
    committed tuning, `moe_prefill_takes_steps` says the 1024-token prefill takes the copy (what the decoder asks)."""
    from real_moe_layer import EXPERTS, HIDDEN, TOP_K

    from reference_engine.kernels import nvfp4_gemm
    from reference_engine.kernels.moe_prefill_gluon import permute_steps

    generator = torch.Generator().manual_seed(tokens + 1)
    x = torch.randn(tokens, HIDDEN, generator=generator).bfloat16().cuda()
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(tokens)]).int().cuda()
    weights = torch.softmax(torch.randn(tokens, TOP_K, generator=generator), dim=1).cuda()
    plans = (nvfp4_gemm.GemmPlan(64, 64, 32, 8, 3, gluon=1, split_m=32), nvfp4_gemm.GemmPlan(64, 128, 32, 8, 3, gluon=1, split_m=32))
    outs = []
    for steps in (None, permute_steps(x), x.clone()):
        out = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
        nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, real_experts, out, plans=plans, x_steps=steps)
        outs.append(out)
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[1], outs[0])
    assert float((outs[2].double() - outs[0].double()).norm() / outs[0].double().norm()) > 5e-2
    if tokens == 1024 and nvfp4_gemm.GLUON_GATE_UP:
        assert nvfp4_gemm.moe_prefill_takes_steps(x, TOP_K, real_experts)
