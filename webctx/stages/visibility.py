"""Drop what a reader of the page does not see, before extraction; strip invisible Unicode after.

trafilatura reads markup, not rendering: it keeps text a browser hides (the `hidden`
attribute, `font-size:0`, `opacity:0`, off-screen positions, `<template>`, classes the
page's own stylesheet hides), and it matches `display:none` as literal text, so
`DISPLAY:NONE` or `display : none` pass. A page can hide instructions for the model there.
`remove_hidden` deletes such elements from the parsed tree (their tail text stays: it is
the parent's, and visible). Inline styles are parsed case- and space-insensitively; the
page's `<style>` rules count for simple selectors (`tag`, `.class`, `#id`, `tag.class`,
lists of these) outside `@media` and similar blocks. External stylesheets are not fetched.

`strip_invisible` removes invisible characters that split or hide words from the extracted
text (zero-width space, word joiner, BOM, soft hyphen, tag characters, bidi embeddings; a
zero-width joiner or direction mark between two ASCII letters): the stored text then does
not contain them, so offsets into it stay exact and a filter or a model reads whole words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from lxml import etree
from lxml.html import HtmlElement

_DROP_TAGS = ("template", "noscript")
_NAMED_COLOURS = {"white": "ffffff", "black": "000000", "red": "ff0000", "blue": "0000ff",
                  "green": "008000", "gray": "808080", "grey": "808080", "yellow": "ffff00",
                  "silver": "c0c0c0", "navy": "000080"}  # fmt: skip
_RGB = re.compile(
    r"rgba?\(\s*([\d.]+)%?[\s,]+([\d.]+)%?[\s,]+([\d.]+)%?(?:[\s,/]+([\d.]+%?))?\s*\)"
)
_HSLA_ZERO = re.compile(r"hsla?\([^)]*[,/]\s*0?\.?0*%?\s*\)")
_LENGTH = re.compile(r"^(-?[\d.]+)(px|em|rem|pt|%|vw|vh|ch|ex|cm|mm|in)?$")
_IMPORTANT = re.compile(r"\s*!\s*important\s*$")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_BRACE = re.compile(r"[{}]")
# A rule that can hide has one of these in its text, lower-cased and without blanks (`hides`
# then decides).
_MAY_HIDE = ("display:none", "visibility:hidden", "visibility:collapse", "font-size:0",
             "opacity:0", "opacity:.0", "color:transparent", "color:rgba(", "color:hsla(",
             "indent:-", "left:-", "top:-", "right:-", "scale(0", "inset(", "rect(0",
             "height:0", "width:0")  # fmt: skip
_MAY_HIDE_RE = re.compile("|".join(re.escape(word) for word in _MAY_HIDE))
_SIMPLE_SELECTOR = re.compile(r"^([a-z][a-z0-9]*)?((?:[.#][\w-]+)*)$", re.I)
_SELECTOR_PART = re.compile(r"([.#])([\w-]+)")
# Invisible characters dropped wherever they are; and the ones dropped between ASCII letters
# only (zero-width (non-)joiners shape Persian, Indic scripts and emoji; marks order bidi text).
_ALWAYS = "\u00ad\u180e\u200b\u2060\ufeff\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_BETWEEN_LETTERS = re.compile(r"(?<=[A-Za-z0-9])[\u200c\u200d\u200e\u200f\u061c]+(?=[A-Za-z0-9])")
_ALWAYS_RE = re.compile(f"[{_ALWAYS}\U000e0000-\U000e007f]+")
_OFF_SCREEN_PX = 999.0
_SEE_THROUGH = ("none", "transparent", "inherit", "initial", "unset")
_Rule = tuple[str | None, frozenset[str], str | None]
"""A simple selector: tag (or None), classes, id (or None)."""
_CANDIDATES = etree.XPath("//*[@style or @hidden or @aria-hidden]")
_STYLED_DESCENDANTS = etree.XPath(".//*[@style]")
_CANDIDATES_CSS = etree.XPath("//*[@style or @hidden or @aria-hidden or @class or @id]")


def remove_hidden(tree: HtmlElement) -> int:
    """Remove hidden elements from `tree` in place; returns how many were removed."""
    hidden_rules = _index_rules(_stylesheet_rules(tree))
    doomed: list[HtmlElement] = list(tree.iter(*_DROP_TAGS))
    if not hidden_rules:
        candidates = _CANDIDATES(tree)
    elif any(not key.startswith((".", "#")) for key in hidden_rules):
        candidates = [el for el in tree.iter() if isinstance(el.tag, str)]  # a tag rule
    else:
        candidates = _CANDIDATES_CSS(tree)
    for el in candidates:  # selected by XPath in C: most elements have none of these
        attrib = el.attrib
        if ("hidden" in attrib and attrib["hidden"].lower() != "until-found") or (
            attrib.get("aria-hidden", "").strip().lower() == "true"
        ):
            doomed.append(el)
        elif "style" in attrib and hides(decls := _declarations(attrib["style"]), el):
            if _sizes_children(el, decls):
                _hollow(el)  # `font-size:0` between inline blocks: a layout trick
            else:
                doomed.append(el)
        elif hidden_rules and _matches(el, hidden_rules):
            doomed.append(el)
    removed = 0
    for el in doomed:
        parent = el.getparent()
        if parent is None or not _attached(el, tree):
            continue  # the root, or inside an element already removed
        el.drop_tree()  # keeps el.tail in the parent
        removed += 1
    return removed


def _sizes_children(el: HtmlElement, decls: dict[str, str]) -> bool:
    """Whether `font-size:0` is all that hides `el` and a descendant sets its own size.

    A zero font size on a container removes the gaps between inline-block children, which
    set their own size and are seen: only the container's own text is hidden then.
    """
    if not _is_zero(decls.get("font-size")):
        return False
    if hides({k: v for k, v in decls.items() if k != "font-size"}, el):
        return False
    return any(_sized(child) for child in _STYLED_DESCENDANTS(el))


def _sized(el: HtmlElement) -> bool:
    size = _declarations(el.attrib.get("style", "")).get("font-size")
    if size is None or _is_zero(size) or size in ("inherit", "unset"):
        return False
    match = _LENGTH.match(size)  # em, %, ex, ch of a zero size are zero; rem, px are not
    return match is None or match.group(2) not in ("em", "%", "ex", "ch")


def _hollow(el: HtmlElement) -> None:
    """Drop the text a zero-size container shows itself: its own, and that of children
    that do not set their own size (children that do are kept, and hollowed in turn)."""
    el.text = None
    for child in list(el):
        child.tail = None
        if not isinstance(child.tag, str) or _sized(child):
            continue
        if any(_sized(d) for d in _STYLED_DESCENDANTS(child)):
            _hollow(child)
        else:
            el.remove(child)


def _attached(el: HtmlElement, root: HtmlElement) -> bool:
    node: HtmlElement | None = el
    while node is not None and node is not root:
        node = node.getparent()
    return node is root


def strip_invisible(text: str) -> str:
    """`text` without the invisible characters that split or hide words (see module doc)."""
    if text.isascii():
        return text
    return _BETWEEN_LETTERS.sub("", _ALWAYS_RE.sub("", text))


def _declarations(style: str) -> dict[str, str]:
    """`prop: value` pairs, lower-cased, spaces squeezed, `!important` dropped; last one wins."""
    out: dict[str, str] = {}
    for part in style.split(";"):
        name, colon, value = part.partition(":")
        if colon:
            value = _IMPORTANT.sub("", " ".join(value.lower().split()))
            out["".join(name.lower().split())] = value
    return out


def hides(decls: dict[str, str], el: HtmlElement | None = None) -> bool:
    """Whether these declarations make an element's text invisible to a reader."""
    if not decls:
        return False
    if decls.get("display") == "none" or decls.get("visibility") in ("hidden", "collapse"):
        return True
    if _is_zero(decls.get("font-size")) or _is_zero(decls.get("opacity")):
        return True
    colour = decls.get("color")
    if colour is not None and (_transparent(colour) or _same_as_background(colour, decls, el)):
        return True
    if _far_negative(decls.get("text-indent")) or _far_negative(decls.get("margin-left")):
        return True
    if decls.get("position") in ("absolute", "fixed", "relative") and any(
        _far_negative(decls.get(side)) for side in ("left", "top", "right")
    ):
        return True
    if "scale(0" in decls.get("transform", "") or "inset(50%" in decls.get("clip-path", ""):
        return True
    clipped = decls.get("overflow") == "hidden" or "rect(0" in decls.get("clip", "")
    return clipped and (_is_zero(decls.get("height")) or _is_zero(decls.get("width"))
                        or decls.get("height") == "1px")  # fmt: skip


