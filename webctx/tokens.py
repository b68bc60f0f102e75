"""Token counting with OpenAI's cl100k_base encoding (offline, via bpe_openai)."""

from __future__ import annotations

from functools import cache

import bpe_openai
from bpe_openai.tokenizer import Encoding

ENCODING_NAME = "cl100k_base"


@cache
def encoding() -> Encoding:
    """Return the shared cl100k_base encoding (loaded once per process)."""
    return bpe_openai.get_encoding(ENCODING_NAME)


def encode(text: str) -> list[int]:
    """Token ids of `text`; special-token strings in web text count as plain text."""
    # encode() raises on "<|endoftext|>" found in scraped pages; encode_ordinary never does.
    return list(encoding().encode_ordinary(text))


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
