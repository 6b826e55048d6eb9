"""The config loader: every mistake stops at load time with ``file:line: dotted.key: what is wrong``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from helpers import REPO

from attnmt.config.schema import Config, config_from_dict, load_config
from attnmt.errors import ConfigError

BASE = """\
data:
  src_lang: en
  tgt_lang: de
  train:
    format: toy
    split: train
    size: 10
model:
  arch: {arch}
tokenizer:
  vocab_size: 100
train:
  lr: 0.001
decode:
  beam_size: 4
"""


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def with_line(section: str, line: str, arch: str = "transformer") -> str:
    """BASE with ``line`` (``key: value``) set in ``section``: replacing the key's line, or added first."""
    text = BASE.format(arch=arch)
    indent = "    " if section == "data.train" else "  "
    key = line.split(":")[0]
    lines = text.splitlines()
    header = lines.index("  train:" if section == "data.train" else f"{section}:")
    end = next((i for i in range(header + 1, len(lines)) if not lines[i].startswith(indent)), len(lines))
    for i in range(header + 1, end):
        if lines[i].startswith(f"{indent}{key}:"):
            lines[i] = indent + line
            break
    else:
        lines.insert(header + 1, indent + line)
    return "\n".join(lines) + "\n"


def error_of(tmp_path: Path, text: str, overrides: list[str] | tuple[str, ...] = ()) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def load_text(tmp_path: Path, text: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    return load_config(write(tmp_path, text), overrides)


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if fragment in line)


def test_base_config_loads(tmp_path):
    cfg = load_text(tmp_path, BASE.format(arch="transformer"))
    assert cfg.data.train.size == 10
    assert cfg.model.arch == "transformer"
    assert cfg.train.lr == 0.001


# ------------------------------------------------------------------------------------ unknown keys


@pytest.mark.parametrize(
    "section, bad_line, arch, dotted, suggestion",
    [
        ("data", "src_lng: en", "transformer", "data.src_lng", "src_lang"),
        ("data.train", "sed: 3", "transformer", "data.train.sed", "seed"),
        ("tokenizer", "vocab_sise: 100", "transformer", "tokenizer.vocab_sise", "vocab_size"),
        ("model", "n_head: 4", "transformer", "model.n_head", "n_heads"),
        ("model", "hiden_size: 64", "lstm", "model.hiden_size", "hidden_size"),
        ("train", "max_token: 100", "transformer", "train.max_token", "max_tokens"),
        ("decode", "beam_sise: 3", "transformer", "decode.beam_sise", "beam_size"),
    ],
    ids=["data", "data.train", "tokenizer", "model-transformer", "model-lstm", "train", "decode"],
)
def test_unknown_key_names_file_line_key_and_suggests(tmp_path, section, bad_line, arch, dotted, suggestion):
    text = with_line(section, bad_line, arch)
    message = error_of(tmp_path, text)
    line = line_of(text, bad_line)
    assert message == f"{tmp_path / 'cfg.yaml'}:{line}: {dotted}: unknown key (did you mean {suggestion}?)"


def test_unknown_top_level_section_suggests(tmp_path):
    text = BASE.format(arch="transformer").replace("decode:", "decod:")
    message = error_of(tmp_path, text)
    assert f":{line_of(text, 'decod:')}: decod: unknown key (did you mean decode?)" in message


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path):
    message = error_of(tmp_path, with_line("decode", "zzz: 1"))
    assert "decode.zzz: unknown key (valid keys: beam_size, nbest," in message


def test_unknown_key_in_a_text_source(tmp_path):
    text = BASE.format(arch="transformer").replace(
        "    format: toy\n    split: train\n    size: 10\n", "    src: a.de\n    tgt: a.en\n    sorce: b.de\n"
    )
    assert "data.train.sorce: unknown key (did you mean src?)" in error_of(tmp_path, text)


def test_unknown_source_format(tmp_path):
    text = BASE.format(arch="transformer").replace("format: toy", "format: csv")
    message = error_of(tmp_path, text)
    assert "data.train" in message and "format must be one of text, tsv, jsonl, hf, toy" in message


