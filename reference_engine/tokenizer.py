"""Tokenizers: a small deterministic byte-level BPE for the random-weight presets, or a checkpoint's `tokenizer.json`.

The tiny tokenizer has 512 entries: ids 0 `<|endoftext|>` (end of sequence), 1 `<|im_start|>`,
2 `<|im_end|>`, then the 256 byte symbols, then 253 merges learnt from the corpus embedded below
by a plain BPE count (most frequent pair first, ties broken by the pair's text), so the same
merges come out on every machine. Any text round-trips, since every byte has a token.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import Counter
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 512

_CORPUS = """
The quick brown fox jumps over the lazy dog. Hello, world! Hello there, how are you today?
A language model reads a prompt, turns it into tokens, and predicts the next token again and again.
The engine keeps the keys and values of every token in a paged cache, one block at a time.
Each step of the scheduler mixes new prompts with sequences that are already decoding.
Once upon a time there was a small model that wanted to answer every question it was asked.
It read the question, thought about the answer, and wrote it down one word after another.
The weather is nice today, so we walk to the park and sit in the sun with a cup of tea.
Numbers like 1, 2, 3, 10, 42, 100 and 2026 appear in text, and so do dates and times.
def generate(prompt, max_tokens=16):
    tokens = tokenizer.encode(prompt)
    for step in range(max_tokens):
        logits = model(tokens)
        tokens.append(int(logits.argmax()))
    return tokenizer.decode(tokens)
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris.<|im_end|>
<|im_start|>user
Write a short poem about the sea.<|im_end|>
<|im_start|>assistant
The sea is wide, the sea is deep, it sings the shore to sleep.<|im_end|>
In the beginning of the story, the people of the town were happy, and they worked with their hands.
This is a test of the tokenizer: it should split common words into few tokens and rare words into many.
""".strip()


def _byte_symbols() -> list[str]:
    """The printable stand-in for each byte 0..255, in byte order (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def _learn_merges(words: Counter, count: int) -> list[tuple[str, str]]:
    pieces = {word: list(word) for word in words}
    merges: list[tuple[str, str]] = []
    for _ in range(count):
        pairs: Counter = Counter()
        for word, frequency in words.items():
            parts = pieces[word]
            for left, right in itertools.pairwise(parts):
                pairs[(left, right)] += frequency
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        joined = best[0] + best[1]
        for word, parts in pieces.items():
            i, merged = 0, []
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(joined)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            pieces[word] = merged
    return merges


class TextTokenizer:
    """A thin wrapper: encode, decode, and which ids end a sequence."""

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def byte_level_decoder(self) -> bool:
        """Whether the decoder is `tokenizers`' ByteLevel alone, so a token list split after a complete character
        decodes to the same text in two pieces (`detokenizer.IncrementalText`)."""
        return isinstance(self.tokenizer.decoder, decoders.ByteLevel)

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load `tokenizer.json` of a checkpoint; end-of-sequence ids from generation_config.json or config.json."""
        directory = Path(path)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        tokenizer = Tokenizer.from_file(str(file))
        eos: list[int] = []
        for name in ("generation_config.json", "config.json"):
            config_path = directory / name
            if config_path.is_file():
                value = json.loads(config_path.read_text()).get("eos_token_id")
                if value is not None:
                    eos = list(value) if isinstance(value, list) else [value]
                    break
        if not eos:
            token = tokenizer.token_to_id("<|endoftext|>")
            eos = [token] if token is not None else []
        return cls(tokenizer, tuple(int(i) for i in eos))


@functools.lru_cache(maxsize=1)
def _tiny() -> str:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words: Counter = Counter()
    for text in _CORPUS.replace("<|im_start|>", "\n").replace("<|im_end|>", "\n").split("\n"):
        words.update(piece for piece, _ in byte_level.pre_tokenize_str(text))
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for symbol in _byte_symbols():
        vocab[symbol] = len(vocab)
    merges = _learn_merges(words, TINY_VOCAB_SIZE - len(vocab))
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    return tokenizer.to_str()


def tiny_tokenizer() -> TextTokenizer:
    """The deterministic 512-token byte-level BPE of the random-weight presets (eos id 0)."""
    return TextTokenizer(Tokenizer.from_str(_tiny()), eos_token_ids=(0,))


def load_tokenizer(model: str | Path) -> TextTokenizer:
    """`tiny_tokenizer()` for a preset name, else the checkpoint directory's tokenizer.json."""
    if str(model) in ("tiny", "full"):
        return tiny_tokenizer()
    return TextTokenizer.from_dir(model)
