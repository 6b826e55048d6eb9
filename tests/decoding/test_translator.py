"""``Translator``: the command line's overrides of a model's ``decode`` section, the path from lines to
source pieces, translations in input order (checked against each line translated alone), streaming
chunk by chunk, and batches that respect the token budget. Tiny random float64 models and the toy run's
real sentencepiece tokenizer.

Letters: K beam size.
"""

import pytest
import torch

import attnmt.decoding.translator
from attnmt.config.schema import DecodeConfig, LSTMConfig, TransformerConfig
from attnmt.data.arrival import chunks
from attnmt.data.batching import collate
from attnmt.data.readers import clean
from attnmt.data.tokenizer import EOS_ID, PAD_ID, load_tokenizer
from attnmt.decoding.search import Sampling, gnmt_penalty
from attnmt.decoding.translator import DecodeOverrides, Sources, Translation, Translator
from attnmt.errors import ConfigError
from attnmt.models import build_model

CONFIGS = {
    "transformer": TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1, dec_layers=1,
                                     d_ff=32, dropout=0.0),
    "lstm": LSTMConfig(arch="lstm", emb_dim=8, hidden_size=8, enc_layers=1, dec_layers=1, attn_dim=8,
                       dropout=0.0),
}
every_model = pytest.mark.parametrize("name", list(CONFIGS))

LINES = [
    "may 22nd 2040",
    "",
    "saturday the 3rd of february 1904 at 5:15 pm",
    "november 19th 1982",
    "   \t ",
    "sunday , december 20th , 2030 at 6:06 am",
    "1982",
    "tuesday the 25th of october 2083 at 9:49 am",
]


@pytest.fixture(scope="module")
def tokenizer(toy_run):
    run_dir, result = toy_run
    assert result.exit_code == 0, result.output
    return load_tokenizer(run_dir / "tokenizer")


def make_model(name, tokenizer, seed=0):
    """A random float64 model with weights large enough that its distributions are far from uniform (so
    the searches meet no near-ties)."""
    torch.manual_seed(seed)
    model = build_model(CONFIGS[name], tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, PAD_ID)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.6)
    return model


def decode_config(**settings) -> DecodeConfig:
    """Short outputs (at most source length + 3 pieces) keep random models fast."""
    return DecodeConfig(**{"max_len_a": 1.0, "max_len_b": 3, **settings})


def make_translator(name, tokenizer, **settings):
    return Translator(make_model(name, tokenizer), tokenizer, decode_config(**settings))


def sentences(lengths, seed, vocab=100):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=generator).tolist() for n in lengths]


def assert_same_translations(ours: list[Translation], expected: list[Translation]):
    assert len(ours) == len(expected)
    for a, b in zip(ours, expected):
        assert [text for text, _ in a.outputs] == [text for text, _ in b.outputs]
        assert [score for _, score in a.outputs] == pytest.approx([score for _, score in b.outputs], abs=1e-9)
        assert a.truncated == b.truncated


# ------------------------------------------------------------------------------------- with_overrides


def test_overrides_of_none_keep_the_models_settings():
    decode = DecodeConfig(beam_size=4, length_penalty=0.8, max_tokens=1234, max_src_len=50)
    copy = DecodeOverrides().apply(decode, 100)
    assert copy == decode and copy is not decode


def test_overrides_replace_what_they_name():
    decode = DecodeConfig(beam_size=4, length_penalty=0.8, max_tokens=1234)
    copy = DecodeOverrides(beam_size=2, nbest=2, length_penalty=0.0, max_tokens=99).apply(decode, 100)
    assert (copy.beam_size, copy.nbest, copy.length_penalty, copy.max_tokens) == (2, 2, 0.0, 99)
    named = {"beam_size", "nbest", "length_penalty", "max_tokens"}
    assert copy.model_dump(exclude=named) == decode.model_dump(exclude=named)


@pytest.mark.parametrize("model_beam, nbest, beam", [(4, 1, 4), (4, 3, 4), (4, 4, 4), (4, 6, 6), (1, 2, 2)])
def test_nbest_widens_the_default_beam_to_at_least_nbest(model_beam, nbest, beam):
    copy = DecodeOverrides(nbest=nbest).apply(DecodeConfig(beam_size=model_beam), 100)
    assert (copy.beam_size, copy.nbest) == (beam, nbest)


