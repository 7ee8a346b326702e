"""Check a streamed /v1/chat/completions or /v1/completions response body against the rules of ../SKILL.md.

Usage:
    curl -sN http://localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \
         -d '{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": true,
              "stream_options": {"include_usage": true}, "max_tokens": 8}' > body.txt
    python check_sse_stream.py body.txt --include-usage        # prints problems, exit 1 if any
    python check_sse_stream.py --self-test                     # a good stream passes, bad ones fail

Rules checked: every event is `data: <payload>` followed by a blank line; the last event is
`data: [DONE]`; every other payload is a JSON chunk with the same `id`, `created` and `model`,
`object` "chat.completion.chunk" (or "text_completion"); each choice index ends exactly once
with a non-null `finish_reason` in {stop, length, tool_calls, content_filter}, and sends nothing
after that; chat deltas carry `role` "assistant" in a choice's first delta only; with
include_usage, exactly one chunk with empty `choices` and a `usage` object (prompt_tokens +
completion_tokens == total_tokens) comes last before [DONE], and earlier chunks have usage null.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter"}


def check_stream(body: str, include_usage: bool = False) -> list[str]:
    problems: list[str] = []
    if not body.endswith("\n\n"):
        problems.append("the body does not end with a blank line after the last event")
    events = [e for e in body.split("\n\n") if e.strip()]
    payloads = []
    for number, event in enumerate(events):
        lines = event.split("\n")
        data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
        if len(data) != 1 or any(not line.startswith(("data: ", ":")) for line in lines):
            problems.append(f"event {number}: expected one `data: ` line, got {event[:60]!r}")
            continue
        payloads.append(data[0])
    if not payloads or payloads[-1] != "[DONE]":
        problems.append("the stream does not end with `data: [DONE]`")
    chunks = []
    for number, payload in enumerate(payloads[:-1] if payloads and payloads[-1] == "[DONE]" else payloads):
        if payload == "[DONE]":
            problems.append(f"event {number}: [DONE] before the end")
            continue
        try:
            chunks.append(json.loads(payload))
        except json.JSONDecodeError as error:
            problems.append(f"event {number}: not JSON ({error.msg})")
    if not chunks:
        return problems + ["no JSON chunks"]
    first = chunks[0]
    finished: set[int] = set()
    role_seen: set[int] = set()
    usage_chunks = [i for i, c in enumerate(chunks) if c.get("choices") == [] and c.get("usage")]
    for number, chunk in enumerate(chunks):
        for key in ("id", "created", "model"):
            if chunk.get(key) != first.get(key):
                problems.append(f"chunk {number}: `{key}` {chunk.get(key)!r} differs from the first chunk's")
        if chunk.get("object") not in ("chat.completion.chunk", "text_completion"):
            problems.append(f"chunk {number}: object {chunk.get('object')!r}")
        if include_usage and number not in usage_chunks and chunk.get("usage") is not None:
            problems.append(f"chunk {number}: usage must be null before the final usage chunk")
        for choice in chunk.get("choices", []):
            index = choice.get("index")
            if index in finished:
                problems.append(f"chunk {number}: choice {index} continues after its finish_reason")
            delta = choice.get("delta")
            if delta is not None and "role" in delta:
                if index in role_seen or delta["role"] != "assistant":
                    problems.append(f"chunk {number}: role {delta['role']!r} repeated or not 'assistant'")
                role_seen.add(index)
            reason = choice.get("finish_reason")
            if reason is not None:
                if reason not in FINISH_REASONS:
                    problems.append(f"chunk {number}: finish_reason {reason!r} is not an OpenAI value")
                finished.add(index)
    indices = {c.get("index") for chunk in chunks for c in chunk.get("choices", [])}
    for index in sorted(indices - finished, key=str):
        problems.append(f"choice {index} never sent a finish_reason")
    if include_usage:
        if usage_chunks != [len(chunks) - 1]:
            problems.append(f"expected exactly one usage chunk, last before [DONE]; found at {usage_chunks}")
        else:
            usage = chunks[-1]["usage"]
            if usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0) != usage.get("total_tokens"):
                problems.append(f"usage does not add up: {usage}")
    elif usage_chunks:
        problems.append("a usage chunk was sent although stream_options.include_usage was not set")
    return problems


def _event(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n"


def _sample(bad: str | None = None) -> str:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "usage": None}
    pieces = [dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for text in ("Hel", "lo"):
        pieces.append(dict(head, choices=[{"index": 0, "delta": {"content": text}, "finish_reason": None}]))
    pieces.append(dict(head, choices=[{"index": 0, "delta": {}, "finish_reason": "eos" if bad == "reason" else "length"}]))
    pieces.append(dict(head, choices=[], usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}))
    if bad == "id":
        pieces[2] = dict(pieces[2], id="chatcmpl-2")
    if bad == "role-twice":
        pieces[1]["choices"][0]["delta"]["role"] = "assistant"
    body = "".join(_event(p) for p in pieces)
    return body if bad == "no-done" else body + _event("[DONE]")


def self_test() -> None:
    assert check_stream(_sample(), include_usage=True) == [], check_stream(_sample(), include_usage=True)
    for bad in ("reason", "id", "role-twice", "no-done"):
        assert check_stream(_sample(bad), include_usage=True), f"the checker missed a {bad} defect"
    assert check_stream(_sample(), include_usage=False), "usage chunk without include_usage not caught"
    print("self-test: a well-formed stream passes; wrong finish_reason, changing id, repeated role, "
          "missing [DONE] and an unrequested usage chunk are caught")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("body", nargs="?", help="file holding the raw response body")
    parser.add_argument("--include-usage", action="store_true")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test or not args.body:
        self_test()
        sys.exit(0)
    found = check_stream(Path(args.body).read_text(encoding="utf-8"), args.include_usage)
    print("\n".join(found) if found else "ok")
    sys.exit(1 if found else 0)