def test_unknown_arch(tmp_path):
    message = error_of(tmp_path, BASE.format(arch="rnn"))
    assert f":{line_of(BASE, 'model:')}: model: 'rnn' is not one of" in message
    assert "'rnn'" in message and "lstm" in message and "transformer" in message


def test_missing_required_section(tmp_path):
    text = BASE.format(arch="transformer").replace("model:\n  arch: transformer\n", "")
    assert error_of(tmp_path, text).endswith("model: required key is missing")


# ----------------------------------------------------------------------------------- wrong types


@pytest.mark.parametrize(
    "section, bad_line, expected",
    [
        ("train", "max_steps: '10'", "train.max_steps: expected an integer, got string '10'"),
        ("train", "max_steps: 1.5", "train.max_steps: expected an integer, got number 1.5"),
        ("train", "max_steps: true", "train.max_steps: expected an integer, got boolean True"),
        ("train", "lr: '1e-3'", "train.lr: expected a number, got string '1e-3'"),
        ("data", "src_lang: true", "data.src_lang: expected a string, got boolean (quote it: 'true')"),
        ("data", "src_lang: 3", "data.src_lang: expected a string, got integer"),
        ("tokenizer", "joint: yes", "tokenizer.joint: expected true or false, got string 'yes'"),
        ("tokenizer", "model_type: wordpiece",
         "tokenizer.model_type: 'wordpiece' is not one of 'bpe' or 'unigram'"),
    ],
)
def test_wrong_type_names_line_key_and_types(tmp_path, section, bad_line, expected):
    text = with_line(section, bad_line)
    assert error_of(tmp_path, text) == f"{tmp_path / 'cfg.yaml'}:{line_of(text, bad_line)}: {expected}"


def test_section_that_is_not_a_mapping(tmp_path):
    text = BASE.format(arch="transformer").replace("decode:\n  beam_size: 4\n", "decode: 4\n")
    assert error_of(tmp_path, text).endswith("decode: expected a mapping, got integer")


# ---------------------------------------------------------------------------------- YAML 1.1 traps


def test_no_stays_the_string_no(tmp_path):
    cfg = load_text(tmp_path, BASE.format(arch="transformer").replace("src_lang: en", "src_lang: no"))
    assert cfg.data.src_lang == "no"


def test_exponent_without_dot_is_a_float(tmp_path):
    cfg = load_text(tmp_path, BASE.format(arch="transformer").replace("lr: 0.001", "lr: 1e-3"))
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 0.001


@pytest.mark.parametrize("value", ["010", "-012", "00"])
def test_leading_zero_integer_is_an_error(tmp_path, value):
    text = with_line("train", f"max_steps: {value}")
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'cfg.yaml'}:{line_of(text, 'max_steps')}:")
    assert "leading zeros are not allowed" in message


def test_leading_zero_is_an_error_for_a_float_field_too(tmp_path):
    # Read as 10.0 by a float resolver, 8 by YAML 1.1: neither is what was meant.
    assert "leading zeros are not allowed" in error_of(tmp_path, with_line("train", "min_lr: 010"))


def test_sexagesimal_stays_a_string(tmp_path):
    cfg = load_text(tmp_path, BASE.format(arch="transformer").replace("src_lang: en", "src_lang: 1:30"))
    assert cfg.data.src_lang == "1:30"


def test_hex_and_zero_are_still_integers(tmp_path):
    text = BASE.format(arch="transformer").replace(
        "lr: 0.001", "lr: 0.001\n  max_steps: 0x10\n  warmup_steps: 0"
    )
    cfg = load_text(tmp_path, text)
    assert cfg.train.max_steps == 16 and cfg.train.warmup_steps == 0


# ----------------------------------------------------------------------- duplicates, aliases, shape


def test_duplicate_key_in_a_section(tmp_path):
    text = BASE.format(arch="transformer").replace("  lr: 0.001\n", "  lr: 0.001\n  lr: 0.5\n")
    first, second = [i for i, line in enumerate(text.splitlines(), start=1) if line.strip().startswith("lr:")]
    message = error_of(tmp_path, text)
    assert re.match(rf"^{re.escape(str(tmp_path / 'cfg.yaml'))}:{second}:\d+: ", message), message
    assert f"duplicate key 'lr' (first defined on line {first})" in message


