"""links.py on its own: links extracted from hand-made matrices, Pharaoh read and written, and AER,
precision and recall computed by hand (Och & Ney 2003)."""

from __future__ import annotations

import numpy as np
import pytest

from attnmt.insight import links

# ---------------------------------------------------------------------------------------- alignments


def test_argmax_and_threshold_extraction_on_a_hand_made_matrix():
    m = np.array([
        [0.1, 0.7, 0.2],  # target word 0 -> source word 1
        [0.6, 0.1, 0.3],  # target word 1 -> source word 0
        [0.0, 0.45, 0.55],  # target word 2 -> source word 2 (and 1 above 0.4)
    ])  # fmt: skip
    assert links.extract_alignment(m, "argmax") == [(0, 1), (1, 0), (2, 2)]
    assert links.extract_alignment(m, "threshold", 0.4) == [(0, 1), (1, 0), (1, 2), (2, 2)]
    assert links.extract_alignment(np.zeros((0, 3))) == []
    with pytest.raises(ValueError, match="method"):
        links.extract_alignment(m, "intersect")
    assert links.format_pharaoh([(1, 0), (0, 1)]) == "0-1 1-0"
    assert links.format_pharaoh([(0, 1)], one_based=True) == "1-2"


def test_mutual_keeps_only_links_that_are_the_argmax_both_ways():
    m = np.array([
        [0.8, 0.1, 0.1],  # target 0 -> source 0; source 0's best target is 0: kept
        [0.5, 0.3, 0.2],  # target 1 -> source 0, but source 0 prefers target 0: dropped (unaligned)
        [0.1, 0.6, 0.3],  # target 2 -> source 1, and source 1's best target is 2: kept
        [0.1, 0.2, 0.7],  # target 3 -> source 2, source 2's best: kept
    ])  # fmt: skip
    assert links.extract_alignment(m, "argmax") == [(0, 0), (0, 1), (1, 2), (2, 3)]
    assert links.extract_alignment(m) == [(0, 0), (1, 2), (2, 3)]  # mutual is the default
    # Mutual links are the intersection of the two directions' argmax links.
    rng = np.random.default_rng(0)
    for _ in range(20):
        r = rng.dirichlet(np.ones(5), size=4)
        rows = {(int(r[j].argmax()), j) for j in range(4)}
        cols = {(i, int(r[:, i].argmax())) for i in range(5)}
        assert set(links.extract_alignment(r, "mutual")) == rows & cols


def _cross(T: int, S: int, layers: int = 2, heads: int = 2, seed: int = 0) -> list[np.ndarray]:
    """Random cross-attention of a pair with T target and S source pieces: (H, T + 1, S + 1) per layer."""
    rng = np.random.default_rng(seed)
    return [rng.dirichlet(np.ones(S + 1), size=(heads, T + 1)) for _ in range(layers)]


def test_attention_rows_selects_layer_heads_and_the_shifted_rows_and_masks_eos():
    cross = _cross(3, 4)
    # Layer 2, head 1, rows predicting each target piece (the EOS row dropped), the EOS column dropped
    # and every row renormalised over the real source pieces.
    m = links.attention_rows(cross, layer=1, heads=(0,))
    expected = cross[1][0, :3, :4] / cross[1][0, :3, :4].sum(-1, keepdims=True)
    np.testing.assert_allclose(m, expected)
    # Shift-Att: target piece t's row is the one where it is the decoder's input, one step later: row
    # t + 1 (row 0 reads BOS, the last row predicts EOS and reads the last piece).
    shifted = links.attention_rows(cross, layer=1, heads=(0,), shift=True)
    np.testing.assert_allclose(shifted, cross[1][0, 1:, :4] / cross[1][0, 1:, :4].sum(-1, keepdims=True))
    # Every layer and head averaged, then renormalised.
    mean = np.mean([layer[:, :3, :4] for layer in cross], axis=(0, 1))
    np.testing.assert_allclose(links.attention_rows(cross), mean / mean.sum(-1, keepdims=True))
    # The last layer's heads 1 and 2 averaged (-1 is the last).
    two = cross[1][:, :3, :4].mean(0)
    np.testing.assert_allclose(links.attention_rows(cross, -1, (0, 1)), two / two.sum(-1, keepdims=True))
    assert m.shape == shifted.shape == (3, 4) and np.allclose(m.sum(-1), 1)


def test_shift_finds_the_alignment_a_model_shows_one_step_late():
    # A decoder that attends to the source of the piece it reads (not the one it predicts): target piece
    # t is source piece 2 - t, shown at row t + 1. Unshifted argmax is off by one; shifted, exact.
    S = T = 3
    layer = np.full((1, T + 1, S + 1), 0.02)
    layer[0, 0, 0] = 1.0  # BOS row: anything
    for t in range(T):
        layer[0, t + 1, S - 1 - t] = 1.0
    layer /= layer.sum(-1, keepdims=True)
    rows = links.attention_rows([layer], shift=True)
    assert links.extract_alignment(rows, "argmax") == [(0, 2), (1, 1), (2, 0)]
    unshifted = links.attention_rows([layer])
    assert links.extract_alignment(unshifted, "argmax") != [(0, 2), (1, 1), (2, 0)]