def _is_zero(value: str | None) -> bool:
    if not value:
        return False
    match = _LENGTH.match(value)
    try:
        return match is not None and float(match.group(1)) == 0.0
    except ValueError:
        return False


def _far_negative(value: str | None) -> bool:
    if not value:
        return False
    match = _LENGTH.match(value)
    if match is None:
        return False
    try:
        number = float(match.group(1))
    except ValueError:
        return False
    unit = match.group(2) or "px"
    return number * (16.0 if unit in ("em", "rem") else 1.0) <= -_OFF_SCREEN_PX or (
        unit in ("%", "vw") and number <= -100
    )


def _transparent(colour: str) -> bool:
    if colour == "transparent" or _HSLA_ZERO.search(colour):
        return True
    match = _RGB.match(colour)
    if match and match.group(4) is not None:
        alpha = match.group(4)
        return float(alpha.rstrip("%") or 1) == 0.0
    return (
        colour.startswith("#")
        and len(colour) in (5, 9)
        and colour[-(len(colour) // 4) :]
        in (
            "0",
            "00",
        )
    )


def _hex(colour: str) -> str | None:
    """A solid colour as 6 lower-case hex digits, or None when not understood."""
    colour = colour.strip()
    if colour in _NAMED_COLOURS:
        return _NAMED_COLOURS[colour]
    if colour.startswith("#") and len(colour) in (4, 7):
        digits = colour[1:]
        return "".join(c * 2 for c in digits) if len(digits) == 3 else digits
    match = _RGB.match(colour)
    if match and match.group(4) is None:
        try:
            return "".join(f"{min(255, int(float(g))):02x}" for g in match.groups()[:3])
        except ValueError:
            return None
    return None


def _background(decls: dict[str, str]) -> str | None:
    """The solid background colour declared, "?" for one not understood (an image, a
    gradient, a translucent colour: it stops the walk up), None for none."""
    value = decls.get("background-color") or decls.get("background")
    if not value or value.split()[0] in _SEE_THROUGH:
        return None
    return _hex(value.split()[0]) or "?"


def _same_as_background(colour: str, decls: dict[str, str], el: HtmlElement | None) -> bool:
    """Text colour equal to the nearest inline background (own or an ancestor's)."""
    text = _hex(colour)
    if text is None:
        return False
    node = el
    background = _background(decls)
    while background is None and node is not None:
        node = node.getparent()
        if node is not None and "style" in node.attrib:
            background = _background(_declarations(node.attrib["style"]))
    return background == text


# --- the page's own <style> ------------------------------------------------------------


def _stylesheet_rules(tree: HtmlElement) -> list[_Rule]:
    """Simple selectors whose top-level rules hide: (tag, classes, id) triples."""
    rules: list[_Rule] = []
    for style in tree.iter("style"):
        css = style.text or ""
        if style.get("media", "all").strip().lower() not in ("all", "screen", ""):
            continue  # print-only or conditional: not what a reader of the screen sees
        for selectors, body in _top_level_rules(_COMMENT.sub("", css) if "/*" in css else css):
            if hides(_declarations(body)):
                rules.extend(_parse_selectors(selectors))
    return rules


def _top_level_rules(css: str) -> Iterator[tuple[str, str]]:
    """(selector list, declarations) of the rules outside at-rules whose text may hide."""
    if "@" in css:
        css = _without_at_rules(css)
    for rule in css.split("}"):
        selectors, brace, body = rule.rpartition("{")
        # Most rules of a sheet cannot hide: a search of their squeezed text skips them.
        if brace and _MAY_HIDE_RE.search("".join(body.lower().split())):
            yield selectors.strip(), body


def _without_at_rules(css: str) -> str:
    """`css` without its at-rules (`@media … { … }` blocks whole, `@import …;` statements)."""
    kept, i = [], 0
    while (at := css.find("@", i)) >= 0:
        kept.append(css[i:at])
        brace, semi = css.find("{", at), css.find(";", at)
        if brace < 0 or 0 <= semi < brace:
            i = len(css) if semi < 0 else semi + 1
            continue
        depth, i = 0, len(css)
        for match in _BRACE.finditer(css, brace):
            depth += 1 if match.group() == "{" else -1
            if depth == 0:
                i = match.end()
                break
    kept.append(css[i:])
    return "".join(kept)


def _parse_selectors(
    selectors: str,
) -> Iterable[_Rule]:
    for selector in selectors.split(","):
        match = _SIMPLE_SELECTOR.match(selector.strip())
        if match is None or not selector.strip():
            continue  # descendant, pseudo-class, attribute: not evaluated
        parts = _SELECTOR_PART.findall(match.group(2) or "")
        classes = frozenset(name for kind, name in parts if kind == ".")
        ids = [name for kind, name in parts if kind == "#"]
        tag = match.group(1).lower() if match.group(1) else None
        if tag in ("html", "body", "head") or (tag is None and not classes and not ids):
            continue
        yield tag, classes, ids[0] if ids else None


def _index_rules(rules: Iterable[_Rule]) -> dict[str, list[_Rule]]:
    """Rules by a key every element they match must have: `.class`, `#id` or the tag."""
    index: dict[str, list[_Rule]] = {}
    for rule in rules:
        tag, classes, rule_id = rule
        key = f"#{rule_id}" if rule_id else f".{min(classes)}" if classes else str(tag)
        index.setdefault(key, []).append(rule)
    return index


def _matches(el: HtmlElement, rules: dict[str, list[_Rule]]) -> bool:
    classes = frozenset(el.attrib.get("class", "").split())
    el_id = el.attrib.get("id")
    tag = el.tag.lower() if isinstance(el.tag, str) else ""
    keys = [f".{name}" for name in classes] + ([f"#{el_id}"] if el_id else []) + [tag]
    return any(
        (rule_tag is None or rule_tag == tag)
        and rule_classes <= classes
        and (rule_id is None or rule_id == el_id)
        for key in keys
        for rule_tag, rule_classes, rule_id in rules.get(key, ())
    )
