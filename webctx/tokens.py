"""Token counting with OpenAI's cl100k_base encoding (offline, via bpe_openai)."""

from __future__ import annotations

import threading

import bpe_openai
from bpe_openai.tokenizer import Encoding

ENCODING_NAME = "cl100k_base"
_loaded: Encoding | None = None
_load_lock = threading.Lock()


def encoding() -> Encoding:
    """Return the shared cl100k_base encoding, loaded once per process.

    Under a lock: a worker's threads reach their first token count together, and each
    would otherwise parse the 100,000-line rank file itself (a profile of the embed/rank
    worker found it loaded 3 times, ~2 s of CPU each under the profiler)."""
    global _loaded
    if _loaded is None:
        with _load_lock:
            if _loaded is None:
                _loaded = bpe_openai.get_encoding(ENCODING_NAME)
    return _loaded


# bpe_openai refuses very long inputs (over 200k tokens, or about 1 MB in one call):
# longer texts are encoded in pieces cut just before a whitespace character, where the
# cl100k pre-tokenizer starts a new piece anyway.
_PIECE_CHARS = 100_000


def encode(text: str) -> list[int]:
    """Token ids of `text`; special-token strings in web text count as plain text."""
    # encode() raises on "<|endoftext|>" found in scraped pages; encode_ordinary never does.
    enc = encoding()
    if len(text) <= _PIECE_CHARS:
        return list(enc.encode_ordinary(text))
    ids: list[int] = []
    for piece in _pieces(text):
        ids.extend(enc.encode_ordinary(piece))
    return ids


def _pieces(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + _PIECE_CHARS, len(text))
        if end < len(text):
            cut = max(text.rfind(" ", start + _PIECE_CHARS // 2, end),
                      text.rfind("\n", start + _PIECE_CHARS // 2, end))
            end = cut if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in `text`."""
    return len(encode(text))


def truncate_to_tokens(text: str, n: int) -> str:
    """Longest prefix of `text` that fits in `n` tokens."""
    if n <= 0:
        return ""
    ids = encode(text)
    if len(ids) <= n:
        return text
    # A cut can split a multi-byte character: drop the dangling bytes rather than emit U+FFFD.
    head: bytes = encoding().decode_bytes(ids[:n])
    return head.decode("utf-8", errors="ignore")
