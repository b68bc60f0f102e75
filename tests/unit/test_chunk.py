"""chunk_page: exact offsets, token limit, overlap, boundaries, speed."""

from __future__ import annotations

import random
import re
import time

import pytest

from tests.factories import make_page
from webctx.models import Chunk, Page
from webctx.settings import ChunkSettings
from webctx.stages.chunk import chunk_page
from webctx.tokens import count_tokens

_WORDS = (
    "the broker acks late while workers fetch pages données über naïve résumé 東京 의 "
    "🙂 👩‍👩‍👧 e\u0301t\u00e9 Ω≈ç √ x=1.5 U.S. e.g. «quoted» “curly” 'single' (paren)"
).split()
_SPACES = [" ", " ", " ", "  ", "\t", "\u00a0", "\u3000"]
_BREAKS = ["\n", "\n\n", "\r\n", "\r\n\r\n", "\n \n", "\r", "\u2028", "\x0c", " \n\t\n"]
_ENDS = [".", "!", "?", "…", "。", '."', ".)", "", ":"]


def _sentence(rng: random.Random, words: int) -> str:
    body = rng.choice(_SPACES).join(rng.choice(_WORDS) for _ in range(words))
    return body + rng.choice(_ENDS)


def _messy_text(rng: random.Random) -> str:
    """Random prose with unicode, mixed line endings and stray whitespace at both ends."""
    paragraphs = [
        " ".join(_sentence(rng, rng.randint(1, 40)) for _ in range(rng.randint(1, 6)))
        for _ in range(rng.randint(1, 12))
    ]
    text = "".join(p + rng.choice(_BREAKS) for p in paragraphs)
    return rng.choice(["", " ", "\n\n", "\ufeff"]) + text + rng.choice(["", "  ", "\r\n"])