def test_duplicate_section(tmp_path):
    text = BASE.format(arch="transformer") + "model:\n  arch: lstm\n"
    message = error_of(tmp_path, text)
    assert f"duplicate key 'model' (first defined on line {line_of(text, 'model:')})" in message


def test_aliases_are_refused(tmp_path):
    text = BASE.format(arch="transformer").replace("data:\n", "data: &d\n") + "extra: *d\n"
    message = error_of(tmp_path, text)
    assert f"cfg.yaml:{len(text.splitlines())}:" in message
    assert "aliases are not allowed" in message


def test_alias_bomb_is_refused_before_expansion(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)]
    assert "aliases are not allowed" in error_of(tmp_path, "\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "config is empty"),
        ("# only a comment\n", "config is empty"),
        ("- data\n- model\n", "config must be a mapping, not a list"),
        ("just a string\n", "config must be a mapping, not a str"),
        ("42\n", "config must be a mapping, not a int"),
    ],
    ids=["empty", "comment-only", "list", "string", "number"],
)
def test_top_level_must_be_a_mapping(tmp_path, text, expected):
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'cfg.yaml'}: ") and expected in message


@pytest.mark.parametrize(
    "text, where",
    [
        ("data:\n\tsrc_lang: en\n", "2:1"),  # tab indentation
        ("data: [1, 2\nmodel: {}\n", "2:6"),  # unclosed [
        ("data:\n  a: 1\n b: 2\n", "3:2"),  # bad dedent
        ("data: 'unterminated\n", "2:1"),
    ],
    ids=["tab", "unclosed-bracket", "bad-indent", "unterminated-quote"],
)
def test_malformed_yaml_gives_file_line_column(tmp_path, text, where):
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'cfg.yaml'}:{where}: YAML syntax error: "), message


