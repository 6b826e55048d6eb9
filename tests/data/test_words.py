"""words.py on its own: which pieces make up a word, in spaced text (the "▁" marks) and in Chinese
(pre-segmented text as given, unsegmented text by characters, UTF-8 byte pieces as the character they spell),
and attention merged from pieces into words, checked against sums and means written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from attnmt.data import words
from attnmt.data.words import Word

SRC = ["▁tues", "day", "▁,", "▁march", "▁14", "th", "</s>"]


def weights(heads: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Attention-like weights (heads, rows, cols): every row sums to 1."""
    w = np.random.default_rng(seed).random((heads, rows, cols))
    return w / w.sum(-1, keepdims=True)




def test_word_groups_follow_the_word_start_marks():
    assert words.word_groups(SRC) == [[0, 1], [2], [3], [4, 5], [6]]
    assert words.word_labels(SRC, words.word_groups(SRC)) == ["tuesday", ",", "march", "14th", "</s>"]
    assert words.word_groups(["<s>", "▁", "2019", "▁x"]) == [[0], [1, 2], [3]]
    # a first piece without the mark still starts a word
    assert words.word_groups(["ab", "▁c"]) == [[0], [1]]


def test_merge_words_sums_source_pieces_and_averages_target_pieces():
    w = weights(1, 4, len(SRC))[0]  # rows: target pieces
    rows = ["▁dien", "stag", "▁,", "</s>"]
    merged, row_words, col_words = words.merge_words(w, rows, SRC)
    assert row_words == ["dienstag", ",", "</s>"] and col_words == ["tuesday", ",", "march", "14th", "</s>"]
    expected_cols = np.stack([w[:, 0] + w[:, 1], w[:, 2], w[:, 3], w[:, 4] + w[:, 5], w[:, 6]], axis=1)
    np.testing.assert_allclose(
        merged, np.stack([expected_cols[:2].mean(0), expected_cols[2], expected_cols[3]])
    )
    np.testing.assert_allclose(merged.sum(1), 1.0)  # still a distribution per target word


# ---------------------------------------------------------------------------------------------- CJK


def test_unsegmented_chinese_falls_back_to_characters_and_keeps_latin_runs():
    line = "我们喜欢Tom的猫！"
    assert [w.text for w in words.segment(line)] == ["我", "们", "喜", "欢", "Tom", "的", "猫", "！"]
    assert words.model_text(words.segment(line)) == line
    assert [w.text for w in words.segment("我有 3 个")] == ["我有", "3", "个"]  # a space next to CJK: given
    assert words.segment("hello  world") == [Word("hello", False), Word("world", True)]


def test_pre_segmented_chinese_is_used_as_given_and_read_without_its_spaces():
    segmented = words.segment("我们 喜欢 Tom 的 猫 ！")
    assert [w.text for w in segmented] == ["我们", "喜欢", "Tom", "的", "猫", "！"]
    assert words.model_text(segmented) == "我们喜欢Tom的猫！"  # what the model was trained on
    assert words.model_text(words.segment("他 说 hello world")) == "他说hello world"


def test_piece_words_of_unsegmented_chinese_share_a_multi_character_piece():
    pieces = ["▁", "我们", "喜", "欢", "T", "om", "<0xE7>", "<0x9A>", "<0x84>", "!", "</s>"]
    membership, labels = words.piece_words(pieces)
    assert labels == ["我", "们", "喜", "欢", "Tom", "的", "!", "</s>"]
    expected = np.zeros((len(pieces), len(labels)))
    expected[0, 0] = 1  # the lone "▁" goes with the next character
    expected[1, 0] = expected[1, 1] = 0.5  # 我们: half to each character
    expected[2, 2] = expected[3, 3] = 1
    expected[4, 4] = expected[5, 4] = 1  # T + om = Tom
    expected[6:9, 5] = 1  # three UTF-8 bytes spell 的
    expected[9, 6] = expected[10, 7] = 1
    np.testing.assert_array_equal(membership, expected)


def test_piece_words_of_pre_segmented_chinese_follow_the_marks():
    membership, labels = words.piece_words(["<s>", "▁我们", "▁喜", "欢", "▁猫", "</s>"])
    assert labels == ["<s>", "我们", "喜欢", "猫", "</s>"]
    np.testing.assert_array_equal(membership, words.membership_of([[0], [1], [2, 3], [4], [5]], 6))


def test_spaced_text_keeps_its_groups():
    groups, labels = words.piece_words(SRC)
    assert groups == words.word_groups(SRC) and labels == ["tuesday", ",", "march", "14th", "</s>"]


