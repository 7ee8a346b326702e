"""The engine benchmark: accuracy gate first, then ceilings, latency and throughput against floors and a peer.

One concern per module: `floor` (pure arithmetic: bytes and FLOPs a step must move), `ceilings`
(copy bandwidth and matrix rate measured in the same run), `gate` (fast path vs plain path),
`measure` (TTFT, TPOT, output tokens/s of this engine), `peer` (Hugging Face transformers on the
same weights), `profile` (per-kernel time of one decode step), `report` (JSON and Markdown),
`run` (the whole pipeline). The CLI is `toolbox engine bench`.
"""
