"""The tiny tokenizer: 512 ids, fixed special ids, deterministic, lossless; checkpoint tokenizers load from a directory."""

from __future__ import annotations

import json

import pytest

from reference_engine.tokenizer import TextTokenizer, tiny_tokenizer


def test_special_ids_and_size():
    tokenizer = tiny_tokenizer()
    vocab = tokenizer.tokenizer.get_vocab()
    assert tokenizer.vocab_size == 512 and max(vocab.values()) == 511
    assert [vocab["<|endoftext|>"], vocab["<|im_start|>"], vocab["<|im_end|>"]] == [0, 1, 2]
    assert tokenizer.eos_token_id == 0
    assert tokenizer.encode("<|im_start|>user<|im_end|>")[0] == 1


@pytest.mark.parametrize("text", ["Hello, world!", "The capital of France is Paris.", "naïve 日本語 🙂 \t\n  x", ""])
def test_round_trip(text):
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode(text)
    assert all(0 <= i < 512 for i in ids)
    assert tokenizer.decode(ids) == text


def test_merges_compress_common_words():
    tokenizer = tiny_tokenizer()
    text = "The capital of the model"
    assert len(tokenizer.encode(text)) < len(text.encode()) // 2


def test_deterministic_across_builds():
    from reference_engine import tokenizer as module

    first = module._tiny()
    module._tiny.cache_clear()
    assert module._tiny() == first


def test_from_dir(tmp_path):
    tiny_tokenizer().tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    loaded = TextTokenizer.from_dir(tmp_path)
    assert loaded.eos_token_ids == (2, 0)
    assert loaded.encode("Hello there") == tiny_tokenizer().encode("Hello there")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        TextTokenizer.from_dir(tmp_path / "missing")