def test_the_model_nbest_is_replaced_by_the_command_lines():
    copy = DecodeOverrides().apply(DecodeConfig(beam_size=4, nbest=3), 100)
    assert (copy.beam_size, copy.nbest) == (4, 1)


def test_an_explicit_beam_is_kept_even_when_narrower_than_the_models():
    copy = DecodeOverrides(beam_size=1).apply(DecodeConfig(beam_size=8), 100)
    assert (copy.beam_size, copy.nbest) == (1, 1)


def test_nbest_over_an_explicit_beam_is_refused():
    with pytest.raises(ConfigError) as info:
        DecodeOverrides(beam_size=2, nbest=3).apply(DecodeConfig(beam_size=8), 100)
    assert str(info.value) == "--nbest 3 must not exceed the beam size 2"


def test_a_beam_wider_than_the_target_vocabulary_is_refused():
    with pytest.raises(ConfigError) as info:
        DecodeOverrides(beam_size=101).apply(DecodeConfig(), 100)
    assert str(info.value) == "--beam-size 101 exceeds the target vocabulary (100 pieces)"
    assert DecodeOverrides(beam_size=100).apply(DecodeConfig(), 100).beam_size == 100  # as wide as it: fine


def test_a_models_beam_wider_than_the_vocabulary_is_refused_naming_what_set_it():
    with pytest.raises(ConfigError, match=r"^decode.beam_size 12 exceeds the target vocabulary \(10 pieces"):
        DecodeOverrides().apply(DecodeConfig(beam_size=12), 10)
    with pytest.raises(ConfigError, match=r"^--nbest 11 exceeds the target vocabulary \(10 pieces\)"):
        DecodeOverrides(nbest=11).apply(DecodeConfig(beam_size=4), 10)


def test_overrides_leave_the_original_unchanged():
    decode = DecodeConfig(beam_size=4, nbest=2, length_penalty=0.8, max_tokens=1234)
    before = decode.model_dump()
    DecodeOverrides(beam_size=6, nbest=5, length_penalty=0.1, max_tokens=10).apply(decode, 100)
    assert decode.model_dump() == before


# ---------------------------------------------------------------------------------------------- encode


def test_encode_cleans_and_leaves_empty_lines_out_but_counts_them(tokenizer):
    translator = make_translator("lstm", tokenizer)
    lines = ["  may\t 22nd   2040 ", "", "\x1b[31mnovember\x1b[0m 19th", " \t ", "june\x00 1st", "\x1b[0m"]
    sources = translator.encode(lines)
    assert isinstance(sources, Sources)
    assert sources.count == 6
    assert sources.lines == [0, 2, 4]
    texts = [clean(lines[i]) for i in sources.lines]
    assert texts == ["may 22nd 2040", "november 19th", "june 1st"]
    assert sources.ids == tokenizer.encode_src(texts)
    assert sources.truncated == set()


def test_encode_normalises_to_nfc(tokenizer):
    translator = make_translator("lstm", tokenizer)
    decomposed, composed = "cafe\u0301 1982", "caf\u00e9 1982"
    assert translator.encode([decomposed]).ids == tokenizer.encode_src([composed])


def test_encode_of_nothing(tokenizer):
    sources = make_translator("lstm", tokenizer).encode([])
    assert (sources.ids, sources.lines, sources.truncated, sources.count) == ([], [], set(), 0)


def test_encode_cuts_to_max_src_len_and_records_the_lines_cut(tokenizer):
    lines = ["", LINES[2], LINES[0], LINES[5]]
    full = tokenizer.encode_src([lines[1], lines[2], lines[3]])
    limit = len(full[1])  # line 2 is exactly as long as the limit: not cut
    assert len(full[0]) > limit and len(full[2]) > limit
    sources = make_translator("lstm", tokenizer, max_src_len=limit).encode(lines)
    assert sources.lines == [1, 2, 3]
    assert sources.ids == [full[0][:limit], full[1], full[2][:limit]]
    assert sources.truncated == {1, 3}  # input positions, not positions in ids