def _prose(sentences: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    plain = [w for w in _WORDS if w.isascii() and w.isalpha()]
    paragraphs: list[str] = []
    while sentences > 0:
        n = min(sentences, rng.randint(2, 6))
        sentences -= n
        paragraphs.append(
            " ".join(
                " ".join(rng.choice(plain) for _ in range(rng.randint(5, 14))).capitalize() + "."
                for _ in range(n)
            )
        )
    return "\n\n".join(paragraphs)


def _assert_well_formed(page: Page, chunks: list[Chunk], max_tokens: int) -> None:
    for i, chunk in enumerate(chunks):
        assert chunk.text == page.text[chunk.start : chunk.end]
        assert chunk.text and chunk.text == chunk.text.strip()
        assert chunk.tokens == count_tokens(chunk.text) <= max_tokens
        assert chunk.index == i
        assert chunk.content_sha256 == page.content_sha256
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert prev.start < nxt.start and prev.end < nxt.end


def _assert_covers_all_text(page: Page, chunks: list[Chunk]) -> None:
    covered = bytearray(len(page.text))
    for chunk in chunks:
        covered[chunk.start : chunk.end] = b"\x01" * (chunk.end - chunk.start)
    missed = [c for c, hit in zip(page.text, covered, strict=True) if not hit and not c.isspace()]
    assert missed == []


def test_chunk_text_is_page_slice_and_within_limit_for_generated_texts() -> None:
    rng = random.Random(20250102)
    for _ in range(200):
        page = make_page(text=_messy_text(rng))
        max_tokens = rng.choice([4, 8, 16, 32, 64, 256])
        overlap = rng.randrange(0, max_tokens)
        chunks = chunk_page(page, max_tokens=max_tokens, overlap_tokens=overlap)
        _assert_well_formed(page, chunks, max_tokens)
        _assert_covers_all_text(page, chunks)


def test_chunk_offsets_hold_with_crlf_line_endings() -> None:
    page = make_page(text="\r\n  First line here.\r\nSecond line.  \r\n\r\nThird.\r\n")
    chunks = chunk_page(page, max_tokens=4, overlap_tokens=0)
    assert [c.text for c in chunks] == ["First line here.", "Second line.", "Third."]
    _assert_well_formed(page, chunks, 4)


def test_sentence_without_punctuation_is_split_at_word_boundaries() -> None:
    text = " ".join(f"word{i}" for i in range(5000))
    page = make_page(text=text)
    chunks = chunk_page(page, max_tokens=64, overlap_tokens=8)
    _assert_well_formed(page, chunks, 64)
    _assert_covers_all_text(page, chunks)
    for chunk in chunks:
        assert chunk.start == 0 or text[chunk.start - 1] == " "
        assert chunk.end == len(text) or text[chunk.end] == " "
    assert min(c.tokens for c in chunks[:-1]) > 64 // 2


def test_word_longer_than_limit_is_split_inside_the_word() -> None:
    rng = random.Random(3)
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789+/é東") for _ in range(20_000))
    page = make_page(text=f"Before. {word} After.")
    chunks = chunk_page(page, max_tokens=32, overlap_tokens=0)
    _assert_well_formed(page, chunks, 32)
    inside = [c.text for c in chunks if c.text not in ("Before.", "After.")]
    assert "".join(inside).replace("Before. ", "").replace(" After.", "") == word


def test_consecutive_chunks_overlap_by_whole_sentences() -> None:
    page = make_page(text=_prose(200))
    chunks = chunk_page(page, max_tokens=80, overlap_tokens=20)
    _assert_well_formed(page, chunks, 80)
    assert len(chunks) > 10
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        shared = page.text[nxt.start : prev.end]
        assert nxt.start < prev.end, "no overlap"
        assert re.search(r"[.]\s$", page.text[: nxt.start]), "overlap starts mid-sentence"
        assert 0 < count_tokens(shared) <= 2 * 20


def test_zero_overlap_never_repeats_text() -> None:
    page = make_page(text=_prose(200))
    chunks = chunk_page(page, max_tokens=80, overlap_tokens=0)
    assert all(prev.end < nxt.start for prev, nxt in zip(chunks, chunks[1:], strict=False))
    _assert_covers_all_text(page, chunks)


def test_chunks_fill_toward_the_limit() -> None:
    page = make_page(text=_prose(400))
    chunks = chunk_page(page, max_tokens=256, overlap_tokens=32)
    assert all(c.tokens >= 256 // 2 for c in chunks[:-1])


def test_chunk_ends_at_paragraph_break_when_one_is_near() -> None:
    paragraph = " ".join(["Each paragraph has the same five short sentences in it."] * 3)
    page = make_page(text="\n".join([paragraph] * 6))
    per_paragraph = count_tokens(paragraph)
    chunks = chunk_page(page, max_tokens=2 * per_paragraph + 30, overlap_tokens=0)
    assert [c.text for c in chunks] == [f"{paragraph}\n{paragraph}"] * 3


@pytest.mark.parametrize("abbreviation", ["3 p.m.", "e.g.", "approx.", "vs."])
def test_abbreviation_before_a_lower_case_word_does_not_end_a_sentence(abbreviation: str) -> None:
    intro = "Fans came from far away to watch the final."
    head = f"The match began at {abbreviation}"
    text = f"{intro} {head} on a wet Sunday in the rain. It ended late."
    # Room for the intro and the sentence's head, not for the whole sentence: a cut after the
    # abbreviation would fill the first chunk with the head.
    page = make_page(text=text)
    chunks = chunk_page(page, max_tokens=count_tokens(f"{intro} {head}") + 1, overlap_tokens=0)
    _assert_well_formed(page, chunks, count_tokens(f"{intro} {head}") + 1)
    assert [c.text for c in chunks][:1] == [intro]
    assert any(c.text.startswith(f"{head} on a wet Sunday") for c in chunks)


def test_sentence_ends_before_a_capitalised_word_after_a_period() -> None:
    text = "It rained in the afternoon. Play resumed at six in the evening."
    page = make_page(text=text)
    chunks = chunk_page(page, max_tokens=count_tokens("It rained in the afternoon.") + 2,
                        overlap_tokens=0)  # fmt: skip
    assert [c.text for c in chunks] == [
        "It rained in the afternoon.",
        "Play resumed at six in the evening.",
    ]


@pytest.mark.parametrize("text", ["", " ", "\n\r\n\t \u3000\u2028"])
def test_text_without_content_gives_no_chunks(text: str) -> None:
    assert chunk_page(make_page(text=text)) == []


@pytest.mark.parametrize(("max_tokens", "overlap"), [(3, 0), (32, 32), (32, -1)])
def test_impossible_limits_are_refused(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_page(make_page(), max_tokens=max_tokens, overlap_tokens=overlap)


def test_200_kb_page_chunks_in_well_under_a_second() -> None:
    text = _prose(3000)
    while len(text) < 200_000:
        text += "\n\n" + text
    page = make_page(text=text[:200_000])
    count_tokens("warm the encoder up")
    started = time.perf_counter()
    chunks = chunk_page(page)
    elapsed = time.perf_counter() - started
    _assert_well_formed(page, chunks, 256)
    assert elapsed < 0.5, f"{elapsed:.3f}s"


def test_megabyte_single_line_page_chunks_without_tokenizer_error() -> None:
    # bpe_openai refuses ~1 MB in one call; tokens.encode must split it.
    text = "word " * 260_000
    chunks = chunk_page(make_page(text=text), max_tokens=256, overlap_tokens=0)
    assert chunks and all(c.tokens <= 256 for c in chunks)
    assert all(text[c.start : c.end] == c.text for c in chunks[:50])


def test_default_chunks_are_small_enough_for_several_in_a_tight_budget() -> None:
    # bench/answer_recall.py: 64-token chunks (four or more in a 250-token bundle) beat
    # 256-token ones by tens of points of answer recall at small budgets.
    settings = ChunkSettings()
    page = make_page(text=_prose(400))
    chunks = chunk_page(
        page, max_tokens=settings.max_tokens, overlap_tokens=settings.overlap_tokens
    )
    assert len(chunks) > 1
    assert max(c.tokens for c in chunks) * 4 <= 256
