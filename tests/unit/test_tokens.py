"""The shared cl100k tokenizer: the ids OpenAI's tokenizer gives, loaded once per process
(even by racing threads), without loading bpe_openai's other encodings."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from webctx import tokens


def test_ids_and_counts_are_cl100k() -> None:
    # Reference ids from OpenAI's cl100k_base (tiktoken).
    assert tokens.encode("hello world") == [15339, 1917]
    assert tokens.encode("héllo wörld") == [71, 19010, 385, 289, 9603, 509]
    assert tokens.count_tokens("hello world") == 2
    assert tokens.decode([15339, 1917]) == "hello world"


def test_remembered_counts_equal_fresh_ones_for_short_and_long_texts() -> None:
    texts = ["hello world", "héllo wörld " * 30, "x" * 3999, "word " * 2000]
    for text in texts * 2:  # the second round reads what the first remembered
        assert tokens.count_tokens(text) == tokens._count(text)


def test_special_token_text_in_a_page_counts_as_plain_text() -> None:
    assert tokens.count_tokens("a <|endoftext|> b") == len(tokens.encode("a <|endoftext|> b")) > 3


def test_lone_surrogates_are_counted_as_replacement_characters() -> None:
    assert tokens.count_tokens("a\ud800b") == tokens.count_tokens("a\ufffdb")


def test_truncation_never_splits_a_character() -> None:
    text = "héllo wörld 日本語 x"
    for n in range(1, tokens.count_tokens(text) + 1):
        cut = tokens.truncate_to_tokens(text, n)
        assert text.startswith(cut) and "\ufffd" not in cut
        assert tokens.count_tokens(cut) <= n
    assert tokens.truncate_to_tokens(text, 8) == "héllo wörld 日本"
    assert tokens.truncate_to_tokens("日本語", 1) == "日"
    assert tokens.truncate_to_tokens(text, 0) == ""
    assert tokens.truncate_to_tokens(text, 1000) == text


@pytest.mark.parametrize("ids", [[100_256], [-1], [2**40], [45918]])
def test_decoding_unknown_or_split_ids_is_a_value_error(ids: list[int]) -> None:
    with pytest.raises(ValueError):
        tokens.decode(ids)


def test_loading_the_tokenizer_leaves_the_bpe_openai_package_unimported() -> None:
    # Importing bpe_openai parses three rank files into Python dicts (~65 MB, ~1 s).
    code = (
        "import sys; from webctx import tokens; tokens.count_tokens('x'); "
        "print('bpe_openai' in sys.modules); import bpe_openai; "
        "print(bpe_openai.get_encoding('cl100k_base').encode_ordinary('hello world'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # ...and a later `import bpe_openai` still works, on the same compiled module.
    assert out.stdout.split("\n")[:2] == ["False", "[15339, 1917]"]


def test_threads_counting_tokens_together_load_the_tokenizer_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = tokens._bindings()
    real = module.tokenizer_for_encoding
    calls: list[str] = []

    def slow_load(name: str) -> object:  # slow, for the race
        calls.append(name)
        time.sleep(0.2)
        return real(name)

    monkeypatch.setattr(tokens, "_loaded", None)
    monkeypatch.setattr(module, "tokenizer_for_encoding", slow_load)
    start = threading.Barrier(8)
    found: list[object] = []

    def count() -> None:
        start.wait()
        found.append(tokens.encoding())

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["cl100k_base"]
    assert len(found) == 8 and all(f is found[0] for f in found)
    assert tokens.count_tokens("hello world") == 2
