"""Target-prefix decoding (``translate --prefix``): every output starts with its line's prefix and the
search goes on from there.

Oracles: the model stepped by hand through BOS and the prefix, then the most probable piece at every
step (greedy with a prefix is exactly that, its score the sum of every step's log-probability, the
prefix's included); beam search of width 1 with no length penalty equals greedy; an empty prefix is no
prefix; every hypothesis of the n-best starts with the prefix and has its teacher-forced score.
CTranslate2's ``target_prefix`` against attnmt: ``tests/decoding/test_ctranslate.py``; the command line:
``tests/cli/test_cli_decoding.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_translator import LINES, every_model, make_translator, sentences, tokenizer  # noqa: F401

from attnmt.data.batching import collate
from attnmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnmt.decoding.search import beam_search, greedy_search, max_output_lengths
from attnmt.decoding.translator import DecodeOverrides

PREFIXES = ["may", "", "samstag den", "", "", "sonntag , 20", "1982", "dienstag"]


def by_hand(model, src: list[int], prefix: list[int], limit: int) -> tuple[list[int], float]:
    """Greedy after the prefix, one sentence, stepping the model directly: (pieces, summed log-prob)."""
    batch = collate([src])
    state = model.encode(batch.src, batch.src_mask)
    token, out, total = BOS_ID, [], 0.0
    for t in range(limit + 1):
        with torch.no_grad():
            logits, state, _ = model.step(torch.tensor([token]), state)
        logp = F.log_softmax(logits[0].double(), -1)
        if t < len(prefix):
            token = prefix[t]
        elif t >= limit:
            token = EOS_ID
        else:
            allowed = logp.clone()
            allowed[[PAD_ID, BOS_ID]] = -float("inf")
            token = int(allowed.argmax())
        total += float(logp[token])
        if token == EOS_ID:
            break
        out.append(token)
    return out, total


@every_model
def test_greedy_with_a_prefix_is_the_prefix_then_the_most_probable_pieces(tokenizer, name):  # noqa: F811
    translator = make_translator(name, tokenizer, beam_size=1)
    model, srcs = translator.model, sentences([3, 7, 5, 2], seed=1)
    prefixes = [[5, 9], [], [7], [11, 12, 13, 14, 15, 16, 17, 18]]  # the last one longer than its limit
    batch = collate(srcs)
    width = max(len(p) for p in prefixes)
    prefix = torch.tensor([p + [PAD_ID] * (width - len(p)) for p in prefixes])
    found = greedy_search(model, batch.src, batch.src_mask, 1.0, 3, prefix=prefix)
    limits = max_output_lengths(batch.src_mask, 1.0, 3).tolist()
    for hyp, src, p, limit in zip(found, srcs, prefixes, limits):
        tokens, total = by_hand(model, src, p, max(limit, len(p)))
        assert hyp.tokens[:len(p)] == p
        assert hyp.tokens == tokens
        assert hyp.score == pytest.approx(total, abs=1e-9)


@every_model
def test_beam_of_one_with_a_prefix_equals_greedy_with_it(tokenizer, name):  # noqa: F811
    translator = make_translator(name, tokenizer, beam_size=1)
    srcs = sentences([4, 6, 3], seed=2)
    batch = collate(srcs)
    prefix = torch.tensor([[8, 9], [10, PAD_ID], [PAD_ID, PAD_ID]])
    greedy = greedy_search(translator.model, batch.src, batch.src_mask, 1.0, 3, prefix=prefix)
    beam = beam_search(translator.model, batch.src, batch.src_mask, 1, 1, 0.0, 1.0, 3, prefix=prefix)
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]
    assert [h.score for h in greedy] == pytest.approx([hyps[0].score for hyps in beam], abs=1e-9)


@every_model
@pytest.mark.parametrize("beam", [1, 4])
def test_empty_prefixes_are_no_prefixes(tokenizer, name, beam):  # noqa: F811
    translator = make_translator(name, tokenizer, beam_size=beam, nbest=min(beam, 2))
    free = translator.translate(LINES)
    assert [t.outputs for t in translator.translate(LINES, [""] * len(LINES))] == [t.outputs for t in free]


@every_model
@pytest.mark.parametrize("settings", [dict(beam_size=1), dict(beam_size=4, nbest=3, length_penalty=0.6)])
def test_every_output_starts_with_its_prefix_and_has_its_teacher_forced_score(tokenizer, name,  # noqa: F811
                                                                                settings):
    translator = make_translator(name, tokenizer, **settings)
    found = translator.translate(LINES, PREFIXES)
    sources = translator.encode(LINES)
    prefix_ids = translator.encode_prefixes(sources, PREFIXES)
    searched = translator.search(sources.ids, prefixes=prefix_ids)
    for line, prefix, translation in zip(LINES, PREFIXES, found):
        texts = [text for text, _ in translation.outputs]
        if not line.strip():
            assert texts == [""]
            continue
        assert all(text.startswith(tokenizer.normalize_tgt(prefix)) for text in texts), (prefix, texts)
    for ids, prefix, hyps in zip(sources.ids, prefix_ids, searched):
        assert len(hyps) == settings.get("nbest", 1)
        for hyp in hyps:
            assert hyp.tokens[:len(prefix)] == prefix
            batch = collate([ids], [hyp.tokens])
            with torch.no_grad():
                logp = torch.log_softmax(translator.model(batch).logits, dim=-1)[0]  # (T, V)
            forced = float(logp.gather(1, batch.tgt_out[0][:, None]).sum())
            assert hyp.score == pytest.approx(forced, abs=1e-9)


def test_sampling_continues_after_the_prefix(tokenizer):  # noqa: F811
    from attnmt.decoding.search import Sampling

    base = make_translator("transformer", tokenizer)
    drawn = base.with_overrides(DecodeOverrides(nbest=3, sampling=Sampling(seed=4)))
    for translation in drawn.translate(["may 22nd 2040", "1982"], ["may 2", "19"]):
        assert len(translation.outputs) == 3
        assert all(text.startswith(("may 2", "19")) for text, _ in translation.outputs)
