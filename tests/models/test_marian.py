"""``attnmt import`` of an OPUS-MT (Marian) folder against transformers itself, the oracle: a tiny
``MarianMTModel`` with random weights (``marian_fixture.py``), imported, must give transformers' token ids,
logits, cross-attention, greedy and beam outputs; exported back, transformers must load the very weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from marian_fixture import make_marian
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.specials import EOS_ID
from attnmt.data.batching import collate
from attnmt.decoding.search import beam_search, greedy_search
from attnmt.models.checkpoint import load_model

pytest.importorskip("transformers")  # a dev dependency: installed by the set-up, so never skipped in CI

SOURCES = ["march 14th 2019 at 7:05 pm", "on 3 may", "qqq ü words it has never seen",
           ">>deu<< the 1st of june 2020", "12/24/1999"]
TARGETS = ["14. märz 2019 um 19:05 uhr", "am 3. mai", "x", "1. juni 2020", "24.12.1999"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


class Pair:
    """An imported model beside transformers' own of the same folder."""

    def __init__(self, folder: Path, checkpoint: Path) -> None:
        from transformers import MarianMTModel, MarianTokenizer

        result = invoke("import", folder, checkpoint)
        assert result.exit_code == 0, result.output
        self.folder, self.checkpoint, self.message = folder, checkpoint, result.output
        self.model, self.tokenizer, self.cfg, _ = load_model(checkpoint)
        self.hf = MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
        self.hf_tokenizer = MarianTokenizer.from_pretrained(folder)
        self.marian_ids = torch.tensor(self.tokenizer.map.target_ids)  # attnmt id -> Marian id

    def batch(self, sources=SOURCES, targets=TARGETS):
        return collate(self.tokenizer.encode_src(sources), self.tokenizer.encode_tgt(targets))

    def hf_inputs(self, sources=SOURCES):
        return self.hf_tokenizer(sources, return_tensors="pt", padding=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    root = tmp_path_factory.mktemp("marian")
    return Pair(make_marian(root / "opus-mt-tiny", multilingual=True, eos_bias=4.0), root / "tiny.pt")


def test_the_tokenizer_gives_marians_ids_and_text(pair):
    """Source pieces with their EOS, unknown characters as unk, a >>deu<< token as one piece, target ids,
    and the text of any ids, as MarianTokenizer gives them."""
    mine = [[int(pair.marian_ids[i]) for i in ids + [EOS_ID]] for ids in pair.tokenizer.encode_src(SOURCES)]
    theirs = [pair.hf_tokenizer(s)["input_ids"] for s in SOURCES]
    assert mine == theirs
    assert pair.tokenizer.src_pieces(pair.tokenizer.encode_src([SOURCES[3]])[0])[0] == ">>deu<<"
    assert any(1 in ids for ids in pair.tokenizer.encode_src(SOURCES[2:3]))  # unk for ü
    mine = [[int(pair.marian_ids[i]) for i in ids + [EOS_ID]] for ids in pair.tokenizer.encode_tgt(TARGETS)]
    assert mine == [pair.hf_tokenizer(text_target=t)["input_ids"] for t in TARGETS]
    ids = torch.randint(4, pair.tokenizer.tgt_vocab_size, (6, 12), generator=torch.Generator().manual_seed(0))
    marian = [[int(pair.marian_ids[i]) for i in row] for row in ids.tolist()]
    assert pair.tokenizer.decode_tgt(ids.tolist()) == pair.hf_tokenizer.batch_decode(marian,
                                                                                       skip_special_tokens=True)


def test_logits_and_cross_attention_equal_transformers(pair):
    """Teacher forcing on a padded batch: logits within 1e-5 at every real position, cross-attention of
    every layer and head within 1e-5; attnmt's own pad takes no probability."""
    batch = pair.batch()
    labels = pair.hf_tokenizer(text_target=TARGETS, return_tensors="pt", padding=True)["input_ids"]
    labels[labels == pair.hf.config.pad_token_id] = -100
    with torch.no_grad():
        out = pair.model(batch, need_attention=True)
        ref = pair.hf(**pair.hf_inputs(), labels=labels, output_attentions=True)
    assert len(out.attention["cross"]) == len(ref.cross_attentions) == 2
    pieces = zip(pair.tokenizer.encode_src(SOURCES), pair.tokenizer.encode_tgt(TARGETS))
    for b, (src, tgt) in enumerate(pieces):
        T, S = len(tgt) + 1, len(src) + 1
        mine = out.logits[b, :T]
        torch.testing.assert_close(mine[:, 1:], ref.logits[b, :T][:, pair.marian_ids[1:]], rtol=0, atol=1e-5)
        assert bool((mine[:, 0] < mine.max(-1).values - 90).all())
        for layer, theirs in zip(out.attention["cross"], ref.cross_attentions):
            torch.testing.assert_close(layer[b, :, :T, :S], theirs[b, :, :T, :S], rtol=0, atol=1e-5)


def _generate(pair, beams: int):
    inputs = pair.hf_inputs()
    out = pair.hf.generate(**inputs, num_beams=beams, do_sample=False, length_penalty=0.0, max_new_tokens=60,
                           min_new_tokens=0, bad_words_ids=[[pair.hf.config.pad_token_id]],
                           forced_eos_token_id=None, early_stopping=False)
    rows = []
    for row in out[:, 1:].tolist():  # after the decoder start
        rows.append(row[: row.index(0) + 1] if 0 in row else row)
    return rows


def test_greedy_and_beam_search_equal_generate(pair):
    """Token for token, with the length penalty off on both sides and every sentence ending by itself."""
    batch = pair.batch()
    with torch.no_grad():
        greedy = greedy_search(pair.model, batch.src, batch.src_mask, max_len_a=0.0, max_len_b=60)
        beam = beam_search(pair.model, batch.src, batch.src_mask, beam_size=4, length_penalty=0.0,
                           max_len_a=0.0, max_len_b=60)
    for hyps, theirs in ((greedy, _generate(pair, 1)), ([h[0] for h in beam], _generate(pair, 4))):
        mine = [[int(pair.marian_ids[i]) for i in h.tokens] + [0] for h in hyps]
        assert all(len(h.tokens) < 50 for h in hyps)  # ended by EOS, not by the limit
        assert mine == theirs


def test_translate_asks_for_the_target_language_token(pair):
    """A multilingual OPUS-MT model: --tgt-lang deu puts >>deu<< before the source, as transformers' users
    do by hand; without it, one line asks for a language."""
    result = invoke("translate", pair.checkpoint, "on 3 may", "--tgt-lang", "deu", "--beam-size", "1")
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        out = pair.hf.generate(**pair.hf_tokenizer([">>deu<< on 3 may"], return_tensors="pt"), num_beams=1,
                               max_new_tokens=40, bad_words_ids=[[pair.hf.config.pad_token_id]])
    assert result.output.strip() == pair.hf_tokenizer.decode(out[0], skip_special_tokens=True)
    result = invoke("translate", pair.checkpoint, "on 3 may")
    assert result.exit_code == 2 and "deu, nld" in result.output and "--tgt-lang" in result.output
    assert "target languages (--tgt-lang): deu, nld" in pair.message


def test_export_gives_back_the_same_folder_and_import_the_same_checkpoint(pair, tmp_path):
    """Export of an import: transformers loads the very tensors it saved; import of that export: the same
    weights, tokenizer and config."""
    from safetensors.torch import load_file

    result = invoke("export", pair.checkpoint, tmp_path / "hf", "--to", "huggingface")
    assert result.exit_code == 0, result.output
    original = load_file(pair.folder / "model.safetensors")
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(exported) <= set(original)
    for name, tensor in exported.items():
        assert torch.equal(tensor, original[name]), name
    for name in ("vocab.json", "source.spm", "target.spm"):
        assert (tmp_path / "hf" / name).read_bytes() == (pair.folder / name).read_bytes() or (
            json.loads((tmp_path / "hf" / name).read_text()) == json.loads((pair.folder / name).read_text()))
    result = invoke("import", tmp_path / "hf", tmp_path / "again.pt")
    assert result.exit_code == 0, result.output
    model, tokenizer, cfg, _ = load_model(tmp_path / "again.pt")
    assert cfg.model == pair.cfg.model and tokenizer.fingerprint() == pair.tokenizer.fingerprint()
    for (name, a), b in zip(model.state_dict().items(), pair.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_ctranslate2_export_of_an_import_translates_as_attnmt(pair, tmp_path):
    """The decoder start, the logit bias and SiLU carry over to CTranslate2: the same beam outputs."""
    pytest.importorskip("ctranslate2")
    (tmp_path / "src.txt").write_text("\n".join(SOURCES[:3]) + "\n", encoding="utf-8")
    assert invoke("export", pair.checkpoint, tmp_path / "ct2").exit_code == 0
    args = ["-i", tmp_path / "src.txt", "--beam-size", "4", "--tgt-lang", "nld"]
    outputs = [invoke("translate", model, *args).output for model in (pair.checkpoint, tmp_path / "ct2")]
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 3
