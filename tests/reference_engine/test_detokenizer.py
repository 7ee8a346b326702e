"""`detokenizer.IncrementalText`: the engine's output text equals the tokenizer's whole decode at every step.

Random token lists (special tokens included) and a text whose characters span several byte tokens, grown one token
at a time; the incremental path must be the one taken (few tokens decoded per step) and a known-wrong variant, one that
takes a text ending in U+FFFD as final, must give other text. A decoder other than ByteLevel is decoded whole.
"""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders

from reference_engine.detokenizer import REPLACEMENT, IncrementalText
from reference_engine.tokenizer import TextTokenizer, tiny_tokenizer

TEXT = "héllo wörld, 你好 🙂 — naïve café ∑ 𝔘𝔫𝔦 ok"


class _EagerBoundary(IncrementalText):
    """Known wrong: the text so far is taken as final even when a character is still split (ends in U+FFFD)."""

    def text(self, ids):
        tail = self._decode(ids[self._done :])
        self._done, self._text = len(ids), self._text + tail
        return self._text


def _grown(texts: IncrementalText, ids: list[int]) -> list[str]:
    return [texts.text(ids[:n]) for n in range(len(ids) + 1)]


def test_the_tiny_tokenizer_has_a_byte_level_decoder():
    assert tiny_tokenizer().byte_level_decoder


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_ids_match_the_whole_decode_at_every_length(seed):
    tokenizer = tiny_tokenizer()
    generator = random.Random(seed)
    ids = [generator.randrange(tokenizer.vocab_size) for _ in range(300)]
    ids[40:40] = [0, 1]  # special tokens (skipped when decoding) inside the output
    texts = IncrementalText(tokenizer)
    assert texts.incremental
    assert _grown(texts, ids) == [tokenizer.decode(ids[:n]) for n in range(len(ids) + 1)]


def test_split_characters_match_and_the_incremental_path_is_taken():
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode(TEXT * 4)
    whole = [tokenizer.decode(ids[:n]) for n in range(len(ids) + 1)]
    assert any(text.endswith(REPLACEMENT) for text in whole), "the text should split some characters across tokens"
    texts = IncrementalText(tokenizer)
    decoded = []
    for n in range(len(ids) + 1):
        assert texts.text(ids[:n]) == whole[n], n
        decoded.append(texts.last_decoded)
    assert max(decoded) <= 4, decoded  # a character spans at most 4 byte tokens: never the whole list again
    assert _grown(_EagerBoundary(tokenizer), ids) != whole  # the harness sees a boundary taken too early


def test_a_list_cut_back_starts_over():
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode(TEXT)
    texts = IncrementalText(tokenizer)
    texts.text(ids)
    assert texts.text(ids[:5]) == tokenizer.decode(ids[:5])
    assert texts.text(ids) == tokenizer.decode(ids)


def test_another_decoder_is_decoded_whole_every_time():
    base = tiny_tokenizer()
    raw = Tokenizer.from_str(base.tokenizer.to_str())
    raw.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])  # strips a piece's leading space
    tokenizer = TextTokenizer(raw, base.eos_token_ids)
    assert not tokenizer.byte_level_decoder
    ids = tokenizer.encode("a b c d e f")
    texts = IncrementalText(tokenizer)
    for n in range(len(ids) + 1):
        assert texts.text(ids[:n]) == tokenizer.decode(ids[:n])
        assert texts.last_decoded == n
    whole = tokenizer.decode(ids)  # why: with this decoder two pieces do not add up to the whole
    assert any(tokenizer.decode(ids[:k]) + tokenizer.decode(ids[k:]) != whole for k in range(1, len(ids)))


def test_engine_outputs_carry_the_whole_decode():
    from reference_engine.llm import LLM
    from reference_engine.sampling_params import SamplingParams

    llm = LLM("tiny")
    params = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.8, seed=3)
    request = llm.engine.add_request(prompt="The capital of France is", params=params)
    seen = 0
    while llm.engine.has_unfinished():
        for output in llm.engine.step():
            completion = output.outputs[0]
            assert completion.text == llm.tokenizer.decode(completion.token_ids)
            seen += 1
    assert seen == 40 and request not in llm.engine._texts  # one output per token; the finished request's state dropped
