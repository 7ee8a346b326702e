"""The text of a request's growing output, decoded incrementally where that gives the same string.

Decoding a request's whole output every step costs O(n) per token, O(n^2) per request. The engine builds
every running request's output each step, so this bookkeeping grew with the output length. On the CPU
(tiny model, 512 tokens) it went from 42 to 88 us a step at batch 1 and from 114 to 519 us at batch 8,
between the 50th and the 500th token.

A byte-level BPE decoder (the `tokenizers` ByteLevel decoder, the one Qwen's tokenizer.json names) maps each token
to bytes on its own. It then decodes their concatenation as UTF-8, replacing invalid bytes. Split the token list
after a complete character and decode(ids[:k]) + decode(ids[k:]) == decode(ids), because UTF-8 decoding restarts at
every character boundary. `IncrementalText` therefore keeps the text up to the last boundary it has seen, that is a
decoded piece not ending in U+FFFD, and decodes only the tokens after it. Other decoders are decoded whole every time:
a Strip, Metaspace or Replace step may change how a piece begins.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"  # what a UTF-8 decoder puts for bytes that do not (yet) form a character


class IncrementalText:
    """`text(ids)` == `tokenizer.decode(ids)` for a list that only grows (a shorter one starts over)."""

    def __init__(self, tokenizer) -> None:
        self._decode = tokenizer.decode
        self.incremental = bool(getattr(tokenizer, "byte_level_decoder", False))
        self._done = 0  # tokens whose text is final: decode(ids[:_done]) == _text
        self._text = ""
        self.last_decoded = 0  # tokens the last call decoded (tests: the incremental path decodes few)

    def text(self, ids: Sequence[int]) -> str:
        if not self.incremental:
            self.last_decoded = len(ids)
            return self._decode(ids)
        if len(ids) < self._done:  # the list was cut back: start over
            self._done, self._text = 0, ""
        tail = self._decode(ids[self._done :])
        self.last_decoded = len(ids) - self._done
        text = self._text + tail
        if not tail.endswith(REPLACEMENT):  # the tail ends on a complete character: its text is final
            self._done, self._text = len(ids), text
        return text
