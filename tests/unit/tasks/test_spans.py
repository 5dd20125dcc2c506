"""Span marking for WiC (character offsets) and WSC (word indices)."""

from __future__ import annotations

import pytest

from mtft.tasks.spans import CharSpan, mark_char_spans, word_span


def test_char_spans_are_wrapped_in_their_markers():
    text = "The match burned his fingers."
    assert mark_char_spans(text, [CharSpan(4, 9, "*", "*")]) == "The *match* burned his fingers."
    two = [CharSpan(21, 28, "#", "#"), CharSpan(0, 3, "[", "]")]  # any order
    assert mark_char_spans(text, two) == "[The] match burned his #fingers#."


@pytest.mark.parametrize("span", [CharSpan(5, 40, "*", "*"), CharSpan(-1, 2, "*", "*"), CharSpan(3, 3, "*", "*")])
def test_char_spans_outside_the_text_are_refused(span):
    with pytest.raises(ValueError, match="outside the text"):
        mark_char_spans("short text", [span])


def test_overlapping_spans_are_refused():
    with pytest.raises(ValueError, match="overlaps"):
        mark_char_spans("one two three", [CharSpan(0, 7, "*", "*"), CharSpan(4, 9, "#", "#")])


def test_word_spans_follow_whitespace_words_and_compare_loosely():
    text = "Mark told Pete many lies about himself, which Pete included in his book."
    span, matches = word_span(text, 0, "Mark")
    assert (text[span.start : span.end], matches) == ("Mark", True)
    span, matches = word_span(text, 4, "lies about himself")  # three words from index 4
    assert (text[span.start : span.end], matches) == ("lies about himself,", True)  # edge punctuation ignored
    span, matches = word_span(text, 11, "He")  # "his": the text at the index differs -> reported
    assert (text[span.start : span.end], matches) == ("his", False)
    with pytest.raises(ValueError, match="outside the text"):
        word_span(text, 40, "x")
