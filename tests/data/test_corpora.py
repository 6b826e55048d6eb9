"""Several training corpora (``data.train`` as a list): languages, weights and tags.

Oracles: the corpora's pairs counted by hand (each corpus's share of the prepared split, its control
tokens before every source); a chi-square bound on the examples an epoch draws from each weighted corpus
(the counts of a multinomial draw); the same draws for the same (seed, epoch) and others for another;
the source ids a multilingual model reads beginning with its target language's piece. Bad input: one
line naming the key (config) or the option (``--tgt-lang``, exit 2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_one_error_line
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmt.config.schema import TokenizerConfig, config_from_dict
from attnmt.data.batching import TokenBatchSampler, corpus_draws
from attnmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID, train_on_samples
from attnmt.data.toy import toy_pairs
from attnmt.errors import ConfigError

TOY = {"format": "toy", "split": "train"}


def data_config(train, **more) -> dict:
    return {"data": {"src_lang": "en", "tgt_lang": "de", "train": train, **more}, "model": {"arch": "lstm"}}


# ----------------------------------------------------------------- the config


def test_one_corpus_is_a_list_of_one_and_not_multilingual():
    cfg = config_from_dict(data_config({**TOY, "size": 10}))
    assert len(cfg.data.corpora()) == 1 and not cfg.data.multilingual
    assert cfg.data.control_tokens() == [] and cfg.data.weights() is None
    assert cfg.data.source_prefix(cfg.data.train) == ""


def test_without_tgt_lang_the_model_translates_into_its_default_or_only_language():
    only = config_from_dict(data_config([{**TOY, "size": 5, "tgt_lang": "fr"}])).data  # data.tgt_lang: de
    assert only.prefix_for(None, "--tgt-lang") == only.prefix_for("fr", "--tgt-lang") == ""
    two = config_from_dict(data_config([{**TOY, "size": 5, "tgt_lang": "fr"},
                                        {**TOY, "size": 5, "tgt_lang": "es"}])).data
    with pytest.raises(ConfigError, match=r"^this model translates into es, fr: choose one with --tgt-lang$"):
        two.prefix_for(None, "--tgt-lang")


def test_corpora_into_several_languages_make_a_multilingual_model():
    train = [{**TOY, "size": 10, "tgt_lang": "de"}, {**TOY, "size": 10, "lang": "zh", "tgt_lang": "zh"},
             {**TOY, "size": 5, "tag": "<bt>", "weight": 3}]
    cfg = config_from_dict(data_config(train))
    data = cfg.data
    assert data.target_languages() == ["de", "zh"] and data.multilingual
    assert data.control_tokens() == ["<2de>", "<2zh>", "<bt>"]
    assert [data.source_prefix(c) for c in data.corpora()] == ["<2de>", "<2zh>", "<2de> <bt>"]
    assert data.weights() == [1.0, 1.0, 3.0]
    assert data.prefix_for("zh", "--tgt-lang") == "<2zh>" and data.prefix_for(None, "--tgt-lang") == "<2de>"
    with pytest.raises(ConfigError, match=r"^--tgt-lang fr: this model translates into de, zh only$"):
        data.prefix_for("fr", "--tgt-lang")
    assert cfg.tokenizer.byte_fallback  # a Chinese corpus sets the tokenizer's CJK defaults


@pytest.mark.parametrize("data, message", [
    ({"train": [{**TOY, "size": 5, "srcc": 1}]}, "data.train.0.srcc: unknown key"),
    ({"train": []}, "data.train: must not be empty"),
    ({"train": [{**TOY, "size": 5, "tag": "a b"}]}, "data.train.0.tag: 'a b' is not one token"),
    ({"train": [{**TOY, "size": 5, "tgt_lang": "f r"}]},
     "data.train.0.tgt_lang: 'f r' is not a language code"),
    ({"train": [{**TOY, "size": 5, "weight": 0}]}, "data.train.0.weight: must be > 0.0, got 0"),
    ({"train": {**TOY, "size": 5}, "dev": {**TOY, "size": 5, "weight": 2}},
     "data.dev.weight: only training corpora have a weight"),
    ({"train": {**TOY, "size": 5}, "test": {**TOY, "size": 5, "tag": "<x>"}},
     "data.test.tag: only training corpora have a tag"),
    ({"train": [{**TOY, "size": 5, "tgt_lang": "de"}, {**TOY, "size": 5, "tgt_lang": "fr"}],
      "dev": {**TOY, "size": 5, "tgt_lang": "es"}},
     "data.dev.tgt_lang: es, but the training corpora go into de, fr"),
])
def test_bad_corpora_name_their_key(data, message):
    config = data_config(None)
    config["data"].update(data)
    with pytest.raises(ConfigError) as found:
        config_from_dict(config)
    assert message in str(found.value)


RESERVED = [*SPECIAL_PIECES, "<0x41>", "<0x0A>", "<0xFF>", "\u2581", "<bt>\u2581", "a\x00b"]


@pytest.mark.parametrize("tag", RESERVED)
@pytest.mark.parametrize("listed", [False, True])
def test_a_tag_sentencepiece_keeps_for_itself_is_refused_naming_its_key(tmp_path, tag, listed):
    """Every special piece (and a byte's piece, sentencepiece's space mark, a NUL) as a corpus's tag: exit 2
    when the config is read, one line naming ``data.train.N.tag`` at its line (before: exit 4 about
    sentencepiece's special ids, or exit 3 from its training)."""
    from typer.testing import CliRunner

    from attnmt.cli import app

    tagged = {**TOY, "size": 5, "seed": 2, "tag": tag}
    train = [{**TOY, "size": 5}, tagged] if listed else tagged
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data_config(train), indent=1), encoding="utf-8")
    key = "data.train.1.tag" if listed else "data.train.tag"
    lines = path.read_text(encoding="utf-8").splitlines()
    line = next(n for n, text in enumerate(lines, 1) if '"tag"' in text)
    result = CliRunner().invoke(app, ["prepare", str(path), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert f"{path}:{line}: {key}: {tag!r} cannot be a tag" in assert_one_error_line(result.stderr)
    assert not (tmp_path / "run").exists()


TAG_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Z",)), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.sampled_from(RESERVED), TAG_TEXT, TAG_TEXT.map(lambda t: f"<{t}>")), st.booleans())
def test_every_tag_the_config_takes_is_one_piece_of_the_tokenizer(tag, byte_fallback):
    """The class, not the cases: a tag the config accepts is a piece of its own in the tokenizer prepare
    trains (sentencepiece trained with it as a user-defined symbol, on sources that start with it); a tag it
    cannot keep is refused when the config is read, naming the key."""
    config = data_config([{**TOY, "size": 5}, {**TOY, "size": 5, "tag": tag}])
    try:
        cfg = config_from_dict(config)
    except ConfigError as e:
        assert "data.train.1.tag: " in str(e)
        return
    sources = [f"{tag} {src}" for src, _, _ in toy_pairs("train", 60)]
    tokenizer_cfg = TokenizerConfig(vocab_size=400 if byte_fallback else 64, hard_vocab_limit=False,
                                    byte_fallback=byte_fallback)
    tokenizer = train_on_samples([sources], tokenizer_cfg, symbols=cfg.data.control_tokens())
    assert tokenizer.single_piece(tag)
    assert tokenizer.src_pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == list(SPECIAL_PIECES)


def test_guided_alignment_needs_one_corpus():
    config = data_config([{**TOY, "size": 5}, {**TOY, "size": 5, "seed": 2}])
    config["train"] = {"alignment": {}}
    with pytest.raises(ConfigError, match="train.alignment: guided alignment reads one training corpus"):
        config_from_dict(config)


# ----------------------------------------------------------------- the draws


def test_weighted_draws_follow_the_weights_within_a_chi_square_bound():
    sizes, weights = [3000, 1000, 500], [1.0, 3.0, 1.0]
    starts, n = np.cumsum([0] + sizes[:-1]), sum(sizes)
    expected = n * np.array(weights) / sum(weights)
    for epoch in range(5):
        drawn = corpus_draws(sizes, weights, np.random.default_rng([1, epoch]))
        assert len(drawn) == n and drawn.min() >= 0 and drawn.max() < n
        observed = np.array([np.count_nonzero((drawn >= s) & (drawn < s + size))
                             for s, size in zip(starts, sizes)])
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < 13.82, (observed, expected)  # chi-square, 2 degrees of freedom, p = 0.001
        # The small corpus (500 pairs, 1,100 draws expected) goes round more than twice, evenly.
        small = np.bincount(drawn[drawn >= starts[2]] - starts[2], minlength=500)
        assert small.max() - small.min() <= 1


def test_draws_repeat_with_the_seed_and_epoch_and_skip_an_empty_corpus():
    sizes, weights = [100, 0, 50], [1.0, 5.0, 1.0]
    first = corpus_draws(sizes, weights, np.random.default_rng([3, 0]))
    assert np.array_equal(first, corpus_draws(sizes, weights, np.random.default_rng([3, 0])))
    assert not np.array_equal(first, corpus_draws(sizes, weights, np.random.default_rng([3, 1])))
    assert len(first) == 150


def test_a_weighted_sampler_draws_its_epochs_and_an_unweighted_one_takes_each_pair_once():
    lengths = np.full(600, 5)
    plain = TokenBatchSampler(lengths, 100, seed=1)
    assert sorted(np.concatenate(plain.batches(0)).tolist()) == list(range(600))
    weighted = TokenBatchSampler(lengths, 100, seed=1, corpora=[500, 100], weights=[1.0, 1.0])
    drawn = np.concatenate(weighted.batches(0))
    assert len(drawn) == 600 and 200 < np.count_nonzero(drawn >= 500) < 400
    with pytest.raises(ValueError, match="2 corpus weights"):
        TokenBatchSampler(lengths, 100, corpora=[600], weights=[1.0, 2.0])


# ----------------------------------------------------------------- prepare, train, translate


def test_prepare_keeps_each_corpus_after_its_control_tokens(multilingual):
    train = multilingual / "data" / "train"
    meta = json.loads((train / "split.json").read_text(encoding="utf-8"))
    assert meta["corpora"] == [120, 120, 40] and meta["rows"] == 280
    lines = (train / "src.txt").read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("<2de> ") and not line.startswith("<2de> <bt>") for line in lines[:120])
    assert all(line.startswith("<2zh> ") for line in lines[120:240])
    assert all(line.startswith("<2de> <bt> ") for line in lines[240:])
    dev = (multilingual / "data" / "dev" / "src.txt").read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("<2zh> ") for line in dev)


