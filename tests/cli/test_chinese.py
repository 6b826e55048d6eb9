"""Chinese end to end on the embedded toy task (English dates <-> Chinese dates, generated offline): prepare
with the Chinese defaults, train a little in both directions, translate Chinese out and in, score with
sacrebleu's zh tokenizer whatever code names the language, draw heatmaps with Chinese words, align
pre-segmented Chinese against gold links; and the Chinese-path traps refused before anything is written."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from helpers import assert_one_error_line, hash_tree
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.languages import is_cjk_char
from attnmt.data.tokenizer import META_FILE

CODES = ["zh", "zh-CN", "zh-TW", "zh-Hans", "zh-Hant", "zho", "chi", "cmn", "ZH-cn", "Cmn"]
TINY = {"arch": "transformer", "d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 64,
        "dropout": 0.0}
TRAIN = {"device": "cpu", "lr": 5e-3, "warmup_steps": 10, "max_tokens": 600, "max_steps": 150,
         "log_every": 50, "eval_every": 150, "save_every": 150, "precision": "fp32"}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py


def write_config(path: Path, data: dict, tokenizer: dict | None = None, model: dict | None = None) -> Path:
    config = {"data": data, "tokenizer": {"vocab_size": 400, "hard_vocab_limit": False, **(tokenizer or {})},
              "model": {**TINY, **(model or {})}, "train": TRAIN, "decode": {"beam_size": 2, "max_len_b": 12}}
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An English -> Chinese run on the toy source and a Chinese -> English run on toy-data's files."""
    root = tmp_path_factory.mktemp("chinese")
    files = root / "toy"
    assert invoke("toy-data", files, "--lang", "zh", "--train-size", 300, "--dev-size", 20,
                  "--test-size", 30).exit_code == 0
    toy = {"format": "toy", "lang": "zh"}
    en_zh = write_config(root / "en_zh.yaml", {"src_lang": "en", "tgt_lang": "zh",
                                               "train": {**toy, "split": "train", "size": 300},
                                               "dev": {**toy, "split": "dev", "size": 20}})
    text = {split: {"src": str(files / f"{split}.zh"), "tgt": str(files / f"{split}.en")}
            for split in ("train", "dev")}
    zh_en = write_config(root / "zh_en.yaml", {"src_lang": "zh-CN", "tgt_lang": "en", **text})
    made = {}
    for name, config in (("en_zh", en_zh), ("zh_en", zh_en)):
        result = invoke("train", config, "--run-dir", root / name)
        assert result.exit_code == 0, result.output
        made[name] = root / name
    return made, files


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_prepare_takes_the_chinese_defaults_and_leaves_nothing_unknown(runs):
    made, _ = runs
    for name in ("en_zh", "zh_en"):
        resolved = (made[name] / "config.yaml").read_text(encoding="utf-8")
        assert "character_coverage: 0.9995" in resolved and "byte_fallback: true" in resolved
        assert "normalization: identity" in resolved  # ？，！ kept: NFKC would fold them into ASCII
        stats = json.loads((made[name] / "data" / "stats.json").read_text(encoding="utf-8"))
        assert all(s["src_unk_rate"] == 0 and s["tgt_unk_rate"] == 0 for s in stats), stats


def test_a_run_whose_tokenizer_predates_the_chinese_normalization_says_how_to_go_on(runs, tmp_path):
    """A tokenizer folder from before ``normalization`` was recorded was trained with NFKC; the default for
    a Chinese side is now identity, so prepare refuses and names the setting that keeps the old one."""
    made, files = runs
    old = tmp_path / "old"
    shutil.copytree(made["en_zh"], old)
    meta = old / "tokenizer" / META_FILE
    record = json.loads(meta.read_text(encoding="utf-8"))
    del record["settings"]["normalization"]
    meta.write_text(json.dumps(record), encoding="utf-8")
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    config = files.parent / "en_zh.yaml"
    refused = invoke("prepare", config, "--run-dir", old)
    assert refused.exit_code == 2, refused.output
    assert "normalization: 'nmt_nfkc' -> 'identity'" in refused.output
    assert 'set tokenizer.normalization: "nmt_nfkc"' in refused.output
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    kept = invoke("prepare", config, "--run-dir", old, "--set", "tokenizer.normalization=nmt_nfkc")
    assert kept.exit_code == 0, kept.output
    # A prepared run whose resolved config.yaml says nmt_nfkc (how an older attnmt wrote it): train refuses.
    resolved = old / "config.yaml"
    resolved.write_text(resolved.read_text(encoding="utf-8").replace("normalization: identity",
                                                                      "normalization: nmt_nfkc"),
                        encoding="utf-8")
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    refused = invoke("train", config, "--run-dir", old)
    assert refused.exit_code == 2, refused.output
    assert "tokenizer.normalization: 'nmt_nfkc' -> 'identity'" in refused.output
    assert "set them back to go on with this run" in refused.output
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before


def test_validation_scores_chinese_with_the_zh_tokenizer(runs):
    made, _ = runs
    records = [json.loads(line) for line in lines(made["en_zh"] / "metrics.jsonl")]
    valid = [r for r in records if r["event"] == "valid"]
    assert valid and all("tok:zh" in r["bleu_signature"] for r in valid)
    back = [json.loads(line) for line in lines(made["zh_en"] / "metrics.jsonl") if '"valid"' in line]
    assert back and all("tok:13a" in r["bleu_signature"] for r in back)


