"""Lexical constraints (``translate --constraints``, ``constrained.py``): outputs that hold given phrases.

Oracles: exhaustive search over every sequence of a tiny vocabulary, kept to those that hold every phrase
(a beam as wide as the vocabulary finds the same best hypotheses, scores included); plain beam search
(no phrases: the same search, token for token); teacher-forced scoring (a constrained output's score is
the model's log-probability of it). The progress rules and the bank allocation by hand. The command
line's errors: ``tests/cli/test_cli_decoding.py``.
"""

from __future__ import annotations

import pytest
import torch
from test_decode import assert_same, exhaustive, likely_three, make_model, sentences
from test_translator import LINES, every_model, make_translator, tokenizer  # noqa: F401

from attnmt.data.batching import collate
from attnmt.decoding.constrained import Constraints, Progress, _Option, allocate, constrained_search
from attnmt.decoding.search import beam_search
from attnmt.errors import ConfigError, ConstraintError

MODELS = ["transformer", "lstm"]


def holds(tokens: list[int], phrase: list[int]) -> bool:
    n = len(phrase)
    return any(tokens[i:i + n] == phrase for i in range(len(tokens) - n + 1))


# ----------------------------------------------------------------- the rules, by hand


def test_progress_through_a_phrase_and_back_out_of_it():
    c = Constraints([[5, 6, 7], [9]])
    p = c.advance(c.start, 5)
    assert (p.phrase, p.matched, c.bank(p), c.allowed(p)) == (0, 1, 1, [6])
    p = c.advance(p, 6)
    assert (c.bank(p), c.allowed(p)) == (2, [7])
    left = c.advance(p, 9)  # leaves the first phrase half way: its two pieces no longer count, 9 is met
    assert (left.met, left.phrase, c.bank(left), c.allowed(left), c.unmet(left)) == ({1}, -1, 1, [5], 1)
    done = c.advance(c.advance(left, 5), 6)
    done = c.advance(done, 7)
    assert (c.unmet(done), c.bank(done), c.allowed(done)) == (0, 4, [])
    assert c.advance(done, 5) == done  # met phrases are not started again


def test_the_piece_that_leaves_a_phrase_may_start_it_again():
    c = Constraints([[5, 6]])
    p = c.advance(c.advance(c.start, 5), 5)  # "5 5 6" holds "5 6"
    assert (p.phrase, p.matched) == (0, 1)
    assert c.unmet(c.advance(p, 6)) == 0


def test_a_phrase_given_twice_must_appear_twice_and_empty_ones_are_dropped():
    c = Constraints([[8], [], [8]])
    assert len(c.phrases) == 2 and c.pieces == 2
    once = c.advance(c.start, 8)
    assert c.unmet(once) == 1 and c.allowed(once) == [8]
    assert c.unmet(c.advance(once, 8)) == 0
    assert not Constraints([[], []])


def test_allocation_takes_the_best_of_every_bank_from_the_fullest_down():
    def option(score, bank):
        return _Option(score, 0, 4, Progress(), bank)

    options = [option(-1.0, 0), option(-1.5, 0), option(-2.0, 0), option(-9.0, 2), option(-5.0, 1),
               option(-6.0, 1)]
    chosen = allocate(options, 4)
    # Rank 0 of banks 2, 1, 0, then rank 1 of bank 1 (banks before bank 0 at the same rank); best first.
    assert [(o.score, o.bank) for o in chosen] == [(-1.0, 0), (-5.0, 1), (-6.0, 1), (-9.0, 2)]
    assert [o.score for o in allocate(options[:3], 5)] == [-1.0, -1.5, -2.0]  # fewer than K: all of them


# ----------------------------------------------------------------- oracles


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("beam, nbest", [(1, 1), (3, 2), (5, 5)])
def test_no_phrases_is_plain_beam_search(name, beam, nbest):
    model = make_model(name)
    batch = collate(sentences([4, 2, 6, 3, 5], seed=3))
    expected = beam_search(model, batch.src, batch.src_mask, beam, nbest, 0.6, 1.0, 3, need_attention=True)
    found = constrained_search(model, batch.src, batch.src_mask, [Constraints([])] * 5, beam, nbest, 0.6,
                               1.0, 3, need_attention=True)
    for hyps, want in zip(found, expected):
        assert_same(hyps, want)
        for h, w in zip(hyps, want):
            torch.testing.assert_close(h.attention, w.attention)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("phrases", [[[7]], [[4, 7]], [[7], [9]], [[8, 8]]])
def test_a_beam_as_wide_as_the_vocabulary_finds_the_best_that_hold_the_phrases(name, alpha, phrases):
    """12 pieces, beam 12, 3 pieces at most; EOS, 4 and 5 likely, the rest (the phrases' 7, 8, 9
    included) at e^-30. The oracle scores every sequence and keeps those that hold every phrase."""
    vocab = 12
    model, oracle, batch = likely_three(name, vocab)
    found = constrained_search(model, batch.src, batch.src_mask, [Constraints(phrases)] * 2, vocab, 3, alpha,
                               0, 3)
    for i, hyps in enumerate(found):
        every = exhaustive(oracle, batch.src[i:i + 1], batch.src_mask[i:i + 1], vocab, 3, alpha, 12 ** 3)
        expected = [(t, s) for t, s in every if all(holds(t, p) for p in phrases)
                    and sum(map(len, phrases)) <= 3][:3]
        assert len(expected) == 3
        assert_same(hyps, expected)