def test_the_source_ids_start_with_the_chosen_language(multilingual):
    from attnmt.cli.common import open_translator
    from attnmt.decoding.translator import DecodeOverrides

    for lang in ("de", "zh", None):
        translator, _, _ = open_translator(multilingual, "cpu", DecodeOverrides(tgt_lang=lang))
        pieces = translator.tokenizer.src_pieces(translator.encode(["may 22nd 2040"]).ids[0])
        assert f"<2{lang or 'de'}>" in pieces[:2] and "<bt>" not in pieces
        plain = translator.tokenizer.src_pieces(translator.tokenizer.encode_src(["may 22nd 2040"])[0])
        assert pieces[-len(plain):] == plain


def test_translate_refuses_a_language_the_model_was_not_trained_into(multilingual):
    from typer.testing import CliRunner

    from attnmt.cli import app

    result = CliRunner().invoke(app, ["translate", str(multilingual), "may 22nd 2040", "--tgt-lang", "fr"])
    assert result.exit_code == 2
    assert "--tgt-lang fr: this model translates into de, zh only" in assert_one_error_line(result.stderr)
    result = CliRunner().invoke(app, ["translate", str(multilingual), "may 22nd 2040", "--tgt-lang", "zh"])
    assert result.exit_code == 0, result.output