def test_invalid_utf8_config(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(b"data:\n  src_lang: \xff\n")
    with pytest.raises(ConfigError, match=r"cfg\.yaml: invalid UTF-8 at byte offset 18"):
        load_config(path)


def test_oversized_config_is_refused(tmp_path):
    text = BASE.format(arch="transformer") + "# " + "x" * (1 << 20) + "\n"
    assert "larger than 1048576 bytes" in error_of(tmp_path, text)


# ------------------------------------------------------------------------------------ value ranges


@pytest.mark.parametrize(
    "section, bad_line, arch, expected",
    [
        ("train", "lr: -1", "transformer", "train.lr: must be > 0.0, got -1"),
        ("train", "lr: 0", "transformer", "train.lr: must be > 0.0, got 0"),
        ("train", "lr: .nan", "transformer", "train.lr: must be a finite number"),
        ("train", "lr: .inf", "transformer", "train.lr: must be a finite number"),
        ("train", "max_tokens: 0", "transformer", "train.max_tokens: must be > 0, got 0"),
        ("train", "keep_last: 1", "transformer", "train.keep_last: must be >= 2, got 1"),
        ("decode", "max_tokens: 0", "transformer", "decode.max_tokens: must be > 0, got 0"),
        ("data", "max_len: 0", "transformer", "data.max_len: must be > 0, got 0"),
        ("data", "max_ratio: 0.5", "transformer", "data.max_ratio: must be >= 1.0, got 0.5"),
        ("data.train", "size: 0", "transformer", "data.train.size: must be > 0, got 0"),
        ("model", "dropout: 1.0", "transformer", "model.dropout: must be < 1.0, got 1.0"),
        ("model", "dropout: -0.1", "lstm", "model.dropout: must be >= 0.0, got -0.1"),
        ("tokenizer", "vocab_size: 3", "transformer", "tokenizer.vocab_size: must be >= 8, got 3"),
        ("tokenizer", "character_coverage: 0", "transformer",
         "tokenizer.character_coverage: must be > 0.0, got 0"),
    ],
)
def test_out_of_range_values(tmp_path, section, bad_line, arch, expected):
    text = with_line(section, bad_line, arch)
    assert error_of(tmp_path, text) == f"{tmp_path / 'cfg.yaml'}:{line_of(text, bad_line)}: {expected}"


def test_beam_size_zero(tmp_path):
    text = BASE.format(arch="transformer").replace("beam_size: 4", "beam_size: 0")
    assert error_of(tmp_path, text).endswith(
        f":{line_of(text, 'beam_size')}: decode.beam_size: must be > 0, got 0"
    )


def test_d_model_not_divisible_by_n_heads(tmp_path):
    text = BASE.format(arch="transformer").replace(
        "  arch: transformer\n", "  arch: transformer\n  d_model: 30\n  n_heads: 4\n"
    )
    message = error_of(tmp_path, text)
    assert f":{line_of(text, 'model:')}: model: d_model (30) must be divisible by n_heads (4)" in message


def test_nbest_larger_than_beam(tmp_path):
    text = with_line("decode", "nbest: 5")
    assert error_of(tmp_path, text).endswith("decode: nbest (5) must not exceed beam_size (4)")


# ------------------------------------------------------------------------------------- --set


def test_set_overrides_are_applied_and_typed(tmp_path):
    cfg = load_text(
        tmp_path,
        BASE.format(arch="transformer"),
        ["train.lr=3e-4", "data.src_lang=no", "model.n_heads=8", "data.train.size=7", "decode.nbest=2",
         "train.compile=true"],
    )
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.data.src_lang == "no"
    assert cfg.model.n_heads == 8
    assert cfg.data.train.size == 7
    assert cfg.decode.nbest == 2
    assert cfg.train.compile is True


def test_set_can_create_a_missing_section(tmp_path):
    text = BASE.format(arch="transformer").replace("decode:\n  beam_size: 4\n", "")
    assert load_text(tmp_path, text, ["decode.beam_size=9"]).decode.beam_size == 9


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.lr=abc", "--set train.lr: expected a number, got string 'abc'"),
        ("train.max_steps=1.5", "--set train.max_steps: expected an integer, got number 1.5"),
        ("data.src_lang=true", "--set data.src_lang: expected a string, got boolean (quote it: 'true')"),
        ("train.lr=-1", "--set train.lr: must be > 0.0, got -1"),
        ("train.max_token=10", "--set train.max_token: unknown key (did you mean max_tokens?)"),
    ],
)
def test_set_errors_name_the_override(tmp_path, override, expected):
    assert error_of(tmp_path, BASE.format(arch="transformer"), [override]) == expected


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lr", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("train..lr=3", "expected KEY=VALUE"),
        ("data.src_lang.x=1", "--set data.src_lang.x: src_lang is not a section"),
        ("model.n_heads=010", "leading zeros are not allowed"),
    ],
)
def test_malformed_set(tmp_path, override, fragment):
    message = error_of(tmp_path, BASE.format(arch="transformer"), [override])
    assert message.startswith("--set ") and fragment in message


def test_set_does_not_touch_the_file(tmp_path):
    path = write(tmp_path, BASE.format(arch="transformer"))
    before = path.read_bytes()
    load_config(path, ["train.lr=3e-4"])
    assert path.read_bytes() == before


