"""A page's language: the one it declares, else the one its text is written in.

Declared: `<html lang>`, then `<meta http-equiv="content-language">`, then `og:locale`,
as a BCP 47 tag with its usual case (`en`, `en-GB`, `pt-BR`, `zh-Hant`). Detected: the
ISO 639-1 code `py3langid` (the detector trafilatura uses itself; BSD) gives the first
4,000 characters of the main text, when it is sure of it (normalised probability ≥ 0.9 on
at least 40 characters); else no language rather than a guess. The detector's model (about
1 s to load) is read on the first page that declares nothing.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lxml.html import HtmlElement
    from py3langid.langid import LanguageIdentifier

DETECT_CHARS = 4000
MIN_DETECT_CHARS = 40
MIN_CONFIDENCE = 0.9
_TAG = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*$")
_identifier: LanguageIdentifier | None = None
_identifier_lock = threading.Lock()


def normalise_tag(value: str | None) -> str | None:
    """A language tag in BCP 47's usual case, or None when it is not one (`*`, junk).

    >>> normalise_tag("EN_us"), normalise_tag("zh-hant-tw"), normalise_tag("x")
    ('en-US', 'zh-Hant-TW', None)
    """
    tag = (value or "").strip().split(",")[0].strip()
    if not _TAG.match(tag):
        return None
    primary, *rest = re.split(r"[-_]", tag)
    parts = [primary.lower()]
    for sub in rest:
        if len(sub) == 2 and sub.isalpha():
            parts.append(sub.upper())  # region
        elif len(sub) == 4 and sub.isalpha():
            parts.append(sub.title())  # script
        else:
            parts.append(sub.lower())
    return "-".join(parts)


def declared_language(tree: HtmlElement | None) -> str | None:
    """The language the page's markup declares, or None."""
    if tree is None:
        return None
    root = tree.getroottree().getroot()
    candidates = [root.get("lang"), root.get("xml:lang")]
    for meta in root.iter("meta"):
        equiv = (meta.get("http-equiv") or "").lower()
        prop = (meta.get("property") or meta.get("name") or "").lower()
        if equiv == "content-language" or prop in ("og:locale", "language", "dc.language"):
            candidates.append(meta.get("content"))
    for candidate in candidates:
        tag = normalise_tag(candidate)
        if tag is not None:
            return tag
    return None


def detect_language(text: str) -> str | None:
    """The ISO 639-1 code of the language `text` is written in, when the detector is sure."""
    sample = text[:DETECT_CHARS]
    if sum(ch.isalpha() for ch in sample) < MIN_DETECT_CHARS:
        return None
    code, confidence = _detector().classify(sample)
    return str(code) if confidence >= MIN_CONFIDENCE else None


def page_language(tree: HtmlElement | None, text: str) -> str | None:
    """Declared, else detected, else None."""
    return declared_language(tree) or detect_language(text)


def _detector() -> LanguageIdentifier:
    global _identifier
    with _identifier_lock:
        if _identifier is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return _identifier