def test_merge_with_a_membership_equals_the_sum_and_mean_written_out():
    w = weights(2, 3, 4)  # (heads, target pieces, source pieces)
    cols = np.array([[1, 0, 0], [0.5, 0.5, 0], [0, 0, 1], [0, 0, 1]])  # 4 source pieces -> 3 words
    rows = np.array([[1, 0], [0.5, 0.5], [0, 1]])  # 3 target pieces -> 2 words
    merged = words.merge(w, rows, cols)
    key_words = np.stack([w[..., 0] + 0.5 * w[..., 1], 0.5 * w[..., 1], w[..., 2] + w[..., 3]], axis=-1)
    expected = np.stack([(key_words[:, 0] + 0.5 * key_words[:, 1]) / 1.5,
                         (0.5 * key_words[:, 1] + key_words[:, 2]) / 1.5], axis=1)
    np.testing.assert_allclose(merged, expected)
    np.testing.assert_allclose(merged.sum(-1), 1.0)  # rows still distributions


def test_merge_of_groups_is_merge_groups_exactly():
    w = weights(1, 4, 7)[0]
    rows, cols = [[0, 1], [2], [3]], words.word_groups(SRC)
    assert np.array_equal(words.merge(w, rows, cols), words.merge_groups(w, rows, cols))
    as_matrix = words.merge(w, words.membership_of(rows, 4), cols)
    np.testing.assert_allclose(as_matrix, words.merge_groups(w, rows, cols))


def test_words_to_pieces_encodes_chinese_whole_and_maps_its_words(toy_chinese_tokenizer):
    tokenizer = toy_chinese_tokenizer
    lines = ["tuesday , march 14th", "我们 喜欢 猫", "我们喜欢猫"]
    ids, specs = words.words_to_pieces(tokenizer.encode_src, lines, tokenizer.src_pieces)
    assert isinstance(specs[0], list) and words.word_count(specs[0]) == 4
    assert ids[1] == ids[2] == tokenizer.encode_src(["我们喜欢猫"])[0]  # as the model reads it
    assert words.word_count(specs[1]) == 3 and words.word_count(specs[2]) == 5
    for spec in specs[1:]:
        np.testing.assert_allclose(spec.sum(1), 1.0)  # every piece belongs somewhere, in whole
        assert (spec.sum(0) > 0).all()  # and every word has some piece


@pytest.fixture(scope="module")
def toy_chinese_tokenizer():
    from attnmt.config.schema import TokenizerConfig
    from attnmt.data.tokenizer import train_tokenizer

    english = ["tuesday , march 14th", "the cat", "we like cats"] * 40
    chinese = ["我们喜欢猫", "星期二", "三月十四日", "猫喜欢我们"] * 30
    cfg = TokenizerConfig(vocab_size=400, hard_vocab_limit=False, character_coverage=0.9995,
                          byte_fallback=True)
    return train_tokenizer(english, chinese, cfg)


@pytest.mark.parametrize("normalization", ["nmt_nfkc", "identity"])
def test_compounds_and_elisions_are_one_word_each_and_read_as_training_reads_them(normalization):
    """A German compound cut into several pieces and a French elision (l'entrée, with a straight or a
    typographic apostrophe) are each one word of ``align`` and ``plot --words``; encoding a line word by
    word (as ``align`` does) gives exactly the pieces of the whole line (as training read it)."""
    from attnmt.config.schema import TokenizerConfig
    from attnmt.data.tokenizer import train_tokenizer

    german = ["ein Mann bedient ein Antriebsradsystem", "die Fußballspieler spielen", "ein Schutzhelm",
              "Fußball und Rad", "der Spieler mit dem Helm"] * 30
    french = ["l'homme entre dans l'entrée", "d'une maison", "l’entrée de l’école", "un homme et une école",
              "il s'est assis"] * 30
    cfg = TokenizerConfig(vocab_size=60, hard_vocab_limit=False, normalization=normalization)
    tokenizer = train_tokenizer(german, french, cfg)
    for encode, to_pieces, line in (
            (tokenizer.encode_src, tokenizer.src_pieces, "die Fußballspieler bedienen ein Antriebsradsystem"),
            (tokenizer.encode_tgt, tokenizer.tgt_pieces, "l'homme s'est assis dans l’entrée d'une école")):
        ids, specs = words.words_to_pieces(encode, [line], to_pieces)
        assert ids[0] == encode([line])[0]
        tokens = line.split()
        assert words.word_count(specs[0]) == len(tokens)
        groups, labels = words.piece_words(to_pieces(ids[0]))
        assert groups == specs[0]  # plot --words groups the pieces as align does
        assert labels == [tokenizer.normalize_tgt(t) if encode == tokenizer.encode_tgt
                          else tokenizer.normalize_src(t) for t in tokens]
        assert max(len(g) for g in groups) >= 3  # the compounds and elisions really are cut
        merged = words.merge(weights(2, 3, len(ids[0])), [[0], [1, 2]], groups)
        np.testing.assert_allclose(merged.sum(-1), 1.0)
