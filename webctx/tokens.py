"""Token counting with OpenAI's cl100k_base encoding (offline, via bpe_openai's Rust core).

The tokenizer is bpe_openai's compiled extension (`bpe_openai._bindings`), loaded without
running the package's `__init__`: importing `bpe_openai` parses all three rank files it
ships (cl100k, o200k, voyage3) into Python dicts at import time, about 65 MB of heap and
1 s of CPU in every process, although the Rust tokenizer carries its own tables. Loaded
directly, the cl100k tokenizer costs about 35 MB and 20 ms, once per process."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Protocol, cast

from webctx.errors import ConfigError

ENCODING_NAME = "cl100k_base"
_MODULE = "bpe_openai._bindings"


class Tokenizer(Protocol):
    """The part of bpe_openai's `PyTokenizer` used here."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, tokens: list[int]) -> str: ...
    def count(self, text: str) -> int: ...


_loaded: Tokenizer | None = None
_load_lock = threading.Lock()


def _bindings() -> ModuleType:
    """The compiled module, imported on its own; reused if `bpe_openai` was imported."""
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    package = importlib.util.find_spec("bpe_openai")  # locates it; runs no package code
    places = package.submodule_search_locations if package is not None else None
    found = [p for d in places or [] for p in Path(d).glob("_bindings*.so")]
    if not found:
        raise ConfigError(
            "bpe-openai's compiled tokenizer is not installed (pip install bpe-openai)"
        )
    loader = importlib.machinery.ExtensionFileLoader(_MODULE, str(found[0]))
    spec = importlib.util.spec_from_file_location(_MODULE, found[0], loader=loader)
    assert spec is not None  # a file path with a loader always gives a spec
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    # The extension initializes once per interpreter: a later `import bpe_openai` must
    # find this module rather than load the file again.
    sys.modules[_MODULE] = module
    return module


def encoding() -> Tokenizer:
    """Return the shared cl100k_base tokenizer, loaded once per process.

    Under a lock: a worker's threads reach their first token count together, and each
    would otherwise load the tables itself."""
    global _loaded
    if _loaded is None:
        with _load_lock:
            if _loaded is None:
                tokenizer = _bindings().tokenizer_for_encoding(ENCODING_NAME)
                _loaded = cast(Tokenizer, tokenizer)
    return _loaded


# The tokenizer is given at most _PIECE_CHARS characters in one call (bpe_openai's own
# wrapper refuses 1 MB): longer texts are encoded in pieces cut just before a whitespace
# character, where the cl100k pre-tokenizer starts a new piece anyway.
_PIECE_CHARS = 100_000


def _utf8(text: str) -> str:
    """`text` with lone surrogates (which UTF-8 cannot carry) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def encode(text: str) -> list[int]:
    """Token ids of `text`; special-token strings in web text count as plain text."""
    enc = encoding()
    return [i for piece in _pieces(_utf8(text)) for i in enc.encode(piece)]


def _pieces(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + _PIECE_CHARS, len(text))
        if end < len(text):
            cut = max(
                text.rfind(" ", start + _PIECE_CHARS // 2, end),
                text.rfind("\n", start + _PIECE_CHARS // 2, end),
            )
            end = cut if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in `text`.

    Chunk-sized texts are remembered (the last few thousand): a chunk is counted when it
    is cut, again when its embedding request is packed and again under the rate limit,
    and the tokenizer holds the GIL while it counts."""
    if len(text) > _REMEMBERED_CHARS:
        return _count(text)
    return _count_remembered(text)


_REMEMBERED_CHARS = 4_000


def _count(text: str) -> int:
    enc = encoding()
    return sum(enc.count(piece) for piece in _pieces(_utf8(text)))


_count_remembered = functools.lru_cache(maxsize=8192)(_count)


VOCABULARY = 100_256
"""cl100k's ordinary tokens are ids 0 .. VOCABULARY - 1."""


def decode(ids: list[int]) -> str:
    """The text of token ids; ValueError for an id outside the vocabulary or ids that end
    inside a multi-byte character (the Rust core would panic on the former)."""
    if any(not 0 <= i < VOCABULARY for i in ids):
        raise ValueError(f"token ids must be in 0..{VOCABULARY - 1}")
    return encoding().decode(ids)


# A UTF-8 character is at most 4 bytes, so at most 3 tokens end inside one.
_MAX_SPLIT_TOKENS = 3


def truncate_to_tokens(text: str, n: int) -> str:
    """Longest prefix of `text` that fits in `n` tokens and ends on a whole character.

    A cut inside a multi-byte character ends before the token that splits it, rather
    than emit U+FFFD."""
    if n <= 0:
        return ""
    ids = encode(text)
    if len(ids) <= n:
        return text
    for end in range(n, max(0, n - _MAX_SPLIT_TOKENS) - 1, -1):
        try:
            return decode(ids[:end])
        except ValueError:  # the token sequence ends inside a character
            continue
    return ""
