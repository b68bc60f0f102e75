"""Split a page's main text into token-bounded, overlapping chunks with exact char offsets.

The text is cut into units: sentences, or, for a sentence over the limit, runs of words,
or, for a word over the limit, the longest character prefixes that fit. Each unit's tokens
are counted once; units are packed greedily into chunks by estimate, and each chunk is
counted once more to make the limit exact. Offsets never move past whitespace, so
`chunk.text == page.text[chunk.start:chunk.end]` always holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from webctx.models import Chunk, Page
from webctx.tokens import count_tokens

# A sentence runs to terminal punctuation (plus closing quotes) followed by whitespace and
# then anything but a lower-case letter ("at 3 p.m. on", "e.g. the" go on), to CJK terminal
# punctuation, or to the end of the line: trafilatura puts one paragraph per line.
_SENTENCE = re.compile(
    r"\S.*?(?:[.!?…]+[\"'”’»)\]]*(?=[^\S\n]*$|\s+(?![a-zß-ÿ]))|[。！？]+[\"'”’»)\]]*|$)",
    re.MULTILINE,
)
_WORD = re.compile(r"\S+")
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
# A code point is at most 4 UTF-8 bytes, hence at most 4 tokens: any smaller limit could stall.
MIN_MAX_TOKENS = 4


@dataclass(frozen=True, slots=True)
class _Unit:
    start: int
    end: int
    tokens: int


def chunk_page(page: Page, *, max_tokens: int = 256, overlap_tokens: int = 32) -> list[Chunk]:
    """Split a page's main text into token-bounded chunks with char offsets."""
    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}")
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError("overlap_tokens must be in [0, max_tokens)")
    text = page.text
    spans = _pack(text, _units(text, max_tokens), max_tokens, overlap_tokens)
    return [
        Chunk(
            content_sha256=page.content_sha256,
            index=index,
            start=start,
            end=end,
            text=text[start:end],
            tokens=tokens,
        )
        for index, (start, end, tokens) in enumerate(spans)
    ]


def _units(text: str, max_tokens: int) -> list[_Unit]:
    """Sentences of `text`, each within `max_tokens`, stripped of surrounding whitespace."""
    units: list[_Unit] = []
    for match in _SENTENCE.finditer(text):
        start = match.start()  # the pattern starts at a non-space character
        end = start + len(match.group().rstrip())
        tokens = count_tokens(text[start:end])
        if tokens <= max_tokens:
            units.append(_Unit(start, end, tokens))
        else:
            units.extend(_split_sentence(text, start, end, max_tokens))
    return units


