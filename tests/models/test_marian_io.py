"""``attnmt import`` and ``export --to huggingface`` beyond the oracle of ``test_marian.py``: folders it
refuses (one line, exit 4, nothing written), separate vocabularies, a model trained in attnmt with Marian's
options exported for transformers, and the fine-tuning of an imported model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import CONFIGS, assert_one_error_line
from marian_fixture import make_marian
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.data.batching import collate
from attnmt.models.checkpoint import load_model

pytest.importorskip("transformers")  # a dev dependency: installed by the set-up, so never skipped in CI

PAIRS = [("on 3 may", "am 3. mai"), ("march 14th 2019 at 7:05 pm", "14. märz 2019 um 19:05 uhr")]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tiny")


def _broken(folder: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    change(copy)
    return copy


def _edit_json(name: str, edit):
    def change(copy: Path) -> None:
        data = json.loads((copy / name).read_text())
        edit(data)
        (copy / name).write_text(json.dumps(data))
    return change


def _truncate(copy: Path) -> None:
    path = copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD = {
    "another model type": (_edit_json("config.json", lambda d: d.update(model_type="bart")),
                           "model_type is 'bart'"),
    "no vocab.json": (lambda copy: (copy / "vocab.json").unlink(), "vocab.json: missing"),
    "a vocabulary that does not fit": (_edit_json("vocab.json", lambda d: d.update({"extra": len(d)})),
                                       "embedding is"),
    "truncated weights": (_truncate, "model.safetensors: unreadable weights"),
    "a pre-norm Marian": (_edit_json("config.json", lambda d: d.update(normalize_before=True)), "pre-norm"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_folder_is_one_line_exit_4_and_nothing_written(folder, tmp_path, case):
    change, fragment = BAD[case]
    broken = _broken(folder, tmp_path, change)
    result = invoke("import", broken, tmp_path / "out.pt")
    assert result.exit_code == 4, result.output
    assert fragment in assert_one_error_line(result.output)
    assert not (tmp_path / "out.pt").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_a_hub_name_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("import", "Helsinki-NLP/opus-mt-en-de", "out.pt")
    assert result.exit_code == 4
    line = assert_one_error_line(result.output)
    assert "downloads nothing" in line and "hf download Helsinki-NLP/opus-mt-en-de" in line


def test_separate_vocabularies_import_and_export(tmp_path):
    """target_vocab.json: two embeddings, the logits still transformers' own, and the export loads."""
    from transformers import MarianMTModel, MarianTokenizer

    folder = make_marian(tmp_path / "separate", separate=True)
    assert invoke("import", folder, tmp_path / "s.pt").exit_code == 0
    model, tokenizer, cfg, _ = load_model(tmp_path / "s.pt")
    assert not cfg.model.share_embeddings and tokenizer.src_vocab_size != tokenizer.tgt_vocab_size
    hf = MarianMTModel.from_pretrained(folder).eval()
    hf_tokenizer = MarianTokenizer.from_pretrained(folder)
    src, tgt = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    with torch.no_grad():
        out = model(collate(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt))).logits
        # One sentence: MarianTokenizer pads labels with the source vocabulary's pad id.
        ref = hf(**hf_tokenizer(src[:1], text_target=tgt[:1], return_tensors="pt")).logits
    order = torch.tensor(tokenizer.map.target_ids)
    T = len(tokenizer.encode_tgt(tgt[:1])[0]) + 1
    torch.testing.assert_close(out[0, :T, 1:], ref[0, :T][:, order[1:]], rtol=0, atol=1e-5)
    assert invoke("export", tmp_path / "s.pt", tmp_path / "back", "--to", "huggingface").exit_code == 0
    assert MarianTokenizer.from_pretrained(tmp_path / "back").separate_vocabs


def _native_checkpoint(tmp_path: Path, **model) -> Path:
    """An untrained attnmt Transformer with Marian's options and attnmt's own tokenizer, as a checkpoint."""
    from attnmt.config.schema import config_from_dict
    from attnmt.data.tokenizer import train_tokenizer
    from attnmt.data.toy import toy_pairs
    from attnmt.models import build_model
    from attnmt.models.checkpoint import FORMAT, bytes_tensor, fingerprint, save_payload

    section = {"arch": "transformer", "d_model": 32, "n_heads": 4, "enc_layers": 2, "dec_layers": 2,
               "d_ff": 64,
               "norm": "post", "positions": "sinusoidal_concat", "activation": "silu", "output_bias": True,
               "scale_embeddings": False}
    cfg = config_from_dict({"model": section | model, "data": {"src_lang": "en", "tgt_lang": "de"},
                            "tokenizer": {"vocab_size": 100}}, source="test")
    pairs = toy_pairs("train", 300)
    tokenizer = train_tokenizer([p[0] for p in pairs], [p[1] for p in pairs], cfg.tokenizer)
    torch.manual_seed(0)
    net = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    with torch.no_grad():
        net.output.bias.normal_(0, 0.5)
    path = tmp_path / "native.pt"
    save_payload({"format": FORMAT, "model": net.state_dict(), "optimizer": None, "progress": {"step": 0},
                  "fingerprint": fingerprint(cfg, 1, tokenizer, []), "config": cfg.to_dict(),
                  "tokenizer": {k: bytes_tensor(v) for k, v in tokenizer.files().items()},
                  "tokenizer_meta": tokenizer.meta()}, path)
    return path


