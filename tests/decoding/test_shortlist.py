"""The lexical shortlist (``decoding/shortlist.py``, ``attnmt shortlist``, ``--shortlist``).

Oracles: with every piece in the list, greedy search, beam search and n-best are the full search's, token
for token and score for score; with a learned list, every output piece is one the list allows, and the
outputs are those of a model whose output layer has only those rows (masking the others' logits to minus
infinity gives the same argmax path under greedy search). The table itself is checked against Dice's
coefficient counted by hand, and counting in small chunks gives the same table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_one_error_line, trained_for_decoding
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.specials import SPECIAL_PIECES
from attnmt.decoding import shortlist as shortlists
from attnmt.decoding.shortlist import Shortlist, build_shortlist, load_shortlist
from attnmt.decoding.translator import DecodeOverrides, Translator
from attnmt.errors import ConfigError
from attnmt.models.checkpoint import load_model

LINES = ["march 14th 2019", "tuesday , march 14th , 2019 at 7:05 pm", "november 19th 1982",
         "friday the 1st of may 2001", "7:05 pm", "the 3rd of june 1999"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("shortlist") / "run")


@pytest.fixture(scope="module")
def opened(run):
    model, tokenizer, cfg, _ = load_model(run, "cpu")
    return Translator(model, tokenizer, cfg.decode), tokenizer


def hypotheses(translator, beam: int, nbest: int = 1):
    found = translator.with_overrides(DecodeOverrides(beam_size=beam, nbest=nbest))
    return [[(h.tokens, round(h.score, 5)) for h in hyps] for hyps in found.search(found.encode(LINES).ids)]


def test_with_every_piece_listed_the_search_is_the_full_search(opened):
    translator, tokenizer = opened
    every = torch.arange(tokenizer.tgt_vocab_size, dtype=torch.int32)
    listed = Translator(translator.model, tokenizer, translator.decode)
    table = every.repeat(tokenizer.src_vocab_size, 1)
    listed.shortlist = Shortlist(table, every[:0], tokenizer.fingerprint())
    for beam, nbest in ((1, 1), (4, 1), (4, 3)):
        assert hypotheses(listed, beam, nbest) == hypotheses(translator, beam, nbest)
    assert translator.model.output.weight.shape[0] == tokenizer.tgt_vocab_size  # the layer is put back


def test_a_learned_list_bounds_the_outputs_and_equals_masking_the_rest(run, opened, tmp_path):
    translator, tokenizer = opened
    made = invoke("shortlist", run, "--per-piece", 3, "--frequent", 2, "--out", tmp_path / "list.pt")
    assert made.exit_code == 0, made.output
    table = load_shortlist(tmp_path / "list.pt", tokenizer.fingerprint(), run)
    listed = Translator(translator.model, tokenizer, translator.decode)
    listed.shortlist = table
    sources = listed.encode(LINES).ids
    allowed = set(table.pieces(sources).tolist())  # the batch's: all six sentences fit in one
    assert len(allowed) < tokenizer.tgt_vocab_size
    for beam in (1, 4):
        found = listed.with_overrides(DecodeOverrides(beam_size=beam)).search(sources)
        assert all(set(h.tokens) <= allowed for hyps in found for h in hyps)
    # greedy, one sentence at a time: the listed model's path is the full model's with the other pieces'
    # logits at minus infinity
    greedy, full = (t.with_overrides(DecodeOverrides(beam_size=1)) for t in (listed, translator))
    output = translator.model.output
    for ids in sources:
        mask = torch.full((tokenizer.tgt_vocab_size,), float("-inf"))
        mask[table.pieces([ids])] = 0
        output.forward = lambda x, original=output.forward, mask=mask: original(x) + mask
        try:
            masked = full.search([ids])[0][0].tokens
        finally:
            del output.forward
        assert greedy.search([ids])[0][0].tokens == masked


def test_the_table_is_dice_counted_by_hand_and_chunks_change_nothing(monkeypatch):
    specials = len(SPECIAL_PIECES)
    a, b, c = specials, specials + 1, specials + 2  # source pieces
    x, y, z = specials, specials + 1, specials + 2  # target pieces
    src = [[a, b], [a], [a, c], [b, b]]
    tgt = [[x, y], [x], [x, z, z], [y]]
    made = build_shortlist(src, tgt, 8, 8, per_piece=2, frequent=1, tokenizer={})
    # a: with x in 3 of 3 (Dice 1), y in 1 (2/(3+2)), z in 1 (2/(3+1)); b: y 2 of 2 (1), x 1 (2/(2+3))
    assert made.table[a].tolist() == [x, z]
    assert made.table[b].tolist() == [y, x]
    assert made.table[c].tolist() == [z, x]
    assert made.table[0].tolist() == [-1, -1]
    assert made.frequent.tolist() == [x]  # x 3 times, y 2, z 2
    monkeypatch.setattr(shortlists, "CHUNK_PAIRS", 1)
    again = build_shortlist(src, tgt, 8, 8, per_piece=2, frequent=1, tokenizer={})
    assert torch.equal(again.table, made.table) and torch.equal(again.frequent, made.frequent)
    assert made.pieces([[a]]).tolist() == [*range(specials), x, z]
    assert np.all(made.pieces([[a, b, c]]).numpy()[:specials] == np.arange(specials))


def test_translate_and_eval_take_a_shortlist_and_a_bad_one_is_one_line(run, tmp_path, tiny):
    assert invoke("shortlist", run).exit_code == 0
    listed = invoke("translate", run, *LINES, "--shortlist", run / "shortlist.pt", "--int8")
    assert listed.exit_code == 0 and len(listed.stdout.splitlines()) == len(LINES), listed.output
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    ref.write_text(listed.stdout, encoding="utf-8")
    scored = invoke("eval", run, "--src", src, "--ref", ref, "--shortlist", run / "shortlist.pt", "--int8")
    assert scored.exit_code == 0 and "BLEU" in scored.output, scored.output
    missing = invoke("translate", run, LINES[0], "--shortlist", tmp_path / "none.pt")
    assert missing.exit_code != 0 and "no such file" in assert_one_error_line(missing.output)
    folder = invoke("translate", run, LINES[0], "--shortlist", tmp_path)
    assert folder.exit_code != 0 and "not a file" in assert_one_error_line(folder.output)
    (tmp_path / "junk.pt").write_bytes(b"not a table")
    junk = invoke("translate", run, LINES[0], "--shortlist", tmp_path / "junk.pt")
    assert junk.exit_code != 0 and "not a shortlist" in assert_one_error_line(junk.output)
    with pytest.raises(ConfigError, match="another tokenizer"):
        load_shortlist(run / "shortlist.pt", {"other": True}, run)
    empty = invoke("shortlist", tmp_path)
    assert empty.exit_code != 0 and "no prepared training data" in assert_one_error_line(empty.output)