# --------------------------------------------------------------------------------- translate and best


@every_model
def test_translate_gives_one_output_per_line_in_input_order(tokenizer, name):
    translator = make_translator(name, tokenizer, beam_size=1)
    ours = translator.translate(LINES)
    alone = [translator.translate([line])[0] for line in LINES]
    assert_same_translations(ours, alone)
    assert len({t.outputs[0][0] for t in ours if t.outputs[0][0]}) > 2  # the lines do differ
    for i in (1, 4):
        assert ours[i].outputs == [("", 0.0)] and not ours[i].truncated


@every_model
def test_beam_translations_are_those_of_each_line_alone(tokenizer, name):
    translator = make_translator(name, tokenizer, beam_size=3, nbest=3, max_tokens=60)
    ours = translator.translate(LINES)
    assert_same_translations(ours, [translator.translate([line])[0] for line in LINES])
    for i, translation in enumerate(ours):
        if LINES[i].strip():
            assert len(translation.outputs) == 3
            scores = [score for _, score in translation.outputs]
            assert scores == sorted(scores, reverse=True)


@every_model
def test_a_translation_is_the_detokenised_search_result_with_its_normalised_score(tokenizer, name):
    """The text is the best hypothesis decoded; the score is its log-probability under teacher forcing
    (the model itself as the oracle) over the GNMT penalty."""
    translator = make_translator(name, tokenizer, beam_size=1, length_penalty=0.6)
    line = LINES[2]
    (translation,) = translator.translate([line])
    (ids,) = translator.encode([line]).ids
    ((hyp,),) = translator.search([ids])
    assert translation.outputs[0][0] == tokenizer.decode_tgt([hyp.tokens])[0]
    batch = collate([ids], [hyp.tokens])
    with torch.no_grad():
        logp = torch.log_softmax(translator.model(batch).logits, dim=-1)[0]  # (T, V)
    forced = float(logp.gather(1, batch.tgt_out[0][:, None]).sum())
    assert batch.tgt_out[0, -1] == EOS_ID
    assert translation.outputs[0][1] == pytest.approx(forced / gnmt_penalty(len(hyp.tokens) + 1, 0.6),
                                                      abs=1e-9)


def test_translate_marks_the_truncated_lines(tokenizer):
    translator = make_translator("transformer", tokenizer, beam_size=1, max_src_len=4)
    ours = translator.translate(["1982", LINES[2], "", LINES[5]])
    assert [t.truncated for t in ours] == [False, True, False, True]


def test_translate_of_empty_lines_only(tokenizer):
    translator = make_translator("transformer", tokenizer)
    assert translator.translate(["", "  ", "\x1b[0m"]) == [Translation([("", 0.0)])] * 3
    assert translator.translate([]) == []
    assert translator.best(["", ""]) == ["", ""]


@every_model
def test_best_is_the_first_output_of_each_translation(tokenizer, name):
    translator = make_translator(name, tokenizer, beam_size=2, nbest=2)
    best = translator.best(LINES)
    assert best == [t.outputs[0][0] for t in translator.translate(LINES)]
    assert len(best) == len(LINES) and best[1] == best[4] == ""


# ------------------------------------------------------------------------------------ translate_stream


@pytest.mark.parametrize("chunk_lines", [1, 3, len(LINES), 100])
def test_translate_stream_is_translate_chunk_by_chunk(tokenizer, chunk_lines):
    translator = make_translator("transformer", tokenizer, beam_size=2, max_tokens=40)
    streamed = list(translator.translate_stream(iter(LINES), chunk_lines=chunk_lines))
    expected_chunks = [LINES[i : i + chunk_lines] for i in range(0, len(LINES), chunk_lines)]
    assert [len(chunk) for chunk in streamed] == [len(chunk) for chunk in expected_chunks]
    for chunk, lines in zip(streamed, expected_chunks):
        assert_same_translations(chunk, translator.translate(lines))
    assert_same_translations([t for chunk in streamed for t in chunk], translator.translate(LINES))


