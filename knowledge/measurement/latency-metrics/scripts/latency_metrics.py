"""Serving latency metrics exactly as NVIDIA AIPerf defines them, from per-request timestamps.

Pure Python, no dependencies. Input: JSON lines, one request each:
  {"start_ns": int, "chunks": [[arrival_ns, "text or null", tokens_in_chunk], ...]}
`tokens_in_chunk` is the number of output tokens the chunk carried (AIPerf counts tokens by
re-tokenising the joined text; an engine that streams token ids can give the count directly).
Chunks with no content (empty string or null) are ignored, as AIPerf ignores them.

Usage:
  python latency_metrics.py requests.jsonl     # summary table (p50/p90/p99, not just means)
  python latency_metrics.py --self-test        # checks the formulas on hand-made requests
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    arrival_ns: int
    text: str | None
    tokens: int


@dataclass(frozen=True)
class Request:
    start_ns: int
    chunks: tuple[Chunk, ...]

    @property
    def content_chunks(self) -> tuple[Chunk, ...]:
        return tuple(c for c in self.chunks if c.text)  # empty or null content does not count


@dataclass(frozen=True)
class RecordMetrics:
    ttft_ms: float | None
    ttst_ms: float | None
    request_latency_ms: float | None
    output_tokens: int
    itl_ms: float | None  # (request_latency - ttft) / (output_tokens - 1)
    per_user_tokens_per_s: float | None  # 1 / itl
    inter_chunk_ms: tuple[float, ...]


def record_metrics(request: Request) -> RecordMetrics:
    chunks = request.content_chunks
    tokens = sum(c.tokens for c in chunks)
    if not chunks:
        return RecordMetrics(None, None, None, 0, None, None, ())
    ttft = (chunks[0].arrival_ns - request.start_ns) / 1e6
    latency = (chunks[-1].arrival_ns - request.start_ns) / 1e6
    ttst = (chunks[1].arrival_ns - chunks[0].arrival_ns) / 1e6 if len(chunks) >= 2 else None
    itl = (latency - ttft) / (tokens - 1) if len(chunks) >= 2 and tokens >= 2 else None
    gaps = tuple((b.arrival_ns - a.arrival_ns) / 1e6 for a, b in itertools.pairwise(chunks))
    per_user = 1e3 / itl if itl else None
    return RecordMetrics(ttft, ttst, latency, tokens, itl, per_user, gaps)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(requests: list[Request]) -> dict[str, object]:
    records = [record_metrics(r) for r in requests]
    valid = [(r, m) for r, m in zip(requests, records) if m.request_latency_ms is not None]
    if not valid:
        raise ValueError("no request produced a non-empty chunk")
    start = min(r.start_ns for r, _ in valid)
    end = max(r.content_chunks[-1].arrival_ns for r, _ in valid)
    duration_s = (end - start) / 1e9
    total_tokens = sum(m.output_tokens for _, m in valid)

    def stats(values: list[float]) -> dict[str, float]:
        values = [v for v in values if v is not None]
        if not values:
            return {}
        return {"mean": sum(values) / len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
                "p99": percentile(values, 99), "min": min(values), "max": max(values), "n": len(values)}

    return {
        "time_to_first_token_ms": stats([m.ttft_ms for _, m in valid]),
        "time_to_second_token_ms": stats([m.ttst_ms for _, m in valid]),
        "inter_token_latency_ms": stats([m.itl_ms for _, m in valid]),
        "inter_chunk_latency_ms": stats([g for _, m in valid for g in m.inter_chunk_ms]),
        "request_latency_ms": stats([m.request_latency_ms for _, m in valid]),
        "output_token_throughput_per_user": stats([m.per_user_tokens_per_s for _, m in valid]),
        "output_token_throughput": total_tokens / duration_s,  # all requests, TTFT included
        "request_throughput": len(valid) / duration_s,
        "benchmark_duration_s": duration_s,
        "request_count": len(valid),
        "error_request_count": len(requests) - len(valid),
    }


def parse(line: str) -> Request:
    data = json.loads(line)
    return Request(int(data["start_ns"]), tuple(Chunk(int(t), text, int(n)) for t, text, n in data["chunks"]))


def self_test() -> list[str]:
    ms = 1_000_000
    failures = []

    def expect(name: str, got, want, tol: float = 1e-9) -> None:
        if got is None or want is None:
            if got is not want:
                failures.append(f"{name}: got {got}, want {want}")
        elif abs(got - want) > tol:
            failures.append(f"{name}: got {got}, want {want}")

    # 1 token per chunk: first at 100 ms, then every 10 ms, 11 tokens -> ITL 10 ms, 100 tokens/s per user.
    steady = Request(0, tuple(Chunk((100 + 10 * i) * ms, "x", 1) for i in range(11)))
    m = record_metrics(steady)
    expect("ttft", m.ttft_ms, 100.0)
    expect("latency", m.request_latency_ms, 200.0)
    expect("itl", m.itl_ms, 10.0)
    expect("per-user tokens/s", m.per_user_tokens_per_s, 100.0)
    # An empty first chunk (role header) is not the first token.
    header = Request(0, (Chunk(5 * ms, "", 0),) + steady.chunks)
    expect("ttft ignores empty chunk", record_metrics(header).ttft_ms, 100.0)
    # Two tokens per chunk (speculative decoding, server bundling): ITL counts tokens, ICL counts chunks.
    bundled = Request(0, tuple(Chunk((100 + 20 * i) * ms, "xy", 2) for i in range(6)))
    b = record_metrics(bundled)
    expect("itl per token with 2-token chunks", b.itl_ms, 100.0 / 11)
    expect("icl per chunk", b.inter_chunk_ms[0], 20.0)
    # One output token: TTFT and latency exist, ITL does not.
    single = Request(0, (Chunk(50 * ms, "x", 1),))
    expect("single-token itl", record_metrics(single).itl_ms, None)
    # Throughput: two overlapping requests (concurrency 2) over 0.3 s of wall clock.
    late = Request(100 * ms, tuple(Chunk((200 + 10 * i) * ms, "x", 1) for i in range(11)))
    summary = summarise([steady, late])
    expect("output token throughput", summary["output_token_throughput"], 22 / 0.3, 1e-6)
    expect("p50 ttft", summary["time_to_first_token_ms"]["p50"], 100.0)
    expect("percentile interpolation", percentile([1.0, 2.0, 3.0, 4.0], 90), 3.7, 1e-12)
    # A wrong ITL (dividing by all output tokens instead of N - 1) must differ, or this test could not fail.
    wrong = (m.request_latency_ms - m.ttft_ms) / m.output_tokens
    if abs(wrong - m.itl_ms) < 1e-6:
        failures.append("the off-by-one ITL variant is indistinguishable: the test cannot fail")
    return failures


def main(argv: list[str]) -> int:
    if argv == ["--self-test"]:
        failures = self_test()
        print("\n".join(failures) or "all formula checks passed")
        return 1 if failures else 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        requests = [parse(line) for line in handle if line.strip()]
    print(json.dumps(summarise(requests), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