# ---------------------------------------------------------------------------------------- paths


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    text = BASE.format(arch="transformer").replace(
        "    format: toy\n    split: train\n    size: 10\n",
        "    src: data/train.de\n    tgt: ../shared/train.en\n"
    )
    text = text.replace("tokenizer:\n", "tokenizer:\n  src_model: spm/model.bin\n")
    text = text.replace(
        "model:\n",
        "  dev: {format: hf, name: json, data_files: [a.jsonl, /abs/b.jsonl], src_field: x, tgt_field: y}\n"
        "model:\n"
    )
    text = text.replace("train:\n  lr", "train:\n  run_dir: ../runs/x\n  lr")
    path = write(tmp_path, text, "configs/cfg.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("..") / "configs" / "cfg.yaml")
    folder = path.parent.resolve()
    assert cfg.data.train.src == folder / "data" / "train.de"
    assert cfg.data.train.tgt.resolve() == tmp_path.resolve() / "shared" / "train.en"
    assert cfg.tokenizer.src_model == folder / "spm" / "model.bin"
    assert cfg.data.dev.data_files == [folder / "a.jsonl", Path("/abs/b.jsonl")]
    assert cfg.train.run_dir.resolve() == tmp_path.resolve() / "runs" / "x"


def test_default_run_dir_is_named_after_the_config(tmp_path, monkeypatch):
    cfg_path = write(tmp_path, BASE.format(arch="transformer"), "sub/my_exp.yaml")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(cfg_path)
    assert cfg.train.run_dir.is_absolute()
    assert cfg.train.run_dir == tmp_path.resolve() / "runs" / "my_exp"  # in the working folder


def test_paths_given_with_set_resolve_against_the_working_folder(tmp_path, monkeypatch):
    text = "data:\n  train: {src: train.de, tgt: train.en}\nmodel: {arch: lstm}\n"
    cfg_path = write(tmp_path, text, "configs/cfg.yaml")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(cfg_path, ["data.train.src=mine/train.de"])
    assert cfg.data.train.src == tmp_path.resolve() / "mine" / "train.de"
    assert cfg.data.train.tgt.parent == cfg_path.parent.resolve()  # not overridden: the config's folder


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_config_path_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


# ------------------------------------------------------------------------------- shipped configs


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    # A fine-tuning config is named after the model it fine-tunes, and names it.
    assert cfg.model.arch in path.stem or (path.stem.startswith("finetune_") and cfg.train.init_from)
    assert cfg.train.run_dir.is_absolute()
    assert cfg.train.run_dir.resolve().parent == (REPO / "runs").resolve()
    for value in cfg.train.model_dump().values():
        if isinstance(value, float):
            assert math.isfinite(value)


def test_shipped_configs_exist():
    assert len(list((REPO / "configs").glob("*.yaml"))) >= 4


def test_dumped_config_round_trips(tmp_path):
    cfg = load_config(REPO / "configs" / "toy_lstm.yaml")
    again = config_from_dict(cfg.to_dict())
    assert again == cfg


# --------------------------------------------------------------------------- defaults that follow other keys


def test_sentencepiece_defaults_follow_the_languages(tmp_path):
    german = load_text(tmp_path, BASE.format(arch="transformer")).tokenizer
    assert german.character_coverage == 1.0 and german.byte_fallback is False
    assert german.normalization == "nmt_nfkc"
    for code in ("zh", "zh-Hant", "cmn", "ja", "ko"):
        text = BASE.format(arch="transformer").replace("tgt_lang: de", f"tgt_lang: {code}")
        chinese = load_text(tmp_path, text).tokenizer
        assert chinese.character_coverage == 0.9995 and chinese.byte_fallback is True, code
        assert chinese.normalization == "identity", code  # keeps ？，！ (NFKC would fold them)
    given = load_text(tmp_path, with_line("tokenizer", "character_coverage: 0.98\n  normalization: nfkc")
                      .replace("tgt_lang: de", "tgt_lang: zh"))
    assert given.tokenizer.character_coverage == 0.98 and given.tokenizer.normalization == "nfkc"


def test_shared_embeddings_follow_the_tokenizer_when_not_given(tmp_path):
    separate = load_text(tmp_path, with_line("tokenizer", "joint: false"))
    assert separate.model.share_embeddings is False
    assert load_text(tmp_path, BASE.format(arch="transformer")).model.share_embeddings is True
    explicit_off = load_text(tmp_path, with_line("model", "share_embeddings: false"))
    assert explicit_off.model.share_embeddings is False


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_shared_embeddings_over_separate_vocabularies_are_refused_naming_both_keys(tmp_path, arch):
    text = with_line("tokenizer", "joint: false", arch)
    text = text.replace(f"  arch: {arch}\n", f"  arch: {arch}\n  share_embeddings: true\n")
    message = error_of(tmp_path, text)
    line = line_of(text, "share_embeddings")
    assert message.startswith(f"{tmp_path / 'cfg.yaml'}:{line}: model.share_embeddings: true needs "
                              "tokenizer.joint: true"), message