def test_translate_stream_reads_a_bounded_chunk_at_a_time(tokenizer):
    translator = make_translator("lstm", tokenizer, beam_size=1)
    read = []

    def lines():
        for line in LINES:
            read.append(line)
            yield line

    stream = translator.translate_stream(lines(), chunk_lines=3)
    assert read == []  # nothing is read before the first chunk is asked for
    first = next(stream)
    # A chunk is what has arrived, at most 3 lines; reading runs ahead by a bounded queue of 2 chunks.
    assert 1 <= len(first) <= 3 and len(read) <= 3 + 2 * 3 + 1
    rest = list(stream)
    assert read == LINES and all(1 <= len(chunk) <= 3 for chunk in rest)
    assert sum(map(len, [first, *rest])) == len(LINES)


def test_chunks():
    assert list(chunks(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunks(range(6), 3)) == [[0, 1, 2], [3, 4, 5]]
    assert list(chunks([], 3)) == []


# ------------------------------------------------------------------------------------ search batching


@pytest.fixture
def collated(monkeypatch):
    """The source ids of every batch ``Translator.search`` builds."""
    batches = []

    def spy(src_ids, *args, **kwargs):
        batches.append([list(ids) for ids in src_ids])
        return collate(src_ids, *args, **kwargs)

    monkeypatch.setattr(attnmt.decoding.translator, "collate", spy)
    return batches


def padded_cost(batch, beam_size):
    """Padded source pieces (EOS included) x K rows: what ``decode.max_tokens`` bounds."""
    return (max(len(ids) for ids in batch) + 1) * len(batch) * beam_size


@pytest.mark.parametrize("beam_size, max_tokens", [(1, 24), (3, 60), (2, 37)])
def test_search_batches_respect_the_token_budget(tokenizer, collated, beam_size, max_tokens):
    lengths = [3, 9, 1, 5, 5, 2, 7, 4, 6, 1, 8, 3]
    src_ids = sentences(lengths, seed=1)
    translator = make_translator("transformer", tokenizer, beam_size=beam_size, max_tokens=max_tokens)
    translator.search(src_ids)
    assert len(collated) > 2  # the budget does cut
    for batch in collated:
        assert padded_cost(batch, beam_size) <= max_tokens, batch
    # every sentence searched exactly once
    assert sorted(map(tuple, (ids for batch in collated for ids in batch))) == sorted(map(tuple, src_ids))
    # and batches are full: adding the next sentence (by length) would have broken the budget
    flat = [ids for batch in collated for ids in batch]
    assert [len(ids) for ids in flat] == sorted(lengths)
    position = 0
    for batch in collated[:-1]:
        position += len(batch)
        assert padded_cost(batch + [flat[position]], beam_size) > max_tokens


def test_a_sentence_over_the_budget_gets_a_batch_of_its_own(tokenizer, collated):
    src_ids = sentences([2, 2, 12, 3], seed=2)
    translator = make_translator("lstm", tokenizer, beam_size=2, max_tokens=20)  # 13 x 2 rows > 20
    found = translator.search(src_ids)
    assert [12] in [[len(ids) for ids in batch] for batch in collated]
    assert all(padded_cost(batch, 2) <= 20 for batch in collated if len(batch) > 1)
    assert len(found) == 4 and all(len(hyps) == 1 and hyps[0].tokens for hyps in found)


@every_model
@pytest.mark.parametrize("beam_size, nbest", [(1, 1), (3, 2)])
def test_search_gives_hypotheses_in_input_order(tokenizer, name, beam_size, nbest):
    """Batched by length (in an order unlike the input's) the hypotheses are those of each sentence
    searched alone."""
    src_ids = sentences([6, 1, 9, 3, 3, 7, 2, 5], seed=3)
    translator = make_translator(name, tokenizer, beam_size=beam_size, nbest=nbest, max_tokens=12 * beam_size)
    found = translator.search(src_ids)
    alone = [translator.search([ids])[0] for ids in src_ids]
    assert len(found) == len(src_ids)
    for hyps, expected in zip(found, alone):
        assert len(hyps) == nbest
        assert [h.tokens for h in hyps] == [h.tokens for h in expected]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in expected], abs=1e-9)
    assert len({tuple(hyps[0].tokens) for hyps in found}) > 2  # the sentences do differ


