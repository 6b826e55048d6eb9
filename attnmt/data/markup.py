"""Inline markup carried through translation (``translate --markup``, the server's ``"markup": true``).

A source line with inline tags (``<b>``, ``<a href="...">``, ``<br/>``, nested) and entities is split
into the text to translate and its tags, each tag knowing the words it wraps (``parse_markup``); once the
text is translated and aligned, each tag is put back around the target words linked to its source words
(``place_tags``). Words are ``words.segment``'s, as ``attnmt align`` counts them.

What is read: start tags, end tags and self-closing tags as Python's ``html.parser`` finds them (the start
tag's text, attributes and quoting, is kept verbatim); HTML's void elements (``br``, ``img``, ``hr``, ...)
written without a slash count as self-closing; entities ``&name;`` (HTML's named ones) and ``&#233;`` /
``&#xE9;``. Refused with a ``MarkupError`` that names the column: an end tag that does not close the
innermost open tag, a tag left open, a ``<`` that starts no tag, a ``&`` that starts no entity, an unknown
entity, and comments, CDATA sections, processing instructions and declarations (inline markup only: a
comment has no words to go with, and would otherwise be lost silently).
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html.entities import html5
from html.parser import HTMLParser

from .words import segment

VOID_ELEMENTS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                           "param", "source", "track", "wbr"})
"""HTML elements that never have content: ``<br>`` without a slash is self-closing too."""
_TAG_NAME = re.compile(r"<([^\s/>]+)")
_END_TAG = re.compile(r"</([^\s/>]+)\s*>")
_ENTITY = re.compile(r"&(?:#([0-9]{1,8})|#[xX]([0-9a-fA-F]{1,8})|([A-Za-z][A-Za-z0-9]*));")


class MarkupError(ValueError):
    """A source that is not well-formed markup; the message says where (``column 17: ...``)."""


@dataclass(frozen=True)
class Tag:
    name: str  # the element name as written ("a", "B")
    open_text: str  # the start tag verbatim: '<a href="x">', '<br/>'
    close_text: str | None  # '</a>' (the name as written in the start tag); None: self-closing or void
    start: int  # the first source word it wraps (0-based, words of ``MarkedText.text``)
    end: int  # one past the last; start == end: wraps no word, placed before word ``start``
    parent: int | None  # index in ``MarkedText.tags`` of the tag around it; None at the top


@dataclass(frozen=True)
class MarkedText:
    text: str  # what gets translated: tags removed, entities decoded
    tags: list[Tag]  # in the order of their start tags


def has_markup(source: str) -> bool:
    """Whether ``source`` holds a ``<`` or a ``&``: a tag, an entity, or something ``parse_markup`` refuses.
    False: ``parse_markup`` gives the text back as it is, with no tags."""
    return "<" in source or "&" in source


# -------------------------------------------------------------------------------------------- parsing


@dataclass
class _Open:
    """A tag while the parse runs: its place in the text (characters) until its end tag comes."""

    name: str
    open_text: str
    close_text: str | None
    column: int  # where its start tag is in the source (0-based offset)
    parent: int | None
    char_start: int
    char_end: int = -1


class _TagScanner(HTMLParser):
    """The tags, comments and declarations of a source and where each starts; text between them is
    read by ``parse_markup`` itself (``html.parser`` forgives a bare ``&`` or ``<``; markup here may not)."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=False)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", source)]
        self.events: list[tuple[str, int, str]] = []  # (kind, offset in source, text)

    def _offset(self) -> int:
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def handle_starttag(self, tag, attrs) -> None:
        kind = "empty" if tag in VOID_ELEMENTS else "start"
        self.events.append((kind, self._offset(), self.get_starttag_text()))

    def handle_startendtag(self, tag, attrs) -> None:
        self.events.append(("empty", self._offset(), self.get_starttag_text()))

    def handle_endtag(self, tag) -> None:
        self.events.append(("end", self._offset(), ""))

    def handle_comment(self, data) -> None:
        self.events.append(("a comment", self._offset(), ""))

    def handle_decl(self, decl) -> None:
        self.events.append(("a declaration", self._offset(), ""))

    def unknown_decl(self, data) -> None:
        self.events.append(("a CDATA section or declaration", self._offset(), ""))

    def handle_pi(self, data) -> None:
        self.events.append(("a processing instruction", self._offset(), ""))


def _where(source: str, offset: int) -> str:
    """``column C`` (1-based) of a one-line source, ``line L, column C`` of a longer one."""
    line = source.count("\n", 0, offset)
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return f"line {line + 1}, column {column}" if "\n" in source else f"column {column}"


