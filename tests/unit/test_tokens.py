"""The shared cl100k encoding: loaded once per process, even by racing threads."""

from __future__ import annotations

import threading
import time

import bpe_openai
import pytest

from webctx import tokens


def test_threads_counting_tokens_together_load_the_encoding_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = bpe_openai.get_encoding
    calls: list[str] = []

    def slow_load(name: str) -> object:  # as slow as parsing the rank file, for the race
        calls.append(name)
        time.sleep(0.2)
        return real(name)

    monkeypatch.setattr(tokens, "_loaded", None)
    monkeypatch.setattr(tokens.bpe_openai, "get_encoding", slow_load)
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