def test_two_words_are_linked_if_any_of_their_pieces_are():
    from attnmt.data.words import membership_of

    # Source words: "Fahr rad" (pieces 0, 1) | "." (2); target: "bi cycle" (0, 1) | "." (2).
    src, tgt = membership_of([[0, 1], [2]], 3), membership_of([[0, 1], [2]], 3)
    assert links.words_from_piece_links([(1, 0), (0, 1), (2, 2)], src, tgt) == [(0, 0), (1, 1)]
    assert links.words_from_piece_links([(1, 2)], src, tgt) == [(0, 1)]  # one piece pair is enough
    # A CJK piece of two characters belongs to both of its character words: it links each of them.
    cjk = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])  # pieces "猫" | "喜欢" over words 猫 喜 欢
    assert links.words_from_piece_links([(1, 0)], cjk, tgt) == [(1, 0), (2, 0)]
    assert links.words_from_piece_links([], src, tgt) == []


def test_pharaoh_reading_sure_possible_and_one_based():
    sure, possible = links.parse_pharaoh("0-1 2?3 4p5")
    assert sure == {(0, 1)} and possible == {(0, 1), (2, 3), (4, 5)}
    assert links.parse_pharaoh("1-2 3?1", one_based=True) == ({(0, 1)}, {(0, 1), (2, 0)})
    assert links.parse_pharaoh("") == (set(), set())
    for bad in ("0-x", "0:1", "1--2", "-1-2"):
        with pytest.raises(ValueError, match="malformed"):
            links.parse_pharaoh(bad)
    with pytest.raises(ValueError, match="one-based"):
        links.parse_pharaoh("0-1", one_based=True)


def test_aer_of_gold_against_itself_is_zero_and_of_a_wrong_alignment_as_computed_by_hand():
    sure = [{(0, 0), (1, 1)}, {(0, 1)}]
    possible = [{(0, 0), (1, 1), (2, 1)}, {(0, 1), (1, 0)}]
    perfect = links.alignment_scores(sure, sure, possible)
    assert (perfect.aer, perfect.precision, perfect.recall) == (0.0, 1.0, 1.0)
    # A = {(0,0), (2,1), (1,2)} + {(1,1)}: |A| = 4, |S| = 3, |A∩S| = 1, |A∩P| = 2
    score = links.alignment_scores([{(0, 0), (2, 1), (1, 2)}, {(1, 1)}], sure, possible)
    assert score.aer == pytest.approx(1 - (1 + 2) / (4 + 3))
    assert score.precision == pytest.approx(2 / 4) and score.recall == pytest.approx(1 / 3)
    assert (score.predicted, score.sure, score.possible, score.sentences) == (4, 3, 5, 2)
    assert links.alignment_scores([set()], [set()], [set()]).aer == 0.0




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
    assert links.symmetrize(FORWARD, REVERSE, method) == expected


def test_final_and_adds_a_link_whose_words_are_both_unaligned():
    forward, reverse = {(0, 0), (2, 2)}, {(0, 0)}
    assert links.symmetrize(forward, reverse, "grow-diag") == {(0, 0)}  # 2-2 is no neighbour of 0-0
    assert links.symmetrize(forward, reverse, "grow-diag-final-and") == {(0, 0), (2, 2)}
    assert links.symmetrize(forward, reverse, "grow-diag-final") == {(0, 0), (2, 2)}


def test_grow_diag_only_grows_towards_unaligned_words():
    # 1-0 neighbours 0-0 and is in the union, but both its words are aligned already (by 0-0 and 1-1).
    forward, reverse = {(0, 0), (1, 1), (1, 0)}, {(0, 0), (1, 1)}
    assert links.symmetrize(forward, reverse, "grow-diag") == {(0, 0), (1, 1)}
    assert links.symmetrize(forward, reverse, "grow-diag-final") == {(0, 0), (1, 1)}
    with pytest.raises(ValueError, match="grow-diag-final-and"):
        links.symmetrize(forward, reverse, "grow")


def test_the_alignment_layer_s_eos_is_a_null_word_only_for_a_layer_taught_one():
    """A target word whose row peaks on the source's EOS is linked to nothing by a layer taught links (its
    null word); a layer that learnt by prediction was never taught one, and its row is read over the words."""
    from attnmt.insight.reading import read_links

    # one layer, one head; rows: 2 target words + EOS, columns: 2 source words + EOS
    layer = np.array([[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.0, 0.0, 1.0]]])
    groups = [[0], [1]]
    taught = links.AlignOptions(kind="align", method="argmax")
    assert read_links([layer], groups, groups, taught) == [(0, 0)]
    predicted = links.AlignOptions(kind="align", method="argmax", null=False)
    assert read_links([layer], groups, groups, predicted) == [(0, 0), (1, 1)]
