"""Keep a page's invisible format characters through trafilatura, so citations stay verbatim.

trafilatura drops every character that is not printable, which includes Unicode format
characters (category Cf): zero-width space, joiners, direction marks, soft hyphen, BOM.
The extracted text then differs from the page as served exactly where one sat, and a
chunk around it is no longer a substring of the page (bench/answer_recall.py found 22 of
33,408 chunks so). Before extraction each of these characters, written literally or as an
entity, is swapped for a printable stand-in that trafilatura keeps (an alchemical symbol:
no decomposition, no case, not a letter or digit), and swapped back in what comes out.
A page that already contains a stand-in is left as it was. Those that hide or split words
(zero-width space, word joiner, soft hyphen, BOM; joiners and marks between ASCII letters)
are then dropped from the text by `webctx.stages.visibility.strip_invisible`, before it is
hashed and chunked: the stored text never holds them, so offsets stay exact.

Kept: soft hyphen, Arabic letter mark, Mongolian vowel separator, zero-width space, joiners
and direction marks, word joiner, BOM. Not kept: the bidi embeddings and isolates
(U+202A-E, U+2066-9) and invisible math operators (U+2061-4): finding them in a str costs
as much as the rest of this module together (their low byte is an ASCII character, which
defeats the fast character search), for characters this rare in article text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FORMAT_CHARS = "\u00ad\u061c\u180e\u200b\u200c\u200d\u200e\u200f\u2060\ufeff"
_STAND_INS = "".join(chr(0x1F700 + i) for i in range(len(FORMAT_CHARS)))
_NAMED = {"shy": "\u00ad", "zwnj": "\u200c", "zwj": "\u200d", "lrm": "\u200e",
          "rlm": "\u200f", "ZeroWidthSpace": "\u200b", "NoBreak": "\u2060"}  # fmt: skip
_CODES = {ord(c) for c in FORMAT_CHARS}
# Entity spellings of the characters above (other numeric entities are left as they are).
_ENTITY = re.compile(r"&(?:#(?:[xX]([0-9a-fA-F]{1,6})|([0-9]{1,7}))|(" + "|".join(_NAMED) + r"));")


@dataclass(frozen=True, slots=True)
class Protected:
    """The HTML with stand-ins, and how to put the characters back."""

    html: str
    _back: dict[int, str] | None

    def restore(self, text: str) -> str:
        """`text` with each stand-in replaced by the character it stood for."""
        return text.translate(self._back) if self._back and text else text


def protect(html: str) -> Protected:
    """`html` with its format characters (literal or entities) swapped for stand-ins."""
    if html.isascii() and "&" not in html:
        return Protected(html, None)
    if any(s in html for s in _STAND_INS):
        return Protected(html, None)
    out = html
    for char, stand_in in zip(FORMAT_CHARS, _STAND_INS, strict=True):
        if char in out:  # str.replace per character: str.translate is 10x slower here
            out = out.replace(char, stand_in)
    if _ENTITY.search(out):  # a regex led by "&" scans fast; `in` per spelling would not
        out = _ENTITY.sub(_stand_in_for_entity, out)
    if out == html:
        return Protected(html, None)
    back = {ord(s): c for c, s in zip(FORMAT_CHARS, _STAND_INS, strict=True)}
    return Protected(out, back)


def _stand_in_for_entity(match: re.Match[str]) -> str:
    hex_code, dec_code, name = match.groups()
    if name:
        char = _NAMED[name]
    else:
        code = int(hex_code, 16) if hex_code else int(dec_code)
        if code not in _CODES:
            return match.group()
        char = chr(code)
    return _STAND_INS[FORMAT_CHARS.index(char)]