def test_translate_chinese_out_and_in(runs, tmp_path):
    made, files = runs
    out = invoke("translate", made["en_zh"], "-i", files / "test.en")
    assert out.exit_code == 0, out.output
    hyps = out.stdout.splitlines()
    assert len(hyps) == 30 and sum(any(is_cjk_char(c) for c in h) for h in hyps) >= 25
    back = invoke("translate", made["zh_en"], *lines(files / "test.zh")[:3], "2019年3月14日")
    assert back.exit_code == 0, back.output
    assert len(back.stdout.splitlines()) == 4 and not any(is_cjk_char(c) for c in back.stdout)


@pytest.mark.parametrize("code", CODES)
def test_eval_picks_the_zh_tokenizer_for_every_code_of_chinese(tmp_path, code):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("我喜欢猫。\n他们在学校。\n", encoding="utf-8")
    ref.write_text("我喜欢狗。\n他们在学校。\n", encoding="utf-8")
    result = invoke("eval", "--hyp", hyp, "--ref", ref, "--tgt-lang", code, "--json")
    assert result.exit_code == 0, result.output
    scores = {s["metric"]: s for s in json.loads(result.stdout)}
    assert "tok:zh" in scores["bleu"]["signature"] and "asian:yes" in scores["ter"]["signature"]
    assert scores["bleu"]["score"] > 0  # 13a would see each sentence as one word and score 0 + 50


def test_eval_of_a_chinese_model_reports_bleu_with_zh_and_chrf(runs):
    made, files = runs
    result = invoke("eval", made["en_zh"], "--src", files / "test.en", "--ref", files / "test.zh", "--json",
                    "--metrics", "bleu,chrf")
    assert result.exit_code == 0, result.output
    scores = {s["metric"]: s for s in json.loads(result.stdout)}
    assert "tok:zh" in scores["bleu"]["signature"] and set(scores) == {"bleu", "chrf"}


def test_plot_draws_chinese_words(runs, tmp_path):
    made, _ = runs
    result = invoke("plot", made["en_zh"], "tuesday , march 14th , 2019", "--out", tmp_path / "maps",
                    "--words")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "maps" / "0001_cross_layer1.png").stat().st_size > 0
    back = invoke("plot", made["zh_en"], "2019年3月14日，星期二", "--out", tmp_path / "back", "--words",
                  "--self")
    assert back.exit_code == 0, back.output
    assert len(list((tmp_path / "back").glob("0001_*.png"))) == 3


def test_align_pre_segmented_chinese_against_gold(runs, tmp_path):
    made, files = runs
    result = invoke("align", made["en_zh"], "--src", files / "test.en", "--tgt", files / "test.seg.zh",
                    "--gold", files / "test.align", "--json", "--output", tmp_path / "out.align")
    assert result.exit_code == 0, result.output
    score = json.loads(result.stdout)
    assert 0 <= score["aer"] <= 1 and score["sentences"] == 30
    targets = [line.split() for line in lines(files / "test.seg.zh")]
    for links, words in zip(lines(tmp_path / "out.align"), targets):
        # counted in segmented words
        assert all(int(link.split("-")[1]) < len(words) for link in links.split())
    # Unsegmented Chinese is aligned by characters.
    own = invoke("align", made["zh_en"], "--src", files / "test.zh", "--output", tmp_path / "chars.align")
    assert own.exit_code == 0, own.output
    sources = lines(files / "test.zh")
    for links, source in zip(lines(tmp_path / "chars.align"), sources):
        assert all(int(link.split("-")[0]) < len(source) for link in links.split())


# ---------------------------------------------------------------------------------------- refused


def refused(tmp_path: Path, config: Path, *extra: str) -> str:
    before = hash_tree(tmp_path)
    result = invoke("train", config, "--run-dir", tmp_path / "run", *extra)
    assert result.exit_code == 2, result.output
    assert hash_tree(tmp_path) == before and not (tmp_path / "run").exists()
    return assert_one_error_line(result.stderr)


def test_a_japanese_target_without_mecab_is_refused_before_training(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "MeCab" else real(name, *a))
    toy = {"format": "toy"}
    config = write_config(tmp_path / "ja.yaml", {"src_lang": "en", "tgt_lang": "ja",
                                                 "train": {**toy, "split": "train", "size": 50},
                                                 "dev": {**toy, "split": "dev", "size": 5}})
    line = refused(tmp_path, config)
    assert "data.tgt_lang: 'ja'" in line and "MeCab" in line and "pip install 'sacrebleu[ja]'" in line


def test_shared_embeddings_over_separate_vocabularies_are_refused(tmp_path):
    toy = {"format": "toy", "lang": "zh"}
    data = {"src_lang": "en", "tgt_lang": "zh", "train": {**toy, "split": "train", "size": 50}}
    config = write_config(tmp_path / "sep.yaml", data, tokenizer={"joint": False},
                          model={"share_embeddings": True})
    line = refused(tmp_path, config)
    assert "model.share_embeddings: true needs tokenizer.joint: true" in line
    plain = write_config(tmp_path / "plain.yaml", data, tokenizer={"joint": False})
    line = refused(tmp_path, plain, "--set", "model.share_embeddings=true")
    assert line.startswith("error: --set model.share_embeddings: true needs tokenizer.joint: true")
