"""insight/markup.py without a model: the growth of links into words both sides left unlinked, checked
against pairs written out by hand, and the issue's example placed with the mutual argmax's links grown.
``carry_markup`` on trained models: tests/cli/test_cli_markup.py."""

from __future__ import annotations

from attnmt.data.markup import parse_markup, place_tags
from attnmt.insight.reading import grow_unlinked

SOURCE = "<b>tuesday</b> , march 14th , 2019 at <i>7:05 pm</i>"
TARGET = "dienstag , 14. märz 2019 um 19:05 uhr"
# What the mutual argmax reads off the toy models (attnmt align): pm and uhr unlinked.
MUTUAL = [(0, 0), (1, 1), (2, 3), (3, 2), (5, 4), (6, 5), (7, 6)]


def test_unlinked_words_at_a_corner_of_a_link_are_linked():
    assert grow_unlinked(MUTUAL, 9, 8) == sorted(MUTUAL + [(8, 7)])
    assert place_tags(parse_markup(SOURCE), TARGET, grow_unlinked(MUTUAL, 9, 8)) == (
        "<b>dienstag</b> , 14. märz 2019 um <i>19:05 uhr</i>")
    assert place_tags(parse_markup(SOURCE), TARGET, MUTUAL) == (  # without: uhr is outside the tag
        "<b>dienstag</b> , 14. märz 2019 um <i>19:05</i> uhr")


def test_growth_keeps_to_unlinked_pairs_inside_the_sentence():
    assert grow_unlinked([(0, 0)], 1, 3) == [(0, 0)]  # no source word left to link
    assert grow_unlinked([(1, 1)], 3, 3) == [(0, 0), (1, 1), (2, 2)]
    assert grow_unlinked([(1, 1), (2, 0)], 3, 3) == [(0, 2), (1, 1), (2, 0)]  # along the other diagonal
    assert grow_unlinked([(0, 0), (0, 1)], 2, 2) == [(0, 0), (0, 1)]  # a linked word takes no more
    assert grow_unlinked([], 3, 3) == []
    # a chain of unlinked pairs is followed to its end
    assert grow_unlinked([(0, 0)], 4, 4) == [(0, 0), (1, 1), (2, 2), (3, 3)]

