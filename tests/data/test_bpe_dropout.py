"""BPE-dropout written again over sentencepiece's BPE models (``attnmt/data/bpe_dropout.py``), seeded.

Oracles: sentencepiece itself. Without dropout the pieces are its deterministic BPE encoding, id for id,
on unseen text with unknown characters (with and without byte fallback), CJK text and user-defined
symbols; with dropout, our draws lengthen the text as much as sentencepiece's own (unseeded) BPE-dropout
does at the same alpha, every draw decodes to the text, and the draws repeat by seed in another process.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm

from attnmt.config.schema import TokenizerConfig
from attnmt.data.bpe_dropout import BpeDropout, is_bpe, model_spec
from attnmt.data.tokenizer import Tokenizer, train_model

SYMBOLS = ("<2fr>", "<bt>")
SYLLABLES = ["ka", "ri", "sto", "men", "a", "lu", "ver", "ung", "sch", "e", "in", "ber", "o", "tra", "ß", "é"]
HANZI = [chr(0x4E00 + k) for k in range(0, 400, 7)]


def sentence(rng: random.Random, cjk: bool) -> str:
    """A sentence of a made-up language: Zipf-ish words of syllables, or runs of Han characters."""
    if cjk:
        return "".join(rng.choice(HANZI[: rng.choice((10, 57))]) for _ in range(rng.randint(4, 20))) + "。"
    words = ["".join(rng.choice(SYLLABLES[: rng.randint(3, 16)]) for _ in range(rng.randint(1, 4)))
             for _ in range(rng.randint(3, 12))]
    return " ".join(words) + rng.choice((".", " ?", ""))


def corpus(seed: int, size: int, cjk: bool) -> list[str]:
    rng = random.Random(seed)
    return [sentence(rng, cjk) for _ in range(size)]


def unseen(seed: int, size: int, cjk: bool) -> list[str]:
    """Held-out sentences, some with a user-defined symbol, some with characters no model has seen."""
    out = []
    for k, line in enumerate(corpus(seed, size, cjk)):
        if k % 3 == 0:
            line = f"{SYMBOLS[k % 2]} {line}"
        if k % 5 == 0:
            line += " x<bt>y"
        if k % 7 == 0:
            line = line[:3] + "\u0416\u0436\u2603" + line[3:] + " \U0001F600"
        out.append(line)
    return out


def bpe_model(cjk: bool, byte_fallback: bool) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(1, 3000, cjk)), model_writer=model, model_type="bpe",
        vocab_size=(360 if byte_fallback else 100) if cjk else 500, user_defined_symbols=list(SYMBOLS),
        byte_fallback=byte_fallback,
        character_coverage=0.98 if cjk else 1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
        normalization_rule_name="identity" if cjk else "nmt_nfkc")
    return model.getvalue()


KINDS = {"latin": (False, False), "latin-bytes": (False, True), "cjk-bytes": (True, True),
         "cjk": (True, False)}


@pytest.fixture(scope="module", params=list(KINDS))
def model(request):
    """(sentencepiece processor, our dropout over it, held-out text) for each kind of model."""
    cjk, byte_fallback = KINDS[request.param]
    proto = bpe_model(cjk, byte_fallback)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    return sp, BpeDropout(sp, model_spec(proto)), unseen(2, 600, cjk)


def test_without_dropout_the_pieces_are_sentencepieces_own(model):
    sp, dropout, lines = model
    expected = sp.encode(lines)
    assert [dropout.encode(line, 0.0) for line in lines] == expected
    assert any(sp.unk_id() in ids for ids in expected) or dropout.byte_ids is not None
    assert any(sp.piece_to_id("<bt>") in ids for ids in expected)


@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_dropout_lengthens_the_text_as_much_as_sentencepieces_own_dropout(model, alpha):
    """sentencepiece's BPE-dropout cannot be seeded, but its statistics can be compared: pieces per
    sentence, and the share of sentences left as deterministic BPE cuts them. Each side draws the held-out
    text 6 times: one draw each put the two figures 2 standard deviations apart too often (a flaky test)."""
    sp, dropout, lines = model
    plain = sp.encode(lines) * 6
    ours = [dropout.encode(line, alpha, seed) for seed, line in enumerate(lines * 6)]
    theirs = sp.encode(lines * 6, enable_sampling=True, alpha=alpha, nbest_size=-1)
    length = sum(map(len, plain))
    assert sum(map(len, ours)) / length == pytest.approx(sum(map(len, theirs)) / length, abs=0.03)
    assert sum(map(len, ours)) > length
    same_ours = np.mean([a == b for a, b in zip(ours, plain)])
    same_theirs = np.mean([a == b for a, b in zip(theirs, plain)])
    assert same_ours == pytest.approx(same_theirs, abs=0.06)
    assert sp.decode(ours) == sp.decode(plain)


def test_the_draws_are_a_pure_function_of_the_seed(model):
    sp, dropout, lines = model
    first = [dropout.encode(line, 0.3, seed) for seed, line in enumerate(lines)]
    assert [dropout.encode(line, 0.3, seed) for seed, line in reversed(list(enumerate(lines)))] == first[::-1]
    other = [dropout.encode(line, 0.3, seed + 1000) for seed, line in enumerate(lines)]
    assert other != first


def searched_afresh(scores: dict[str, float], word: str, alpha: float, draws: list[float]) -> list[str]:
    """The merge rule as stated, every turn searching all neighbours (no merges kept per word, no replay):
    the best piece (highest score, leftmost), dropped for good when the turn's draw is below ``alpha``."""
    symbols, names, dropped = list(word), list(range(len(word))), set()
    for turn, draw in enumerate(draws):
        found = [(scores[a + b], -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))
                 if a + b in scores and (names[i], names[i + 1]) not in dropped]
        if not found:
            return symbols
        i = -max(found)[1]
        if draw < alpha:
            dropped.add((names[i], names[i + 1]))
        else:
            symbols[i:i + 2], names[i:i + 2] = [symbols[i] + symbols[i + 1]], [len(word) + turn]
    raise AssertionError(f"{word!r}: more turns than draws")