def _decode_text(source: str, start: int, end: int) -> str:
    """The text of ``source[start:end]`` (no tags in it) with its entities decoded; MarkupError for a ``<``
    or a ``&`` that starts no entity, and for an entity that names no character."""
    raw, out, pos = source[start:end], [], 0
    for k, char in enumerate(raw):
        if char == "<":
            raise MarkupError(f"{_where(source, start + k)}: a '<' that starts no tag (write &lt;)")
    while (amp := raw.find("&", pos)) >= 0:
        out.append(raw[pos:amp])
        match = _ENTITY.match(raw, amp)
        where = _where(source, start + amp)
        if match is None:
            raise MarkupError(f"{where}: a '&' that starts no entity (write &amp;)")
        decimal, hexadecimal, name = match.groups()
        if name is not None:
            if name + ";" not in html5:
                raise MarkupError(f"{where}: unknown entity {match.group(0)}")
            out.append(html5[name + ";"])
        else:
            code = int(decimal) if decimal is not None else int(hexadecimal, 16)
            if not (0 < code <= 0x10FFFF) or 0xD800 <= code <= 0xDFFF:
                raise MarkupError(f"{where}: {match.group(0)} names no character")
            out.append(chr(code))
        pos = match.end()
    out.append(raw[pos:])
    return unicodedata.normalize("NFC", "".join(out))


def _tag_end(source: str, kind: str, offset: int, text: str) -> int:
    """Where an event's text ends in ``source`` (one past its ``>``); MarkupError for what may not be."""
    if kind in ("start", "empty"):
        return offset + len(text)
    if kind == "end":
        match = _END_TAG.match(source, offset)
        if match is None:
            raise MarkupError(f"{_where(source, offset)}: a malformed end tag")
        return match.end()
    raise MarkupError(f"{_where(source, offset)}: {kind} is not inline markup: only tags and entities "
                      "are carried through a translation")


def parse_markup(source: str) -> MarkedText:
    """The text of ``source`` (tags taken out, entities decoded, NFC) and its tags, each with the words of
    the text it wraps (a tag that starts or ends inside a word wraps that whole word). MarkupError, naming
    the column, where ``source`` is not well-formed (the module's docstring says what is read)."""
    scanner = _TagScanner(source)
    scanner.feed(source)
    scanner.close()
    pieces: list[str] = []
    opened: list[_Open] = []
    stack: list[int] = []
    length = pos = 0  # characters of text so far; where the source's unread part starts
    for kind, offset, text in scanner.events:
        end = _tag_end(source, kind, offset, text)
        pieces.append(_decode_text(source, pos, offset))
        length += len(pieces[-1])
        pos = end
        if kind == "end":
            _close(source, offset, end, opened, stack, length)
            continue
        name = _TAG_NAME.match(text).group(1)
        close = None if kind == "empty" else f"</{name}>"
        opened.append(_Open(name, text, close, offset, stack[-1] if stack else None, length))
        if kind == "empty":
            opened[-1].char_end = length
        else:
            stack.append(len(opened) - 1)
    pieces.append(_decode_text(source, pos, len(source)))
    if stack:
        tag = opened[stack[-1]]
        raise MarkupError(f"{_where(source, tag.column)}: <{tag.name}> is never closed")
    text = "".join(pieces)
    if not unicodedata.is_normalized("NFC", text):  # clean() would join across a tag: words would shift
        raise MarkupError("a tag stands between a character and the accent or mark that composes with it")
    return MarkedText(text, _word_tags(text, opened))


def _close(source: str, offset: int, end: int, opened: list[_Open], stack: list[int], length: int) -> None:
    """An end tag at ``offset``: it must close the innermost open tag."""
    written = source[offset:end]
    name = _END_TAG.match(written).group(1)
    if not stack:
        void = f" (a void element: write <{name}/>)" if name.lower() in VOID_ELEMENTS else ""
        raise MarkupError(f"{_where(source, offset)}: {written} closes nothing{void}")
    innermost = opened[stack[-1]]
    if name.lower() != innermost.name.lower():
        raise MarkupError(f"{_where(source, offset)}: {written} closes <{innermost.name}> (opened at "
                          f"{_where(source, innermost.column)})")
    innermost.char_end = length
    stack.pop()


def _word_tags(text: str, opened: Sequence[_Open]) -> list[Tag]:
    """Character ranges of the text -> ranges of its words: every word a range touches."""
    spans = word_spans(text)
    tags = []
    for tag in opened:
        start = sum(1 for _, end in spans if end <= tag.char_start)
        end = sum(1 for begin, _ in spans if begin < tag.char_end)
        end = max(end, start) if tag.char_end > tag.char_start else start
        tags.append(Tag(tag.name, tag.open_text, tag.close_text, start, end, tag.parent))
    return tags


def word_spans(line: str) -> list[tuple[int, int]]:
    """The character range of each word of ``line`` (``words.segment``'s words, in order): each word's
    characters found in turn, since the cleaned line the words come from is ``line`` with characters taken
    out or turned into spaces (``line`` must be NFC, as cleaning makes it)."""
    spans, pos = [], 0
    for word in segment(line):
        start = pos = line.index(word.text[0], pos)
        for char in word.text[1:]:
            pos = line.index(char, pos + 1)
        spans.append((start, pos + 1))
        pos += 1
    return spans


# -------------------------------------------------------------------------------------------- placing


@dataclass
class _Node:
    """A placed tag in the output's tree: its target word range [start, end) (start == end: at the
    boundary before word ``start``) and the tags inside it."""

    tag: int | None  # index in the tags; None for the root
    start: int
    end: int
    children: list[_Node] = field(default_factory=list)