def test_score_reads_the_pair_with_the_chosen_language(multilingual, tmp_path):
    from typer.testing import CliRunner

    from attnmt.cli import app

    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("may 22nd 2040\n", encoding="utf-8")
    tgt.write_text("22. mai 2040\n", encoding="utf-8")
    found = {}
    for lang in ("de", "zh"):
        result = CliRunner().invoke(app, ["score", str(multilingual), "--src", str(src), "--tgt", str(tgt),
                                          "--json", "--tgt-lang", lang])
        assert result.exit_code == 0, result.output
        found[lang] = json.loads(result.stdout)["logprob"]
    assert found["de"] != found["zh"]  # the language token reaches the model
    result = CliRunner().invoke(app, ["score", str(multilingual), "--src", str(src), "--tgt", str(tgt),
                                      "--tgt-lang", "fr"])
    assert result.exit_code == 2 and "--tgt-lang fr" in assert_one_error_line(result.stderr)


def test_align_and_attribute_read_a_multilingual_model_with_its_language_token(multilingual, tmp_path):
    from typer.testing import CliRunner

    from attnmt.cli import app
    from attnmt.cli.common import open_for_attention
    from attnmt.insight.reading import after
    from attnmt.insight.reading import word_pieces as _word_pieces

    translator, _, _ = open_for_attention(multilingual, "cpu", None)
    src_ids, groups, _, _ = _word_pieces(translator, ["may 22nd 2040", ""], ["22. mai 2040", ""], None)
    token = translator.tokenizer.src_pieces(src_ids[0]).index("<2de>")
    assert all(k > token for group in groups[0] for k in group) and src_ids[1] == []
    assert after([[0], [1, 2]], 2) == [[2], [3, 4]]
    assert after(np.eye(2), 1).tolist() == [[0, 0], [1, 0], [0, 1]]
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("may 22nd 2040\nnovember 19th 1982\n", encoding="utf-8")
    tgt.write_text("22. mai 2040\n19. november 1982\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["align", str(multilingual), "--src", str(src), "--tgt", str(tgt)])
    assert result.exit_code == 0, result.output
    for line, words in zip(result.stdout.splitlines(), (3, 3)):
        assert all(int(link.split("-")[0]) < words for link in line.split())


def test_a_changed_corpus_is_named_by_its_index():
    from attnmt.models.checkpoint import diff_dicts

    old = {"train": [{"src": "a", "weight": 3.0}, {"src": "b", "tag": None}]}
    new = {"train": [{"src": "a", "weight": 2.0}, {"src": "b", "tag": "<bt>"}]}
    assert diff_dicts(old, new) == ["train.0.weight: 3.0 -> 2.0", "train.1.tag: None -> '<bt>'"]
    shorter = {"train": old["train"][:1]}
    assert diff_dicts(old, shorter) == [f"train: {old['train']!r} -> {shorter['train']!r}"]