def _split_sentence(text: str, start: int, end: int, max_tokens: int) -> list[_Unit]:
    """Cut an over-long sentence at word boundaries (a word over the limit, within it)."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text, start, end)]
    ends = [word_end for _, word_end in words]
    units: list[_Unit] = []
    w = 0
    while w < len(words):
        pos = words[w][0]
        last, tokens = _longest_fit(text, pos, ends, w, max_tokens)
        if last < w:
            units.extend(_split_word(text, pos, ends[w], max_tokens))
            w += 1
        else:
            units.append(_Unit(pos, ends[last], tokens))
            w = last + 1
    return units


def _split_word(text: str, start: int, end: int, max_tokens: int) -> list[_Unit]:
    """Cut a word into the longest character prefixes that fit, i.e. near token boundaries."""
    units: list[_Unit] = []
    pos = start
    while pos < end:
        cuts = range(pos + 1, end + 1)
        last, tokens = _longest_fit(text, pos, cuts, 0, max_tokens)
        if last < 0:  # unreachable while max_tokens >= MIN_MAX_TOKENS
            raise AssertionError("one character exceeds max_tokens")
        units.append(_Unit(pos, cuts[last], tokens))
        pos = cuts[last]
    return units


def _longest_fit(
    text: str, start: int, ends: Sequence[int], first: int, max_tokens: int
) -> tuple[int, int]:
    """Furthest index >= `first` of `ends` whose span from `start` fits, with its tokens.

    Returns (first - 1, 0) when even `ends[first]` does not fit. Gallops, then bisects, so
    no probe counts more than about twice the answer's text.
    """
    tokens = count_tokens(text[start : ends[first]])
    if tokens > max_tokens:
        return first - 1, 0
    lo, hi, step = first, len(ends), 1
    while lo + step < hi:
        probe = count_tokens(text[start : ends[lo + step]])
        if probe > max_tokens:
            hi = lo + step
            break
        lo, tokens, step = lo + step, probe, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probe = count_tokens(text[start : ends[mid]])
        if probe <= max_tokens:
            lo, tokens = mid, probe
        else:
            hi = mid
    return lo, tokens


class _Layout:
    """Token estimates of unit runs: unit tokens plus one per line break between units."""

    def __init__(self, text: str, units: Sequence[_Unit]) -> None:
        # The estimate is close but not exact (BPE merges across unit joins); chunks are
        # re-counted exactly before they are emitted.
        breaks = [False] + [
            not _LINE_BREAKS.isdisjoint(text[a.end : b.start])
            for a, b in zip(units, units[1:], strict=False)
        ]
        self.n = len(units)
        self.breaks = breaks
        self._tokens = [0, *accumulate(u.tokens for u in units)]
        self._gaps = [0, *accumulate(int(b) for b in breaks)]

    def cost(self, i: int, j: int) -> int:
        """Estimated tokens of units[i:j] joined with the text between them."""
        if j <= i:
            return 0
        return self._tokens[j] - self._tokens[i] + self._gaps[j] - self._gaps[i + 1]

    def fill(self, i: int, max_tokens: int) -> int:
        """End of the longest run from `i` estimated within `max_tokens` (at least i + 1)."""
        j = i + 1
        while j < self.n and self.cost(i, j + 1) <= max_tokens:
            j += 1
        return j

    def paragraph_end(self, i: int, j: int, floor: int, max_tokens: int) -> int:
        """Pull the end back to a paragraph break when that keeps the chunk at least half full."""
        for k in range(j, floor, -1):
            if self.cost(i, k) * 2 < max_tokens:
                break
            if self.breaks[k]:
                return k
        return j

    def overlap_start(self, i: int, j: int, target: int, max_tokens: int) -> int:
        """Start of the next chunk: whole units before `j` totalling about `target` tokens."""
        k = j
        while k - 1 > i and self.cost(k - 1, j + 1) <= max_tokens:
            # Take one more unit if that lands nearer the target than stopping here.
            if abs(self.cost(k - 1, j) - target) >= abs(self.cost(k, j) - target):
                break
            k -= 1
        return k


def _pack(
    text: str, units: Sequence[_Unit], max_tokens: int, overlap_tokens: int
) -> list[tuple[int, int, int]]:
    """Greedy (start, end, tokens) chunk spans over `units`, consecutive ones overlapping."""
    layout = _Layout(text, units)
    spans: list[tuple[int, int, int]] = []
    i = covered = 0
    while covered < layout.n:
        j = max(layout.fill(i, max_tokens), covered + 1)
        if j < layout.n:
            j = layout.paragraph_end(i, j, covered, max_tokens)
        i, j, tokens = _fit_exact(text, units, i, j, covered, max_tokens)
        spans.append((units[i].start, units[j - 1].end, tokens))
        covered = j
        if covered < layout.n:
            i = layout.overlap_start(i, j, overlap_tokens, max_tokens)
    return spans


def _fit_exact(
    text: str, units: Sequence[_Unit], i: int, j: int, covered: int, max_tokens: int
) -> tuple[int, int, int]:
    """Shrink units[i:j] until its exact count fits, keeping unit `covered` (new text)."""
    while True:
        tokens = count_tokens(text[units[i].start : units[j - 1].end])
        if tokens <= max_tokens:
            return i, j, tokens
        if j - 1 > covered:
            j -= 1  # drop new text from the end first,
        else:
            i += 1  # then overlap from the front; units[covered] alone always fits
