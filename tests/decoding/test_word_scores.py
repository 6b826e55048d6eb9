"""Word confidence (``translate --scores words``, ``score --words``): a word's probability is the exponent
of its pieces' log-probabilities summed (in CJK text, a piece shared by character words split among them
by characters), so the words' and the end's log-probabilities add up to the output's.

Oracles: hand-computed sums on spaced and CJK pieces; the search's own scores (with length penalty 0,
the translation's score is the sum of its pieces' log-probabilities, EOS included); teacher forcing by hand.
The command line: ``tests/cli/test_cli_decoding.py``."""

from __future__ import annotations

import math

import pytest
import torch
from test_translator import LINES, every_model, make_translator, tokenizer  # noqa: F401

from attnmt.data.batching import collate
from attnmt.data.words import word_scores


def test_a_words_log_probability_is_its_pieces_summed():
    found = word_scores(["\u2581a", "b", "\u2581c", "."], [-1.0, -2.0, -0.5, -0.25, -0.1])
    assert [w for w, _ in found.words] == ["ab", "c."]
    assert [p for _, p in found.words] == pytest.approx([math.exp(-3.0), math.exp(-0.75)])
    assert found.end == pytest.approx(math.exp(-0.1))
    empty = word_scores([], [-0.3])
    assert empty.words == [] and empty.end == pytest.approx(math.exp(-0.3))


def test_cjk_pieces_share_their_log_probability_among_their_characters():
    found = word_scores(["\u2581我们", "明", "天"], [-1.0, -0.4, -0.2, -0.05])
    assert [w for w, _ in found.words] == ["我", "们", "明", "天"]
    assert [math.log(p) for _, p in found.words] == pytest.approx([-0.5, -0.5, -0.4, -0.2])


def test_the_words_and_the_end_add_up_to_the_output():
    pieces = ["\u2581Ein", "\u2581Hund", "\u2581läuft", "."]
    logprobs = [-0.2, -1.3, -0.7, -0.01, -0.3]
    found = word_scores(pieces, logprobs)
    assert sum(math.log(p) for _, p in found.words) + math.log(found.end) == pytest.approx(sum(logprobs))


def test_a_log_probability_per_piece_and_one_for_the_end_are_needed():
    with pytest.raises(ValueError, match="3 log-probabilities for 3 pieces and the end"):
        word_scores(["\u2581a", "\u2581b", "\u2581c"], [-1.0, -1.0, -1.0])


@every_model
@pytest.mark.parametrize("settings", [dict(beam_size=1), dict(beam_size=3, nbest=2)])
def test_translations_words_multiply_to_their_score(tokenizer, name, settings):  # noqa: F811
    translator = make_translator(name, tokenizer, length_penalty=0.0, **settings)
    found = translator.translate(LINES, words=True)
    plain = translator.translate(LINES)
    assert [t.outputs for t in found] == [t.outputs for t in plain]  # the words change nothing else
    for line, translation in zip(LINES, found):
        assert len(translation.words) == len(translation.outputs)
        for (text, score), words in zip(translation.outputs, translation.words):
            if not line.strip():
                assert words.words == [] and text == ""
                continue
            total = sum(math.log(p) for _, p in words.words) + math.log(words.end)
            assert total == pytest.approx(score, abs=1e-6)
            assert "".join(w for w, _ in words.words) == text.replace(" ", "")


@every_model
def test_piece_log_probabilities_are_teacher_forcings(tokenizer, name):  # noqa: F811
    translator = make_translator(name, tokenizer, beam_size=1)
    sources = translator.encode(LINES).ids
    targets = [hyps[0].tokens for hyps in translator.search(sources)]
    found = translator.piece_logprobs(sources, targets)
    for src, tgt, logprobs in zip(sources, targets, found):
        batch = collate([src], [tgt])
        with torch.no_grad():
            logp = torch.log_softmax(translator.model(batch).logits.double(), -1)[0]
        expected = logp.gather(1, batch.tgt_out[0][:, None])[:, 0].tolist()
        assert logprobs == pytest.approx(expected, abs=1e-6)
        assert len(logprobs) == len(tgt) + 1