def place_tags(marked: MarkedText, target: str, links: Iterable[tuple[int, int]]) -> str:
    """``target`` (a translation of ``marked.text``, NFC-normalised) as markup: its text escaped (``&``,
    ``<``, ``>``) and every tag of ``marked`` put back once, the output well-formed. ``links``: (source
    word, target word) pairs, words as ``words.segment`` counts them; tags go in by character offsets, so
    the target keeps its own spacing.

    The placement rule: a pair tag wrapping source words [start, end) goes around the smallest contiguous
    target span covering every target word linked to one of those words. Nesting is kept: a tag is clipped
    into its parent's span, and a tag whose span partly overlaps one placed before it (in source order) is
    cut back to its part outside that one, so the output nests. A tag whose words have no link, an empty
    pair and a self-closing tag go where the nearest linked source word before them went (after that
    word's target words), or at the start; inside their parent."""
    target = unicodedata.normalize("NFC", target)
    spans = word_spans(target)
    n_src = len(segment(marked.text))
    linked: list[list[int]] = [[] for _ in range(n_src)]
    for i, j in links:
        if not (0 <= i < n_src and 0 <= j < len(spans)):
            raise ValueError(f"link {i}-{j} is outside {n_src} source words and {len(spans)} target words")
        linked[i].append(j)
    placed = _target_ranges(marked.tags, linked)
    return _render(_tree(marked.tags, placed, len(spans)), marked.tags, target, spans)


def _target_ranges(tags: Sequence[Tag], linked: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Each tag's target word range by the placement rule (``place_tags``), in tag order: the ranges of
    any two tags are disjoint or one holds the other."""
    placed: list[tuple[int, int]] = []
    for tag in tags:
        hits = [j for i in range(tag.start, tag.end) for j in linked[i]]
        if hits and tag.close_text is not None:
            start, end = min(hits), max(hits) + 1
        else:
            start = end = next((max(linked[i]) + 1 for i in range(tag.start - 1, -1, -1) if linked[i]), 0)
        if tag.parent is not None:
            low, high = placed[tag.parent]
            start, end = min(max(start, low), high), min(max(end, low), high)
        placed.append(_nested(start, end, placed))
    return placed


def _nested(start: int, end: int, placed: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """[start, end) cut back until it partly overlaps none of ``placed`` (each cut keeps the part outside
    the one it overlaps, and only shrinks the range, so this ends)."""
    changed = start < end
    while changed:
        changed = False
        for low, high in placed:
            if start < low < end < high:
                end, changed = low, True
            elif low < start < high < end:
                start, changed = high, True
    return start, end


def _tree(tags: Sequence[Tag], placed: Sequence[tuple[int, int]], n_words: int) -> _Node:
    """The placed tags as the output's tree: tags with words by containment (of two with the same range,
    the earlier outside), then each tag without words inside its parent, in the innermost tag whose range
    holds its boundary strictly inside."""
    root = _Node(None, 0, n_words)
    nodes: dict[int, _Node] = {}
    stack = [root]
    with_words = [t for t, (start, end) in enumerate(placed) if start < end]
    for t in sorted(with_words, key=lambda t: (placed[t][0], -placed[t][1], t)):
        start, end = placed[t]
        while not (stack[-1].start <= start and end <= stack[-1].end):
            stack.pop()
        nodes[t] = _Node(t, start, end)
        stack[-1].children.append(nodes[t])
        stack.append(nodes[t])
    for t, (start, end) in enumerate(placed):
        if start < end:
            continue
        host = nodes[tags[t].parent] if tags[t].parent is not None else root
        while (inner := next((c for c in host.children if c.start < start < c.end), None)) is not None:
            host = inner
        nodes[t] = _Node(t, start, start)
        host.children.append(nodes[t])
    return root


def _render(root: _Node, tags: Sequence[Tag], target: str, spans: Sequence[tuple[int, int]]) -> str:
    """The tree written out: each tag with words opens before its first word and closes after its last;
    a tag without words goes right after the word before its boundary; the target's text between, escaped,
    in order (a cursor that only moves forward, so every character is written once)."""
    out: list[str] = []
    cursor = 0

    def text_to(offset: int) -> None:
        nonlocal cursor
        if offset > cursor:
            out.append(html.escape(target[cursor:offset], quote=False))
            cursor = offset

    def ordered(node: _Node):
        return iter(sorted(node.children, key=lambda c: (c.start, c.start < c.end, c.tag)))

    walk = [(root, ordered(root))]
    while walk:
        node, children = walk[-1]
        child = next(children, None)
        if child is None:
            walk.pop()
            tag = tags[node.tag] if node.tag is not None else None
            if tag is not None and tag.close_text is not None:
                if node.start < node.end:
                    text_to(spans[node.end - 1][1])
                out.append(tag.close_text)
            continue
        if child.start < child.end:
            text_to(spans[child.start][0])
        elif child.start > 0:
            text_to(spans[child.start - 1][1])
        out.append(tags[child.tag].open_text)
        walk.append((child, ordered(child)))
    text_to(len(target))
    return "".join(out)
