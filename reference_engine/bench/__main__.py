"""`python -m reference_engine.bench OUT_DIR COMMIT [options]`: the bench without the toolbox CLI (for machines without click).

Options mirror `toolbox engine bench`: --model, --device, --dtype, --lm-head, --quantize, --prompt-tokens,
--batch-prompt-tokens, --output-tokens, --batch-sizes 1,8, --no-peer, --no-profile, --seed. Exit 1 when
the accuracy gate fails (no speed reported), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from reference_engine.bench.report import markdown
from reference_engine.bench.run import BenchOptions, GateFailed, run_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_engine.bench")
    parser.add_argument("out_dir")
    parser.add_argument("commit")
    parser.add_argument("--model", default="full", choices=["full", "tiny"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--dtype", default=None, choices=["bfloat16", "float32", "float16"]
    )
    parser.add_argument("--quantize", default="nvfp4", choices=["nvfp4", "none"])
    parser.add_argument("--lm-head", default="bf16", choices=["bf16", "nvfp4"])
    parser.add_argument("--kernels", default="triton", choices=["triton", "torch"])
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--batch-prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        options = BenchOptions(
            model=args.model, device=args.device, dtype=args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"),
            quantize=None if args.quantize == "none" else args.quantize, lm_head=args.lm_head, kernels=args.kernels, prompt_tokens=args.prompt_tokens,
            batch_prompt_tokens=args.batch_prompt_tokens, output_tokens=args.output_tokens,
            batch_sizes=tuple(int(part) for part in args.batch_sizes.split(",") if part.strip()), peer=not args.no_peer,
            profile=not args.no_profile, out_dir=args.out_dir, seed=args.seed, commit=args.commit,
        )  # fmt: skip
        document = run_bench(
            options, log=lambda line: print(line, file=sys.stderr, flush=True)
        )
    except GateFailed as failure:
        print(f"accuracy gate failed, no speed reported: {failure}", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(markdown(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
