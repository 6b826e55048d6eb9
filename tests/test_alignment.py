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