def test_search_of_nothing(tokenizer, collated):
    assert make_translator("transformer", tokenizer).search([]) == []
    assert collated == []


def test_search_with_attention_gives_one_row_per_output_step(tokenizer):
    translator = make_translator("lstm", tokenizer, beam_size=1)
    src_ids = sentences([4, 2], seed=4)
    for ids, (hyp,) in zip(src_ids, translator.search(src_ids, need_attention=True)):
        assert hyp.attention is not None
        assert hyp.attention.shape[0] == len(hyp.tokens) + 1
        rows = hyp.attention[:, : len(ids) + 1].sum(-1)  # the source's pieces and EOS
        assert rows.tolist() == pytest.approx([1.0] * (len(hyp.tokens) + 1))


def test_translator_refuses_settings_no_search_can_run_with(tokenizer):
    model = make_model("lstm", tokenizer)
    decode = DecodeConfig().model_copy(update={"beam_size": 2, "nbest": 3})  # skips the section's check
    with pytest.raises(ValueError, match="nbest must be between 1 and beam_size"):
        Translator(model, tokenizer, decode)


def test_arrived_takes_what_has_come_and_keeps_order():
    import threading

    from attnmt.data.arrival import arrived

    # A file: everything is there, so the chunks are full (after the first, which may be taken early).
    chunks = list(arrived(iter(range(2500)), 1000))
    assert [x for c in chunks for x in c] == list(range(2500)) and max(map(len, chunks)) == 1000
    # A slow source: a chunk does not wait for more than what has arrived.
    gate = threading.Event()

    def slow():
        yield "first"
        gate.wait(10)
        yield "second"

    stream = arrived(slow(), 1000)
    assert next(stream) == ["first"]  # returned while "second" is still held back
    gate.set()
    assert list(stream) == [["second"]]
    # An error in the source comes after the items before it.

    def broken():
        yield "a"
        raise ValueError("bad byte")

    stream = arrived(broken(), 1000)
    with pytest.raises(ValueError, match="bad byte"):
        got = [next(stream)]
        got += list(stream)
    assert list(arrived(iter([]), 10)) == []


def test_sampling_overrides_give_nbest_rows_whatever_the_beam():
    draw = Sampling(seed=3)
    decode = DecodeOverrides(beam_size=2, nbest=5, sampling=draw).apply(DecodeConfig(beam_size=4), 100)
    assert (decode.beam_size, decode.nbest) == (5, 5)
    with pytest.raises(ConfigError, match=r"^--nbest 11 exceeds the target vocabulary \(10 pieces\)"):
        DecodeOverrides(nbest=11, sampling=draw).apply(DecodeConfig(), 10)


def test_overrides_name_the_fields_as_the_caller_spells_them():
    with pytest.raises(ConfigError, match=r"^nbest 3 must not exceed the beam size 2$"):
        DecodeOverrides(beam_size=2, nbest=3, spelling="api").apply(DecodeConfig(), 100)
    with pytest.raises(ConfigError, match=r"^beam_size 101 exceeds"):
        DecodeOverrides(beam_size=101, spelling="api").apply(DecodeConfig(), 100)


@every_model
def test_a_translator_with_overrides_decodes_as_one_built_with_them(tokenizer, name):
    base = make_translator(name, tokenizer, beam_size=1)
    built = base.with_overrides(DecodeOverrides(beam_size=3, nbest=2, length_penalty=0.0))
    assert (built.decode.beam_size, built.decode.nbest, built.decode.length_penalty) == (3, 2, 0.0)
    assert (base.decode.beam_size, base.decode.nbest) == (1, 1) and built.model is base.model
    direct = Translator(base.model, tokenizer, built.decode)
    assert_same_translations(built.translate(LINES), direct.translate(LINES))
    assert all(len(t.outputs) == 2 for t in built.translate(LINES) if t.outputs[0][0])
