"""The ``attnmt`` command as a user runs it: ``prepare`` on the toy task, the exit-code contract, quiet
imports."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest
from helpers import (
    OFFLINE_ENV,
    REPO,
    TOY_CONFIG,
    TOY_SET,
    TOY_SIZES,
    TOY_VOCAB,
    assert_one_error_line,
    hash_tree,
    run_attnmt,
)
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import load_config

COMMANDS = ["prepare", "train", "translate", "eval", "score", "plot", "align", "average", "info"]
def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# ----------------------------------------------------------------------------------------- prepare


def test_prepare_writes_a_complete_run_folder(toy_run):
    from attnmt.data.encoded import open_split
    from attnmt.data.tokenizer import load_tokenizer

    run_dir, result = toy_run
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert (run_dir / "config.yaml").is_file()
    assert {p.name for p in (run_dir / "tokenizer").iterdir()} == {"spm.model", "tokenizer.json"}
    assert {p.name for p in (run_dir / "data").iterdir()} == {"train", "dev", "test", "stats.json"}
    # no leftover tmp folders
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == [".lock"]

    tokenizer = load_tokenizer(run_dir / "tokenizer")
    assert tokenizer.joint and tokenizer.src_vocab_size == TOY_VOCAB
    for split, rows in TOY_SIZES.items():
        data = open_split(run_dir / "data" / split, split)
        assert len(data) == len(data.gold) == rows and data.lines.tolist() == list(range(1, rows + 1))
        assert data.src_ids[:5] == tokenizer.encode_src(data.src_text[:5])
        assert data.tgt_ids[:5] == tokenizer.encode_tgt(data.tgt_text[:5])


def test_prepare_prints_statistics(toy_run):
    _, result = toy_run
    out = result.stdout
    for word in ("train", "dev", "test", "pairs read", "pairs kept", "unknown-piece rate"):
        assert word in out
    assert f"{TOY_SIZES['train']}" in out
    assert (f"tokenizer: joint, {TOY_VOCAB} pieces, trained on 1,000 of 1,000 sentences "
            "(tokenizer.sample_size 1,000,000)") in out


def test_resolved_config_is_written(toy_run):
    run_dir, _ = toy_run
    written = load_config(run_dir / "config.yaml")
    expected = load_config(TOY_CONFIG, [s for s in TOY_SET if s != "--set"])
    assert written.train.run_dir == run_dir.resolve()
    expected.train.run_dir = written.train.run_dir
    assert written.to_dict() == expected.to_dict()


def test_second_prepare_reuses_the_tokenizer(toy_run_copy):
    model = (toy_run_copy / "tokenizer" / "spm.model").read_bytes()
    result = invoke("prepare", TOY_CONFIG, "--run-dir", toy_run_copy, *TOY_SET)
    assert result.exit_code == 0, result.output
    assert f"tokenizer: joint, {TOY_VOCAB} pieces, loaded" in result.stdout
    assert (toy_run_copy / "tokenizer" / "spm.model").read_bytes() == model


def test_changed_tokenizer_settings_are_refused_and_change_nothing(toy_run_copy):
    before = hash_tree(toy_run_copy)
    result = invoke("prepare", TOY_CONFIG, "--run-dir", toy_run_copy, *TOY_SET,
                    "--set", "tokenizer.vocab_size=120")
    assert result.exit_code == 2
    line = assert_one_error_line(result.stderr)
    assert f"vocab_size: {TOY_VOCAB} -> 120" in line and "another --run-dir" in line
    assert hash_tree(toy_run_copy) == before


def test_prepare_as_a_subprocess(tmp_path):
    from attnmt.data.encoded import open_split

    result = run_attnmt("prepare", TOY_CONFIG, "--run-dir", "run", *TOY_SET, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    run_dir = tmp_path / "run"  # a relative --run-dir is relative to the working folder
    assert (run_dir / "config.yaml").is_file() and (run_dir / "tokenizer" / "spm.model").is_file()
    for split, rows in TOY_SIZES.items():
        assert split in result.stdout
        assert len(open_split(run_dir / "data" / split, split)) == rows


def test_prepare_with_sockets_blocked(no_network, tmp_path):
    import socket

    with pytest.raises(RuntimeError, match="network access attempted"):
        socket.create_connection(("huggingface.co", 443))
    result = invoke(
        "prepare", TOY_CONFIG, "--run-dir", tmp_path / "run",
        "--set", "data.train.size=100", "--set", "data.dev.size=10", "--set", "data.test.size=10",
        "--set", "tokenizer.vocab_size=60",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "data" / "test").is_dir()


# ---------------------------------------------------------------------------------- failure contract

BAD_CONFIGS = {
    "unknown-key": ("data:\n  train: {format: toy, split: train, size: 5}\n"
                    "model:\n  arch: lstm\n  hiden_size: 3\n", 2,
                    "cfg.yaml:5: model.hiden_size: unknown key (did you mean hidden_size?)"),
    "malformed": ("data: [1, 2\nmodel: {}\n", 2, "cfg.yaml:2:6: YAML syntax error"),
    "empty": ("", 2, "config is empty"),
    "missing-data": ("data:\n  train: {src: data/missing.de, tgt: data/missing.en}\nmodel: {arch: lstm}\n", 3,
                     "/data/missing.de: file not found"),
}


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_bad_config_exits_with_one_error_line(tmp_path, name):
    text, code, fragment = BAD_CONFIGS[name]
    (tmp_path / "cfg.yaml").write_text(text)
    result = invoke("prepare", tmp_path / "cfg.yaml", "--run-dir", tmp_path / "run")
    assert result.exit_code == code
    assert fragment in assert_one_error_line(result.stderr)
    assert result.stdout == ""


def test_missing_data_names_the_resolved_path(tmp_path, monkeypatch):
    text, _, _ = BAD_CONFIGS["missing-data"]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "cfg.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    result = invoke("prepare", "configs/cfg.yaml", "--run-dir", "run")
    assert result.exit_code == 3
    line = assert_one_error_line(result.stderr)
    assert f"{(tmp_path / 'configs' / 'data' / 'missing.de').resolve()}: file not found" in line


@pytest.mark.parametrize(
    "args, code, fragment",
    [
        (["--set", "train.lr=abc"], 2, "error: --set train.lr: expected a number, got string 'abc'"),
        (["--set", "train.lerning_rate=1"], 2, "error: --set train.lerning_rate: unknown key"),
        (["--set", "tokenizer.vocab_size=3"], 2, "error: --set tokenizer.vocab_size: must be >= 8, got 3"),
    ],
)
def test_bad_set_exits_2(tmp_path, args, code, fragment):
    result = invoke("prepare", TOY_CONFIG, "--run-dir", tmp_path / "run", *args)
    assert result.exit_code == code
    assert assert_one_error_line(result.stderr).startswith(fragment)
    assert not (tmp_path / "run").exists()


def test_missing_config_file(tmp_path):
    result = invoke("prepare", tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert assert_one_error_line(result.stderr) == f"error: {tmp_path / 'nope.yaml'}: config file not found"


def test_bad_config_in_a_subprocess(tmp_path):
    (tmp_path / "cfg.yaml").write_text("data:\n\tsrc_lang: en\n")
    result = run_attnmt("prepare", tmp_path / "cfg.yaml", "--run-dir", tmp_path / "run")
    assert result.returncode == 2
    assert assert_one_error_line(result.stderr) == (
        f"error: {tmp_path / 'cfg.yaml'}:2:1: YAML syntax error: "
        "found character '\\t' that cannot start any token"
    )
    assert not (tmp_path / "run").exists()


def test_locked_run_folder_exits_5(toy_run_copy):
    before = hash_tree(toy_run_copy)
    fd = os.open(toy_run_copy / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run_attnmt("prepare", TOY_CONFIG, "--run-dir", toy_run_copy, *TOY_SET)
    finally:
        os.close(fd)
    assert result.returncode == 5
    assert "in use by another attnmt process (locked)" in assert_one_error_line(result.stderr)
    assert hash_tree(toy_run_copy) == before


# --------------------------------------------------------------------------------------- commands


def test_help_lists_every_command():
    result = invoke("--help")
    assert result.exit_code == 0
    listed = {line.split()[1] for line in result.stdout.splitlines()
              if line.startswith("│ ") and len(line.split()) > 2}
    assert set(COMMANDS) <= listed


def test_version():
    from attnmt import __version__

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"attnmt {__version__}"


def test_unknown_command_is_a_usage_error():
    result = invoke("prepair")
    assert result.exit_code == 2 and "Traceback" not in result.output


# ------------------------------------------------------------------------------------ quiet imports

IMPORT_CHECK = """
import sys
heavy = ("torch", "datasets", "sentencepiece", "huggingface_hub", "matplotlib")
import attnmt
after_import = [m for m in heavy if m in sys.modules]
from attnmt.cli import app
try:
    app(["--help"], prog_name="attnmt")
except SystemExit as e:
    assert e.code == 0, e.code
print("loaded:", after_import, [m for m in heavy if m in sys.modules])
"""


def test_import_and_help_load_no_heavy_library():
    env = {**os.environ, **OFFLINE_ENV}
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "prepare" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "loaded: [] []"


def test_the_progress_bar_shows_on_a_terminal_only():
    import io

    from attnmt.cli.common import FileProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    shown = Terminal()
    with FileProgress(2000, "translating", stream=shown) as progress:
        progress.advance(1000)
        progress.advance(1000)
    assert "translating" in shown.getvalue() and "sent/s" in shown.getvalue()
    piped = io.StringIO()  # not a terminal: nothing at all
    with FileProgress(2000, "translating", stream=piped) as progress:
        progress.advance(2000)
    assert piped.getvalue() == ""
    stdin = Terminal()  # a terminal, but the input is no file (stdin streams): nothing
    with FileProgress(0, "translating", show=False, stream=stdin) as progress:
        progress.advance(5)
    assert stdin.getvalue() == ""