@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_replaying_the_kept_merges_until_the_first_drop_is_searching_afresh(model, alpha):
    """``merge`` replays a word's deterministic merges up to its first drop; the same pieces as the search
    made at every turn, over one sentence's draws (4 a character of each word that can merge)."""
    sp, dropout, lines = model
    for seed, line in enumerate(lines[:300] * 2):  # the second time, every word's merges are kept
        text = sp.normalize(line)
        runs = dropout.words(text)
        draws = np.random.default_rng(seed).random(sum(4 * len(w) for w, frozen in runs
                                                       if not frozen and len(w) > 1)).tolist()
        expected, at = [], 0
        for word, frozen in runs:
            if frozen or len(word) < 2:
                expected.append(word)
                continue
            expected += searched_afresh(dropout.scores, word, alpha, draws[at:at + 4 * len(word)])
            at += 4 * len(word)
        assert dropout.pieces(text, alpha, np.random.default_rng(seed)) == expected
    assert dropout.merges.cache_info().hits > 0


def test_alpha_one_drops_every_merge(model):
    sp, dropout, lines = model
    for line in lines[:100]:
        pieces = [sp.id_to_piece(i) for i in dropout.encode(line, 1.0, 5)]
        assert all(len(piece) == 1 or piece in SYMBOLS or sp.is_byte(sp.piece_to_id(piece))
                   or piece == "<unk>" for piece in pieces), pieces


def test_the_tokenizer_samples_a_bpe_model_by_dropout_and_repeats_in_another_process(tmp_path):
    """``Tokenizer.sample`` on a model ``train_model`` made: BPE-dropout, the same pieces in a new process
    (sentencepiece's own would not be)."""
    lines = unseen(3, 40, False)
    proto = train_model(corpus(1, 3000, False), TokenizerConfig(model_type="bpe", vocab_size=500),
                        symbols=SYMBOLS)
    assert is_bpe(model_spec(proto))
    assert not is_bpe(model_spec(train_model(corpus(1, 3000, False), TokenizerConfig(vocab_size=300))))
    tokenizer = Tokenizer(proto, proto, True)
    here = [tokenizer.sample("src", line, 0.2, 16, 7 + k) for k, line in enumerate(lines)]
    (tmp_path / "spm.model").write_bytes(proto)
    code = ("import sys, json; from attnmt.data.tokenizer import Tokenizer\n"
            "m = open(sys.argv[1], 'rb').read(); t = Tokenizer(m, m, True)\n"
            "lines = sys.argv[2:]\n"
            "print(json.dumps([t.sample('src', line, 0.2, 16, 7 + k) for k, line in enumerate(lines)]))")
    there = subprocess.run([sys.executable, "-c", code, str(tmp_path / "spm.model"), *lines],
                           capture_output=True, text=True, check=True)
    assert json.loads(there.stdout) == here
    assert here != tokenizer.encode_src(lines)
    assert tokenizer.decode_tgt(here) == tokenizer.decode_tgt(tokenizer.encode_src(lines))
