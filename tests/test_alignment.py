"""alignment.py on its own: links extracted from hand-made matrices, Pharaoh read and written, and AER,
precision and recall computed by hand (Och & Ney 2003)."""

from __future__ import annotations

import numpy as np
import pytest

from attnmt import alignment

# ---------------------------------------------------------------------------------------- alignments


def test_argmax_and_threshold_extraction_on_a_hand_made_matrix():
    m = np.array([
        [0.1, 0.7, 0.2],  # target word 0 -> source word 1
        [0.6, 0.1, 0.3],  # target word 1 -> source word 0
        [0.0, 0.45, 0.55],  # target word 2 -> source word 2 (and 1 above 0.4)
    ])  # fmt: skip
    assert alignment.extract_alignment(m) == [(0, 1), (1, 0), (2, 2)]
    assert alignment.extract_alignment(m, "threshold", 0.4) == [(0, 1), (1, 0), (1, 2), (2, 2)]
    assert alignment.extract_alignment(np.zeros((0, 3))) == []
    with pytest.raises(ValueError, match="method"):
        alignment.extract_alignment(m, "intersect")
    assert alignment.format_pharaoh([(1, 0), (0, 1)]) == "0-1 1-0"
    assert alignment.format_pharaoh([(0, 1)], one_based=True) == "1-2"


def test_pharaoh_reading_sure_possible_and_one_based():
    sure, possible = alignment.parse_pharaoh("0-1 2?3 4p5")
    assert sure == {(0, 1)} and possible == {(0, 1), (2, 3), (4, 5)}
    assert alignment.parse_pharaoh("1-2 3?1", one_based=True) == ({(0, 1)}, {(0, 1), (2, 0)})
    assert alignment.parse_pharaoh("") == (set(), set())
    for bad in ("0-x", "0:1", "1--2", "-1-2"):
        with pytest.raises(ValueError, match="malformed"):
            alignment.parse_pharaoh(bad)
    with pytest.raises(ValueError, match="one-based"):
        alignment.parse_pharaoh("0-1", one_based=True)


def test_aer_of_gold_against_itself_is_zero_and_of_a_wrong_alignment_as_computed_by_hand():
    sure = [{(0, 0), (1, 1)}, {(0, 1)}]
    possible = [{(0, 0), (1, 1), (2, 1)}, {(0, 1), (1, 0)}]
    perfect = alignment.alignment_scores(sure, sure, possible)
    assert (perfect.aer, perfect.precision, perfect.recall) == (0.0, 1.0, 1.0)
    # A = {(0,0), (2,1), (1,2)} + {(1,1)}: |A| = 4, |S| = 3, |A∩S| = 1, |A∩P| = 2
    score = alignment.alignment_scores([{(0, 0), (2, 1), (1, 2)}, {(1, 1)}], sure, possible)
    assert score.aer == pytest.approx(1 - (1 + 2) / (4 + 3))
    assert score.precision == pytest.approx(2 / 4) and score.recall == pytest.approx(1 / 3)
    assert (score.predicted, score.sure, score.possible, score.sentences) == (4, 3, 5, 2)
    assert alignment.alignment_scores([set()], [set()], [set()]).aer == 0.0




# ------------------------------------------------------------------------------------ symmetrization
# Worked by hand with Moses's grow-diag-final(-and) (Koehn et al. 2005): forward and reverse links of a
# 4-word pair. The intersection is {0-0, 1-1}; from 1-1 the union links 2-1 (side, source 2 unaligned) and
# 1-2 (side, target 2 unaligned) grow in, then 3-0 from 2-1 (corner, source 3 unaligned); 3-3 touches no
# link, so only -final adds it (its target word is unaligned; its source word is not, so not -final-and).
FORWARD = {(0, 0), (1, 1), (2, 1), (3, 3)}
REVERSE = {(0, 0), (1, 1), (1, 2), (3, 0)}
GROWN = {(0, 0), (1, 1), (2, 1), (1, 2), (3, 0)}


@pytest.mark.parametrize("method, expected", [
    ("intersection", {(0, 0), (1, 1)}),
    ("union", FORWARD | REVERSE),
    ("grow-diag", GROWN),
    ("grow-diag-final", GROWN | {(3, 3)}),
    ("grow-diag-final-and", GROWN),
])
def test_symmetrize_matches_the_moses_heuristics(method, expected):
    assert alignment.symmetrize(FORWARD, REVERSE, method) == expected


def test_final_and_adds_a_link_whose_words_are_both_unaligned():
    forward, reverse = {(0, 0), (2, 2)}, {(0, 0)}
    assert alignment.symmetrize(forward, reverse, "grow-diag") == {(0, 0)}  # 2-2 is no neighbour of 0-0
    assert alignment.symmetrize(forward, reverse, "grow-diag-final-and") == {(0, 0), (2, 2)}
    assert alignment.symmetrize(forward, reverse, "grow-diag-final") == {(0, 0), (2, 2)}


def test_grow_diag_only_grows_towards_unaligned_words():
    # 1-0 neighbours 0-0 and is in the union, but both its words are aligned already (by 0-0 and 1-1).
    forward, reverse = {(0, 0), (1, 1), (1, 0)}, {(0, 0), (1, 1)}
    assert alignment.symmetrize(forward, reverse, "grow-diag") == {(0, 0), (1, 1)}
    assert alignment.symmetrize(forward, reverse, "grow-diag-final") == {(0, 0), (1, 1)}
    with pytest.raises(ValueError, match="grow-diag-final-and"):
        alignment.symmetrize(forward, reverse, "grow")
