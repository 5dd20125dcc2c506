"""Mark spans in a text with visible delimiters, so that a sentence-level head sees *which* words a task is about.

SuperGLUE's WiC (a word, by character offsets, in two sentences) and WSC (a noun phrase and a pronoun, by word
index) ask about particular words. Rather than a span-pooling head, the spans are marked in the text itself
(``The *match* burned``, ``*The trophy* does not fit ... because #it# is too big``), as T5 does for WSC: any
tokenizer encodes the markers, and the ordinary first-token classifier learns to read them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

_EDGE_PUNCTUATION = re.compile(r"^\W+|\W+$")


@dataclass(frozen=True)
class CharSpan:
    start: int
    end: int  # exclusive
    open: str
    close: str


def mark_char_spans(text: str, spans: Sequence[CharSpan]) -> str:
    """``text`` with each span wrapped in its markers. Spans must lie in the text and must not overlap."""
    out, position = [], 0
    for span in sorted(spans, key=lambda s: s.start):
        if not 0 <= span.start < span.end <= len(text) or span.start < position:
            raise ValueError(f"span [{span.start}, {span.end}) is outside the text or overlaps another span")
        out += [text[position : span.start], span.open, text[span.start : span.end], span.close]
        position = span.end
    return "".join(out + [text[position:]])


def word_span(text: str, index: int, span_text: str) -> tuple[CharSpan, bool]:
    """The characters of the ``len(span_text.split())`` words of ``text`` starting at word ``index`` (words
    split on whitespace, as WSC's indices are), and whether those words are ``span_text`` (compared without
    case and edge punctuation: WSC's ``span2_text`` "it" marks the word "it," too).

    Markers are left empty; the caller picks them."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    length = max(1, len(span_text.split()))
    if not 0 <= index < len(words):
        raise ValueError(f"word index {index} is outside the text ({len(words)} words)")
    last = min(index + length, len(words)) - 1
    start, end = words[index][0], words[last][1]
    found = [_bare(w) for w in text[start:end].split()]
    return CharSpan(start, end, "", ""), found == [_bare(w) for w in span_text.split()]


def _bare(word: str) -> str:
    return _EDGE_PUNCTUATION.sub("", word).lower()