def test_a_model_trained_in_attnmt_exports_for_transformers(tmp_path):
    """Marian's options from a config, embeddings unscaled (attnmt's tokenizer, decoding from its own bos):
    transformers loads the export and gives the same logits for the same ids; a pre-norm model is refused
    by name, exit 2."""
    from transformers import MarianMTModel, MarianTokenizer

    checkpoint = _native_checkpoint(tmp_path)
    result = invoke("export", checkpoint, tmp_path / "hf", "--to", "huggingface")
    assert result.exit_code == 0, result.output
    model, tokenizer, _, _ = load_model(checkpoint)
    hf = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    hf_tokenizer = MarianTokenizer.from_pretrained(tmp_path / "hf")
    src, tgt = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    batch = collate(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt))
    S = len(tokenizer.encode_src(src[:1])[0]) + 1
    assert hf_tokenizer(src[0])["input_ids"] == batch.src[0, :S].tolist()
    with torch.no_grad():
        mine = model(batch).logits
        theirs = hf(input_ids=batch.src, attention_mask=batch.src_mask, decoder_input_ids=batch.tgt_in).logits
    T = len(tokenizer.encode_tgt(tgt[:1])[0]) + 1
    torch.testing.assert_close(mine[0, :T], theirs[0, :T], rtol=0, atol=1e-5)
    (tmp_path / "pre").mkdir()
    pre = _native_checkpoint(tmp_path / "pre", norm="pre")
    result = invoke("export", pre, tmp_path / "no", "--to", "huggingface")
    assert result.exit_code == 2 and "model.norm is pre" in assert_one_error_line(result.output)
    assert not (tmp_path / "no").exists()


def _dev_loss(checkpoint: Path, pairs) -> float:
    model, tokenizer, _, _ = load_model(checkpoint)
    batch = collate(tokenizer.encode_src([p[0] for p in pairs]), tokenizer.encode_tgt([p[1] for p in pairs]))
    with torch.no_grad():
        logits = model(batch).logits
    return float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.tgt_out, ignore_index=0))


def test_fine_tuning_the_imported_model_lowers_its_dev_loss(folder, tmp_path):
    """configs/finetune_opus_mt.yaml's settings on the toy task: the weights train (dev loss falls) and the
    run's checkpoint keeps the imported tokenizer."""
    from attnmt.data.toy import toy_pairs

    assert invoke("import", folder, tmp_path / "tiny.pt").exit_code == 0
    model = load_model(tmp_path / "tiny.pt")[2].model.model_dump(mode="json")
    config = tmp_path / "finetune.yaml"
    text = (CONFIGS / "finetune_opus_mt.yaml").read_text(encoding="utf-8")
    config.write_text(text, encoding="utf-8")
    sets = [f"model.{k}={json.dumps(v)}" for k, v in model.items() if k != "arch"]
    sets += ["data.train={format: toy, split: train, size: 300}",
             "data.dev={format: toy, split: dev, size: 40}",
             f"train.init_from={tmp_path / 'tiny.pt'}", "train.max_steps=30", "train.eval_every=1000",
             "train.save_every=30", "train.lr=0.001", "train.warmup_steps=5", "train.max_tokens=600",
             "data.src_lang=en", "data.tgt_lang=de"]
    result = invoke("train", config, "--run-dir", tmp_path / "run", *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    dev = toy_pairs("dev", 40)
    after = tmp_path / "run" / "checkpoints" / "step_00000030.pt"
    assert _dev_loss(after, dev) < _dev_loss(tmp_path / "tiny.pt", dev) - 0.5
    assert load_model(after)[1].fingerprint() == load_model(tmp_path / "tiny.pt")[1].fingerprint()


def test_frozen_embeddings_do_not_move(tmp_path):
    """train.freeze_embeddings: a step moves the layers, never the embeddings (nor the output tied to
    them)."""
    from attnmt.config.schema import TrainConfig
    from attnmt.training.optim import make_optimizer

    model, tokenizer, _, _ = load_model(_native_checkpoint(tmp_path))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = make_optimizer(model.train(), TrainConfig(freeze_embeddings=True, lr=0.01))
    batch = collate(tokenizer.encode_src([p[0] for p in PAIRS]), tokenizer.encode_tgt([p[1] for p in PAIRS]))
    model(batch).logits.sum().backward()
    optimizer.step()
    after = model.state_dict()
    assert torch.equal(after["src_embed.weight"], before["src_embed.weight"])
    assert torch.equal(after["output.weight"], before["output.weight"])
    assert not torch.equal(after["encoder.0.ffn.0.weight"], before["encoder.0.ffn.0.weight"])


def test_an_imported_model_decodes_with_int8(folder, tmp_path):
    """``--int8`` on an imported OPUS-MT model (post-norm, its own vocabulary and output bias): every
    linear layer quantized, and ``translate --int8`` prints what the model quantized in this process finds."""
    from attnmt.cli.common import open_translator
    from attnmt.decoding.quantize import quantized
    from attnmt.decoding.translator import DecodeOverrides

    assert invoke("import", folder, tmp_path / "tiny.pt").exit_code == 0
    translator = open_translator(tmp_path / "tiny.pt", "cpu", DecodeOverrides(beam_size=2, int8=True))[0]
    assert quantized(translator.model)
    sources = [src for src, _ in PAIRS]
    found = invoke("translate", tmp_path / "tiny.pt", *sources, "--int8", "--beam-size", 2)
    assert found.exit_code == 0, found.output
    assert found.stdout.splitlines() == translator.best(sources)