@pytest.mark.parametrize("name", MODELS)
def test_every_output_holds_its_phrases_and_has_its_teacher_forced_score(tokenizer, name):  # noqa: F811
    translator = make_translator(name, tokenizer, beam_size=4, nbest=3)
    srcs = sentences([6, 3, 8, 5], seed=2, vocab=60)
    phrases = [[[20, 21]], [[33], [40]], [], [[25, 26, 27]]]
    found = translator.search(srcs, constraints=phrases)
    for hyps, wanted, src in zip(found, phrases, srcs):
        assert len(hyps) == 3
        for h in hyps:
            assert all(holds(h.tokens, p) for p in wanted), (h.tokens, wanted)
            logprobs = translator.piece_logprobs([src], [h.tokens])[0]
            assert h.score == pytest.approx(sum(logprobs), abs=1e-9)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("beam", [1, 3])
def test_a_sentence_decodes_the_same_alone_and_in_a_batch(tokenizer, name, beam):  # noqa: F811
    """With or without phrases: a free sentence beside constrained ones is still greedy at beam 1."""
    translator = make_translator(name, tokenizer, beam_size=beam)
    srcs = sentences([6, 3, 8, 5], seed=4, vocab=60)
    phrases = [[[20]], [[33, 34]], [], [[25], [26]]]
    together = translator.search(srcs, constraints=phrases)
    for i in range(len(srcs)):
        alone = translator.search([srcs[i]], constraints=[phrases[i]])
        assert_same(alone[0], together[i])
    assert_same(together[2], translator.search([srcs[2]])[0])


def test_phrases_that_cannot_fit_end_lacking_them_ranked_by_how_many():
    model = make_model("transformer")
    batch = collate(sentences([2], seed=1))
    # A 3-piece limit (source 2 x 0 + 3) and four one-piece phrases: at most three can be met.
    found = constrained_search(model, batch.src, batch.src_mask, [Constraints([[4], [5], [6], [7]])], 4, 4,
                               0.0, 0.0, 3)
    hyps = found[0]
    lacking = [sum(not holds(h.tokens, [p]) for p in (4, 5, 6, 7)) for h in hyps]
    assert lacking == sorted(lacking) and lacking[0] == 1
    assert all(len(h.tokens) == 3 for h in hyps)


def test_a_prefix_and_phrases_together(tokenizer):  # noqa: F811
    translator = make_translator("transformer", tokenizer, beam_size=4)
    srcs = sentences([6, 5], seed=5, vocab=60)
    found = translator.search(srcs, prefixes=[[30, 31], []], constraints=[[[44]], [[45, 46]]])
    assert found[0][0].tokens[:2] == [30, 31] and holds(found[0][0].tokens, [44])
    assert holds(found[1][0].tokens, [45, 46])


# ----------------------------------------------------------------- text in, text out


def test_translate_takes_phrases_as_text_and_the_outputs_hold_them(tokenizer):  # noqa: F811
    translator = make_translator("lstm", tokenizer, beam_size=4)
    wanted = [["2040"], [], ["sonntag", "1982"]]
    out = translator.translate(LINES[:3], constraints=wanted)
    for translation, phrases in zip(out, wanted):
        for phrase in phrases:
            assert phrase in translation.outputs[0][0]
    assert translator.translate([""], constraints=[["2040"]])[0].outputs == [("", 0.0)]


def test_phrases_too_long_for_the_limit_or_outside_the_vocabulary_name_their_line(tokenizer):  # noqa: F811
    translator = make_translator("lstm", tokenizer, beam_size=2)
    long = [[], [], [" ".join(str(n) for n in range(80))]]
    with pytest.raises(ConstraintError, match=r"^line 3: the phrases take \d+ target pieces, more than"):
        translator.translate(LINES[:3], constraints=long)
    chunks = translator.translate_stream(LINES[:3], chunk_lines=2, constraints=long)
    with pytest.raises(ConstraintError, match="^line 3: "):  # line 1 of the second chunk
        list(chunks)
    with pytest.raises(ConstraintError, match=r"^line 1: the phrase '猫' has a piece the model's target"):
        translator.translate(LINES[:1], constraints=[["猫"]])


def test_phrases_do_not_go_with_sampling(tokenizer):  # noqa: F811
    from attnmt.decoding.search import Sampling
    from attnmt.decoding.translator import DecodeOverrides

    translator = make_translator("lstm", tokenizer).with_overrides(DecodeOverrides(sampling=Sampling()))
    with pytest.raises(ConfigError, match="constraints need a search"):
        translator.translate(LINES[:1], constraints=[["2040"]])
