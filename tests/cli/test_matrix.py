"""The error contract of docs/RELIABILITY.md as a user meets it: bad configs, data, checkpoints, resources and
arguments, each case through the command line, where the other test files do not already cover it.

Each case runs ``attnmt`` (in-process with CliRunner; a subprocess for an address-space limit and for the
``--debug`` traceback) and asserts the exit code, exactly one ``error:`` line on stderr, and that every file
that existed before the command is unchanged. Then the trust checks: no network from import to plot,
and a sentencepiece model that does not match its recorded sha256 never reaches the sentencepiece loader.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    OFFLINE_ENV,
    REPO,
    TINY_MODELS,
    TINY_TRAIN,
    assert_one_error_line,
    expect_error,
    hash_tree,
    train_env,
)
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.data.toy import toy_pairs
from attnmt.models.checkpoint import (
    FORMAT,
    bytes_tensor,
    load_checkpoint,
    read_pointer,
    sha256_file,
    step_file,
)
from attnmt.runfiles import RunDir

SOURCES = ["monday , 3 june 2001", "saturday the 4th of april 2004 at 3:15 pm"]


pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py


def invoke(*args, input: str | bytes | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def assert_kept(before: dict[str, str], root: Path) -> None:
    """Every file that existed before is still there, byte for byte, and no temporary file was left."""
    after = hash_tree(root)
    assert {name: after.get(name) for name in before} == before
    assert not [name for name in after if ".tmp" in name], after


def write_config(path: Path, train_source: dict, dev: dict | None = None, **sections: dict) -> Path:
    """The tiny config of conftest with another training (and dev) source; ``sections`` update its
    sections."""
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de", "train": train_source, **({"dev": dev} if dev else {})},
        "tokenizer": {"vocab_size": 64, "hard_vocab_limit": False},
        "model": dict(TINY_MODELS["transformer"]),
        "train": dict(TINY_TRAIN),
        "decode": {"max_len_b": 5},
    }
    for name, values in sections.items():
        config[name].update(values)
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def write_pair(folder: Path, src: bytes | str, tgt: bytes | str) -> dict:
    """train.en / train.de with the given contents, as a text source."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (("train.en", src), ("train.de", tgt)):
        (folder / name).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return {"src": str(folder / "train.en"), "tgt": str(folder / "train.de")}


def toy_text(n: int) -> tuple[list[str], list[str]]:
    pairs = toy_pairs("train", n)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def lines(items) -> str:
    return "".join(f"{item}\n" for item in items)


# ------------------------------------------------------------------------------------ bad configs

BASE = """\
data:
  src_lang: en
  tgt_lang: de
  train:
    format: toy
    split: train
    size: 50
tokenizer:
  vocab_size: 60
model:
  arch: transformer
  d_model: 16
  n_heads: 2
train:
  lr: 0.01
  max_steps: 10
decode:
  beam_size: 2
  max_len_b: 5
"""


def edited(key: str, value: str | None) -> str:
    """BASE with ``section.key: value`` set (replacing its line, or added first in the section); value None
    removes the key's line."""
    section, name = key.rsplit(".", 1)
    indent = "    " if section == "data.train" else "  "
    rows = BASE.splitlines()
    header = rows.index("  train:" if section == "data.train" else f"{section}:")
    end = next((i for i in range(header + 1, len(rows)) if not rows[i].startswith(indent)), len(rows))
    for i in range(header + 1, end):
        if rows[i].startswith(f"{indent}{name}:"):
            rows[i : i + 1] = [] if value is None else [f"{indent}{name}: {value}"]
            break
    else:
        rows.insert(header + 1, f"{indent}{name}: {value}")
    return "\n".join(rows) + "\n"


BAD_CONFIGS = {
    # YAML syntax
    "tab-indent": ("data:\n\tsrc_lang: en\n", "cfg.yaml:2:1: YAML syntax error"),
    "unclosed-bracket": ("data: [1, 2\nmodel: {}\n", "cfg.yaml:2:6: YAML syntax error"),
    # not a mapping
    "empty": ("", "config is empty"),
    "list": ("- data\n- model\n", "config must be a mapping, not a list"),
    "scalar": ("42\n", "config must be a mapping, not a int"),
    # unknown keys, in every section
    "data": (edited("data.srclang", "en"), "data.srclang: unknown key (did you mean src_lang?)"),
    "source": (edited("data.train.sise", "5"), "data.train.sise: unknown key (did you mean size?)"),
    "tokenizer": (edited("tokenizer.vocab_sise", "60"),
                  "tokenizer.vocab_sise: unknown key (did you mean vocab_size?)"),
    "model": (edited("model.n_head", "2"), "model.n_head: unknown key (did you mean n_heads?)"),
    "train": (edited("train.lerning_rate", "1"), "train.lerning_rate: unknown key"),
    "decode": (edited("decode.beam", "2"), "decode.beam: unknown key (did you mean beam_size?)"),
    # duplicate keys
    "duplicate": (BASE.replace("  lr: 0.01\n", "  lr: 0.01\n  lr: 0.5\n"),
                  "cfg.yaml:16:3: YAML error: duplicate key 'lr' (first defined on line 15)"),
    # YAML 1.1 traps that are still errors (see test_yaml_1_1_traps_read_as_yaml_1_2)
    "bool-for-string": (edited("data.src_lang", "true"),
                        "data.src_lang: expected a string, got boolean (quote it: 'true')"),
    "leading-zero": (edited("train.max_steps", "010"), "'010': leading zeros are not allowed"),
    # wrong types and ranges
    "lr-negative": (edited("train.lr", "-1"), "train.lr: must be > 0.0, got -1"),
    "lr-nan": (edited("train.lr", ".nan"), "train.lr: must be a finite number"),
    "beam-0": (edited("decode.beam_size", "0"), "decode.beam_size: must be > 0, got 0"),
    "data-max-len-0": (edited("data.max_len", "0"), "data.max_len: must be > 0, got 0"),
    "batch-tokens-0": (edited("train.max_tokens", "0"), "train.max_tokens: must be > 0, got 0"),
    "dropout-1": (edited("model.dropout", "1.0"), "model.dropout: must be < 1.0, got 1.0"),
    "vocab-3": (edited("tokenizer.vocab_size", "3"), "tokenizer.vocab_size: must be >= 8, got 3"),
    # aliases and size
    "alias": (BASE.replace("data:\n", "data: &d\n") + "extra: *d\n", "aliases are not allowed"),
    "over-1-MiB": (BASE + "# " + "x" * (1 << 20) + "\n", "larger than 1048576 bytes"),
    # output length limits (there is no --max-len flag; decode.max_len_b is the limit)
    "max-len-0": (edited("decode.max_len_b", "0"), "decode.max_len_b: must be >= 1, got 0"),
    "max-len-negative": (edited("decode.max_len_b", "-3"), "decode.max_len_b: must be >= 1, got -3"),
    "max-len-a-negative": (edited("decode.max_len_a", "-1.0"), "decode.max_len_a: must be >= 0.0, got -1.0"),
}


@pytest.mark.parametrize("command", ["prepare", "train"])
@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_bad_config_exits_2(tmp_path, case, command):
    config = tmp_path / "cfg.yaml"
    config.write_text(BAD_CONFIGS[case][0], encoding="utf-8")
    before = hash_tree(tmp_path)
    result = invoke(command, config, "--run-dir", tmp_path / "run")
    expect_error(result, 2, BAD_CONFIGS[case][1])
    assert result.stdout == ""
    assert_kept(before, tmp_path)
    assert not (tmp_path / "run").exists()  # stopped before the run folder was made


def test_yaml_1_1_traps_read_as_yaml_1_2(tmp_path):
    """Row 5, handled otherwise: ``no`` is the string "no" and ``1e-3`` a float (YAML 1.2), so the config
    means what it says instead of failing; only real booleans and leading zeros are errors (above)."""
    text = edited("data.src_lang", "no").replace("  lr: 0.01", "  lr: 1e-3")
    config = tmp_path / "cfg.yaml"
    config.write_text(text, encoding="utf-8")
    result = invoke("prepare", config, "--run-dir", tmp_path / "run",
                    "--set", "tokenizer.hard_vocab_limit=false")
    assert result.exit_code == 0, result.output
    from attnmt.config.schema import load_config

    resolved = load_config(tmp_path / "run" / "config.yaml")
    assert resolved.data.src_lang == "no" and resolved.train.lr == 0.001


# --------------------------------------------------------------------------------- bad input data

# (train.en, train.de, exit code, fragments); "DIR" makes train.en a folder, None leaves it out.
BAD_DATA = {
    "missing-file": (None, "a\n", 3, ["/data/train.en: file not found"]),
    "directory": ("DIR", "a\n", 3, ["/data/train.en: is a directory, not a file"]),
    "line-counts": ("a\nb\nc\n", "a\nb\n", 3, ["train.en has 3 lines", "train.de has 2"]),
    "too-many-empty": ("a\n\n\n\n", "a\nb\nc\n\n", 3,
                       ["cleaning dropped 75% of 4 pairs", "data.max_dropped_fraction = 0.5"]),
    "invalid-utf8": (b"gut\nab\xff\xfe\n", b"good\nab\n", 3,
                     ["/data/train.en:2: invalid UTF-8 at byte offset 2"]),
    "empty-files": ("", "", 3, ["train: the corpus is empty"]),
    "nothing-left": ("\n \n\x00\n", "a\n\n\n", 3,
                     ["no training pairs left after cleaning (1 empty source, 2 empty)"]),
    "vocab-too-large": (lines(f"ein satz {i}" for i in range(10)),
                        lines(f"a sentence {i}" for i in range(10)), 3,
                        ["vocab_size 1000 is too large for this corpus", "Please set it to a value <=",
                         "hard_vocab_limit: false"]),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_training_data_exits_3(tmp_path, case):
    src, tgt, code, fragments = BAD_DATA[case]
    source = write_pair(tmp_path / "data", "" if src in (None, "DIR") else src, tgt)
    if src in (None, "DIR"):
        (tmp_path / "data" / "train.en").unlink()
    if src == "DIR":
        (tmp_path / "data" / "train.en").mkdir()
    # Relative paths: the error must show them resolved against the config's folder.
    source = {side: os.path.relpath(path, tmp_path) for side, path in source.items()}
    config = write_config(tmp_path / "cfg.yaml", source,
                          tokenizer={"vocab_size": 1000, "hard_vocab_limit": True})
    before = hash_tree(tmp_path)
    result = invoke("prepare", config, "--run-dir", tmp_path / "run")
    line = expect_error(result, code, *fragments)
    assert (str((tmp_path / "data").resolve()) in line
            or case in ("too-many-empty", "empty-files", "nothing-left", "vocab-too-large"))
    assert_kept(before, tmp_path)
    # the marker, and no tokenizer trained on data that was refused
    assert sorted(os.listdir(tmp_path / "run")) == [".lock", "attnmt-run.json"]


def test_a_megabyte_training_line_is_dropped_and_counted(tmp_path):
    src, tgt = toy_text(60)
    source = write_pair(tmp_path / "data", lines(src + [("monday , 3 june 2001 " * 50_000)[:1_000_000]]),
                        lines(tgt + ["montag"]))
    result = invoke("prepare", write_config(tmp_path / "cfg.yaml", source), "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert "dropped: longer than 128 pieces" in result.stdout
    [train] = json.loads((tmp_path / "run" / "data" / "stats.json").read_text())
    assert (train["read"], train["kept"], train["dropped"]) == (61, 60, {"longer than 128 pieces": 1})


def test_any_script_and_control_characters_stay_aligned_and_unknowns_are_reported(tmp_path):
    """Training pairs with NUL, ESC colour codes and other control characters are cleaned by the documented
    rule (``data.clean``) and stay aligned; a dev file in scripts the tokenizer never saw has its
    unknown-piece rate reported."""
    from attnmt.data.encoded import open_split

    src, tgt = toy_text(60)
    # the third is empty once cleaned
    src[:3] = ["\x00" + src[0], f"\x1b[31m{src[1]}\x1b[0m", "\x1b[31m\x00\x07"]
    tgt[2] = "nothing"
    source = write_pair(tmp_path / "data", lines(src), lines(tgt))
    mixed = ["Привет, мир! 你好世界 🎉👩‍👩‍👧", "\x00nul and \x1b[31mred\x1b[0m", "e\u0301 \u200b zero width"]
    dev = tmp_path / "data" / "dev"
    (dev.with_suffix(".en")).write_text(lines(mixed), encoding="utf-8")
    (dev.with_suffix(".de")).write_text(lines(["x", "y", "z"]), encoding="utf-8")
    config = write_config(tmp_path / "cfg.yaml", source,
                          dev={"src": str(dev.with_suffix(".en")), "tgt": str(dev.with_suffix(".de"))})
    result = invoke("prepare", config, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "unknown-piece rate" in result.stdout
    train_stats, dev_stats = json.loads((tmp_path / "run" / "data" / "stats.json").read_text())
    assert train_stats["dropped"] == {"empty source": 1} and train_stats["kept"] == 59
    assert dev_stats["kept"] == 3 and dev_stats["src_unk_rate"] > 0
    data = open_split(tmp_path / "run" / "data" / "train", "train")
    pairs = dict(zip(data.src_text, data.tgt_text))
    assert pairs[src[0][1:]] == tgt[0] and pairs[src[1][5:-4]] == tgt[1]
    assert all(pairs[s] == t for s, t in zip(src[3:], tgt[3:]))


def test_a_prepare_that_stopped_halfway_is_redone_by_train(tmp_path):
    """A dev file with nothing left after cleaning stops prepare after the tokenizer was written, before any
    split is (they are all read first) and before config.yaml (written last). Once the file is fixed, train
    prepares again."""
    dev = {"src": str(tmp_path / "dev.en"), "tgt": str(tmp_path / "dev.de")}
    (tmp_path / "dev.en").write_text("\x00\n\x1b[31m\n", encoding="utf-8")
    (tmp_path / "dev.de").write_text("a\nb\n", encoding="utf-8")
    config = write_config(tmp_path / "cfg.yaml", {"format": "toy", "split": "train", "size": 200}, dev=dev,
                          train={"max_steps": 1})
    expect_error(invoke("prepare", config, "--run-dir", tmp_path / "run"), 3,
                 "dev: no pairs left after cleaning (2 empty source)")
    assert not (tmp_path / "run" / "data" / "train").exists()
    assert not (tmp_path / "run" / "config.yaml").exists()
    (tmp_path / "dev.en").write_text(lines(SOURCES), encoding="utf-8")
    result = invoke("train", config, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "preparing data" in result.stdout and (tmp_path / "run" / "config.yaml").is_file()


def test_zero_steps_per_epoch_exits_3(tmp_path):
    """Three sentences cannot fill 4 accumulation slots (the same rule as ranks x accumulation under
    torchrun): an epoch would have no step and the loop would never end."""
    config = write_config(tmp_path / "cfg.yaml", {"format": "toy", "split": "train", "size": 3},
                          train={"accum_steps": 4})
    before = hash_tree(tmp_path)
    result = invoke("train", config, "--run-dir", tmp_path / "run")
    expect_error(result, 3, "epoch has 0 steps: 3 examples cannot fill 1 rank(s) x 4 accumulation step(s)")
    assert_kept(before, tmp_path)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_three_sentences_on_two_slots_still_train():
    """With enough examples the batches are split until every slot has one, so no step is empty."""
    from attnmt.data.batching import TokenBatchSampler

    sampler = TokenBatchSampler([5, 6, 7], max_tokens=10_000, multiple_of=2)
    assert [len(b) for b in sampler.batches(0)] in ([1, 2], [2, 1])


@contextlib.contextmanager
def sockets_blocked():
    """Every way to open a connection or resolve a name raises; the attempts are also recorded, in case a
    library swallows the exception."""
    attempts: list[tuple] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise RuntimeError(f"network access attempted: {args[1:]}")

    with pytest.MonkeyPatch.context() as patch:
        for owner, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"),
                            (socket, "create_connection"), (socket, "getaddrinfo")):
            patch.setattr(owner, name, refuse)
        yield attempts


HF_CASES = {
    "unknown-split": ({"split": "validation"}, "Unknown split \"validation\". Should be one of ['train']"),
    "missing-field": ({"src_field": "source"}, "has no field 'source' (fields: translation)"),
    "missing-language-key": ({"src_field": "translation.fr"},
                             "no field 'translation.fr' (keys here: de, en)"),
    "unknown-name-offline": ({"name": "nobody/no-such-dataset", "data_files": None},
                             "cannot load Hugging Face dataset 'nobody/no-such-dataset' (offline"),
    "loading-script": ({"name": "SCRIPT", "data_files": None}, "Dataset scripts are no longer supported"),
}  # fmt: skip


@pytest.mark.parametrize("case", HF_CASES)
def test_hugging_face_source_errors_exit_3_offline(tmp_path, case):
    change, fragment = HF_CASES[case]
    records = tmp_path / "train.jsonl"
    records.write_text(json.dumps({"translation": {"de": "ein hund", "en": "a dog"}}) + "\n",
                       encoding="utf-8")
    script = tmp_path / "scripted" / "scripted.py"  # a dataset loading script: must never run
    script.parent.mkdir()
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n", encoding="utf-8")
    train = {"format": "hf", "name": "json", "data_files": str(records), "src_field": "translation.de",
             "tgt_field": "translation.en"}
    train.update(change)
    train["name"] = str(script.parent) if train["name"] == "SCRIPT" else train["name"]
    config = write_config(tmp_path / "cfg.yaml", {k: v for k, v in train.items() if v is not None})
    before = hash_tree(tmp_path)
    with sockets_blocked() as attempts:
        result = invoke("prepare", config, "--run-dir", tmp_path / "run")
    expect_error(result, 3, fragment)
    assert attempts == [] and not (tmp_path / "ran").exists()
    assert_kept(before, tmp_path)


# ------------------------------------------------------------ a trained run, with the network blocked

E2E_TRAIN = {"max_steps": 14}  # checkpoints at 7, 10 (validation) and 14


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """toy-data -> train (with its prepare) -> translate -> eval -> plot -> plot-curves, in one
    process with every socket call refused. The run folder is then the trained run of the cases below, which
    copy it."""
    root = tmp_path_factory.mktemp("e2e")
    config = write_config(root / "tiny.yaml", {"format": "toy", "split": "train", "size": 200},
                          dev={"format": "toy", "split": "dev", "size": 20}, train=E2E_TRAIN)  # fmt: skip
    run, toy = root / "run", root / "toy"
    steps = {}
    with sockets_blocked() as attempts:
        with pytest.raises(RuntimeError, match="network access attempted"):
            socket.create_connection(("huggingface.co", 443))
        attempts.clear()
        steps["toy-data"] = invoke("toy-data", toy, "--train-size", "1", "--dev-size", "3",
                                   "--test-size", "4")
        steps["train"] = invoke("train", config, "--run-dir", run)
        steps["translate"] = invoke("translate", run, "-i", toy / "test.en", "-o", root / "hyp.de")
        steps["eval-hyp"] = invoke("eval", "--hyp", root / "hyp.de", "--ref", toy / "test.de", "--json")
        steps["eval-model"] = invoke("eval", run, "--src", toy / "test.en", "--ref", toy / "test.de",
                                     "--json")
        steps["plot"] = invoke("plot", run, "-i", toy / "test.en", "--limit", "1", "-o", root / "plots")
        steps["plot-curves"] = invoke("plot-curves", run)
    return {"root": root, "config": config, "run": run, "toy": toy, "steps": steps, "attempts": attempts}


def test_full_toy_pipeline_with_sockets_blocked(e2e):
    for name, result in e2e["steps"].items():
        assert result.exit_code == 0, (name, result.output)
    assert e2e["attempts"] == []
    hyps = (e2e["root"] / "hyp.de").read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 5 and hyps[-1] == ""
    assert json.loads(e2e["steps"]["eval-hyp"].stdout)[0]["metric"] == "bleu"
    assert list((e2e["root"] / "plots").rglob("*.png")) and (e2e["run"] / "curves.png").is_file()


GUARDED_IMPORT = """
import socket, sys
def refuse(*args, **kwargs):
    raise RuntimeError("network access attempted")
socket.socket.connect = socket.socket.connect_ex = socket.create_connection = socket.getaddrinfo = refuse
import attnmt, attnmt.cli
try:
    attnmt.cli.app(["--help"], prog_name="attnmt")
except SystemExit as e:
    sys.exit(e.code)
"""


def test_import_and_help_with_sockets_blocked():
    result = subprocess.run([sys.executable, "-c", GUARDED_IMPORT],
                            cwd=REPO, env={**os.environ, **OFFLINE_ENV},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "translate" in result.stdout and result.stderr == ""


@pytest.fixture
def run_copy(e2e, tmp_path) -> Path:
    return Path(shutil.copytree(e2e["run"], tmp_path / "run", ignore=shutil.ignore_patterns(".lock")))


def train_again(e2e, run: Path, *sets: str):
    return invoke("train", e2e["config"], "--run-dir", run, *[a for s in sets for a in ("--set", s)])


def newest(run: Path) -> Path:
    return run / "checkpoints" / read_pointer(RunDir(run), "latest")["file"]


@pytest.fixture
def spm_seen(monkeypatch) -> list[bytes]:
    """Every model the sentencepiece loader is given, in order."""
    import sentencepiece

    seen: list[bytes] = []
    real = sentencepiece.SentencePieceProcessor

    def spy(*args, **kwargs):
        seen.append(kwargs.get("model_proto"))
        return real(*args, **kwargs)

    monkeypatch.setattr(sentencepiece, "SentencePieceProcessor", spy)
    return seen


def other_tokenizer():
    """A valid tokenizer other than the run's (60 pieces instead of 64)."""
    from attnmt.config.schema import TokenizerConfig
    from attnmt.data.tokenizer import train_tokenizer

    src, tgt = toy_text(200)
    return train_tokenizer(src, tgt, TokenizerConfig(vocab_size=60))


@pytest.mark.parametrize("command", ["train", "info", "prepare"])
def test_a_tampered_run_tokenizer_is_refused_before_sentencepiece_reads_it(e2e, run_copy, spm_seen, command):
    model = run_copy / "tokenizer" / "spm.model"
    tampered = bytearray(model.read_bytes())
    tampered[len(tampered) // 2] ^= 0xFF
    model.write_bytes(bytes(tampered))
    before = hash_tree(run_copy)
    args = {"train": ["train", e2e["config"], "--run-dir", run_copy], "info": ["info", run_copy],
            "prepare": ["prepare", e2e["config"], "--run-dir", run_copy]}[command]  # fmt: skip
    expect_error(invoke(*args), 4, "spm.model: tokenizer does not match (sha256")
    assert bytes(tampered) not in spm_seen
    assert_kept(before, run_copy)


def test_another_tokenizer_in_the_run_folder_is_refused_on_resume(e2e, run_copy, spm_seen):
    """A consistent swap (model and tokenizer.json both replaced) matches its own hash, not the checkpoint's:
    parts of two runs, exit 3 naming both, before sentencepiece parses it. translate is unaffected: a
    checkpoint carries its own tokenizer."""
    other = other_tokenizer()
    shutil.rmtree(run_copy / "tokenizer")
    (run_copy / "tokenizer").mkdir()
    (run_copy / "tokenizer" / "spm.model").write_bytes(other.src_model)
    (run_copy / "tokenizer" / "tokenizer.json").write_text(json.dumps(other.meta()), encoding="utf-8")
    spm_seen.clear()
    before = hash_tree(run_copy)
    expect_error(train_again(e2e, run_copy), 3, "tokenizer: another tokenizer than the one",
                 "checkpoints/step_")
    assert other.src_model not in spm_seen
    assert_kept(before, run_copy)
    assert invoke("translate", run_copy, SOURCES[0]).exit_code == 0


def test_a_checkpoint_with_altered_tokenizer_bytes_exits_4_on_translate(run_copy, tmp_path, spm_seen):
    payload = load_checkpoint(newest(run_copy))
    altered = bytearray(payload["tokenizer"]["spm.model"].numpy().tobytes())
    altered[len(altered) // 2] ^= 0xFF
    payload["tokenizer"]["spm.model"] = bytes_tensor(bytes(altered))
    torch.save(payload, tmp_path / "altered.pt")
    before = hash_tree(tmp_path)
    expect_error(invoke("translate", tmp_path / "altered.pt", SOURCES[0]), 4,
                 "tokenizer does not match checkpoint")
    assert bytes(altered) not in spm_seen
    assert_kept(before, tmp_path)


def test_resume_with_another_model_config_exits_4(e2e, run_copy):
    before = hash_tree(run_copy)
    expect_error(train_again(e2e, run_copy, "model.d_model=32"), 4, "another model config",
                 "d_model: 16 -> 32")
    assert_kept(before, run_copy)


def test_weights_of_another_architecture_exit_4_on_translate(run_copy, tmp_path):
    payload = load_checkpoint(newest(run_copy))
    payload["config"]["model"]["d_model"] = 32  # the stored config no longer describes the weights
    torch.save(payload, tmp_path / "other.pt")
    before = hash_tree(tmp_path)
    expect_error(invoke("translate", tmp_path / "other.pt", SOURCES[0]), 4,
                 "weights do not fit the model its config describes")
    assert_kept(before, tmp_path)


class MakesMarker:
    """Pickles as ``open(marker, "w")``: loading it with plain pickle would create the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def damaged(kind: str, good: Path, path: Path) -> str:
    """Write a damaged or foreign checkpoint to ``path``; returns a fragment of the expected message."""
    data = good.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "foreign-state-dict":
        torch.save({"encoder.weight": torch.zeros(4, 4)}, path)
        return "not an attnmt checkpoint"
    elif kind == "pickled-payload":
        torch.save({"format": FORMAT, "model": {}, "extra": MakesMarker(path.with_name("marker"))}, path)
        return "it holds pickled objects, which attnmt never loads"
    elif kind == "newer-format":
        payload = load_checkpoint(good)
        payload["format"] = FORMAT + 1
        torch.save(payload, path)
        return f"written by checkpoint format {FORMAT + 1}; this attnmt reads <= {FORMAT}"
    return "corrupt or unsafe checkpoint"


@pytest.mark.parametrize("kind", ["truncated", "empty", "random", "foreign-state-dict", "pickled-payload",
                                  "newer-format"])
@pytest.mark.parametrize("command", ["translate", "eval"])
def test_a_damaged_foreign_or_unsafe_checkpoint_exits_4(run_copy, tmp_path, kind, command):
    bad = tmp_path / "model.pt"
    fragment = damaged(kind, newest(run_copy), bad)
    (tmp_path / "src.en").write_text(SOURCES[0] + "\n", encoding="utf-8")
    before = hash_tree(tmp_path)
    args = (["translate", bad, "-i", tmp_path / "src.en", "-o", tmp_path / "out.de"] if command == "translate"
            else ["eval", bad, "--src", tmp_path / "src.en", "--ref", tmp_path / "src.en",
                  "--hyp-out", tmp_path / "out.de"])  # fmt: skip
    expect_error(invoke(*args), 4, str(bad), fragment)
    assert not (tmp_path / "marker").exists()  # the pickled payload never ran
    assert_kept(before, tmp_path)
    assert not (tmp_path / "out.de").exists()


def test_no_loadable_checkpoint_stops_resume_and_changes_nothing(e2e, run_copy):
    """Starting over would overwrite and prune the damaged files: a person decides."""
    for path in (run_copy / "checkpoints").glob("step_*.pt"):
        path.write_bytes(path.read_bytes()[:1000])
    before = hash_tree(run_copy)
    expect_error(train_again(e2e, run_copy), 4, "no loadable checkpoint",
                 "move the folder away to start over")
    assert_kept(before, run_copy)


def test_a_truncated_newest_checkpoint_resumes_from_the_previous_one(e2e, run_copy):
    latest = newest(run_copy)
    latest.write_bytes(latest.read_bytes()[:5000])
    result = train_again(e2e, run_copy)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert warnings and all(line.startswith("WARNING ") for line in warnings), result.stderr
    assert "using step_00000010.pt instead" in result.stderr and latest.name in result.stderr
    assert "resumed from step_00000010.pt" in result.stdout
    assert load_checkpoint(newest(run_copy))["progress"]["step"] == 14


def test_resume_with_a_changed_training_setting_exits_2(e2e, run_copy):
    before = hash_tree(run_copy)
    expect_error(train_again(e2e, run_copy, "train.lr=0.02"), 2,
                 "cannot resume with changed training settings", "lr: 0.01 -> 0.02")
    assert_kept(before, run_copy)


def test_a_leftover_tmp_and_a_corrupt_pointer_are_cleaned_and_rebuilt(e2e, run_copy):
    latest = newest(run_copy)
    stray = run_copy / "checkpoints" / ".step_00000099.pt.tmp-4242"
    shutil.copy(latest, stray)
    (run_copy / "checkpoints" / "latest.json").write_text('{"step": 14, "fi', encoding="utf-8")
    result = train_again(e2e, run_copy)
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.stdout
    assert not stray.exists()
    assert read_pointer(RunDir(run_copy), "latest") == {"step": 14, "file": latest.name,
                                                        "sha256": sha256_file(latest), "format": FORMAT}


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_a_run_folder_that_is_a_file_exits_2(e2e, tmp_path, command):
    """A file in the run folder's place is a usage error, refused before anything is written, whether
    --run-dir or the config's train.run_dir names it; the lock (the other half of the case) is tested in
    test_cli.py and test_train.py."""
    (tmp_path / "run").write_text("not a folder\n")
    before = hash_tree(tmp_path)
    expect_error(invoke(command, e2e["config"], "--run-dir", tmp_path / "run"), 2, "is a file; give a folder")
    expect_error(invoke(command, e2e["config"], "--set", f"train.run_dir={tmp_path / 'run'}"), 2,
                 "is a file, not a run folder")
    assert_kept(before, tmp_path)


def test_an_unwritable_output_exits_5_and_a_folder_output_exits_2(e2e, tmp_path):
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "folder").mkdir()
    before = hash_tree(tmp_path)
    expect_error(invoke("translate", e2e["run"], SOURCES[0], "-o", tmp_path / "file" / "out.de"), 5,
                 "out.de: cannot write")
    expect_error(invoke("translate", e2e["run"], SOURCES[0], "-o", tmp_path / "folder"), 2,
                 "is a folder; give a file name")
    assert_kept(before, tmp_path)
    assert os.listdir(tmp_path / "folder") == []


def limit_address_space() -> None:
    """preexec_fn: 3 GiB of address space. torch, datasets and a tiny training run fit (they need about
    2 GiB); the validation batch below would need more than that for one attention matrix."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_out_of_memory_in_training_exits_5_with_a_hint_and_keeps_the_checkpoint(tmp_path):
    """Step 1 is saved; the validation at step 2 puts four ~12k-piece dev sentences in one batch
    (decode.max_tokens 10^6), and the math attention kernel asks for a (4, 2, S, S) score tensor of about
    4.6 GB, which the address-space limit refuses: the CPU allocator's RuntimeError becomes exit 5."""
    src, tgt = toy_text(40)
    dev = tmp_path / "data" / "dev"
    dev.parent.mkdir()
    dev.with_suffix(".en").write_text(lines([((" ".join(src) + " ") * 30)[:30_000]] * 4), encoding="utf-8")
    dev.with_suffix(".de").write_text(lines([((" ".join(tgt) + " ") * 30)[:30_000]] * 4), encoding="utf-8")
    config = write_config(
        tmp_path / "cfg.yaml", {"format": "toy", "split": "train", "size": 200},
        dev={"src": str(dev.with_suffix(".en")), "tgt": str(dev.with_suffix(".de"))},
        model={"enc_kernel": "math", "dec_kernel": "math"},
        train={"save_every": 1, "eval_every": 2, "max_steps": 4}, decode={"max_tokens": 1_000_000},
    )  # fmt: skip
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "attnmt", "train", str(config), "--run-dir", str(run)],
                            cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=180,
                            preexec_fn=limit_address_space)  # fmt: skip
    assert result.returncode == 5, result.stderr
    line = assert_one_error_line(result.stderr)
    assert ("out of memory: reduce the batch" in line and "decode.max_tokens" in line
            and "train.max_tokens" in line)
    pointer = read_pointer(RunDir(run), "latest")
    assert pointer["step"] == 1
    payload = load_checkpoint(run / "checkpoints" / step_file(1), pointer["sha256"])
    assert payload["progress"]["step"] == 1
    assert not list((run / "checkpoints").glob(".*tmp*"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_machine_exits_2(e2e, tmp_path):
    before = hash_tree(tmp_path)
    expect_error(invoke("train", e2e["config"], "--run-dir", tmp_path / "run", "--set", "train.device=cuda"),
                 2, "train.device: CUDA is not available on this machine; use device: cpu")  # fmt: skip
    expect_error(invoke("translate", e2e["run"], SOURCES[0], "--device", "cuda"), 2,
                 "--device: CUDA is not available")
    assert_kept(before, tmp_path)
    assert not (tmp_path / "run" / "checkpoints").exists()


# -------------------------------------------------------------------------- bad decode and eval input


class _Terminal:
    """A stand-in for sys.stdin on a terminal."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_terminal_stdin_gets_one_hint_then_reads_like_cat(monkeypatch, capsys, tty):
    from attnmt.cli.common import input_lines

    stdin = _Terminal(b"first line\nsecond\n")
    if not tty:
        stdin.isatty = lambda: False
    monkeypatch.setattr(sys, "stdin", stdin)
    assert list(input_lines(None)) == ["first line", "second"]
    hint = "attnmt: reading sentences from the terminal, one per line; Ctrl-D to end\n"
    assert capsys.readouterr().err == (hint if tty else "")


def test_a_beam_far_beyond_the_vocabulary_exits_2(e2e, tmp_path):
    expect_error(invoke("translate", e2e["run"], "--beam-size", "10000", SOURCES[0]), 2,
                 "--beam-size 10000 exceeds the target vocabulary (64 pieces)")


def test_a_hyp_out_equal_to_a_reference_is_refused(tmp_path):
    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    hyp.write_text("a\nb\n")
    ref.write_text("a\nc\n")
    before = hash_tree(tmp_path)
    expect_error(invoke("eval", "--hyp", hyp, "--ref", ref, "--hyp-out", ref), 2,
                 "refusing to overwrite the input")
    assert_kept(before, tmp_path)


@pytest.mark.parametrize(
    "hyp, ref, fragments",
    [("a\nb\nc\n", "a\nb\n", ["hyp has 3 lines", "ref has 2"]),
     ("", "a\nb\n", ["hyp has 0 lines", "ref has 2"]),
     ("a\n", "", ["the reference file is empty"]),
     ("", "", ["the reference file is empty"])],
    ids=["3-vs-2", "empty-hyp", "empty-ref", "both-empty"],
)  # fmt: skip
def test_eval_line_counts_or_empty_files_exit_3(tmp_path, hyp, ref, fragments):
    (tmp_path / "hyp").write_text(hyp)
    (tmp_path / "ref").write_text(ref)
    before = hash_tree(tmp_path)
    expect_error(invoke("eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "ref"), 3, *fragments)
    assert_kept(before, tmp_path)


# ------------------------------------------------------------------------ the contract: bugs, --debug


def test_a_bug_exits_1_with_one_line_and_the_debug_hint(tmp_path, monkeypatch):
    import attnmt.config.schema

    def broken(*args, **kwargs):
        raise KeyError("lr")

    monkeypatch.setattr(attnmt.config.schema, "load_config", broken)
    line = expect_error(invoke("prepare", tmp_path / "cfg.yaml"), 1)
    assert line == "error: internal error: KeyError: 'lr' (run with --debug for a traceback)"


def test_a_bug_in_training_exits_1_and_logs_its_traceback_in_the_run(e2e, run_copy, monkeypatch):
    from attnmt.training.trainer import Trainer

    def broken(self, group):
        return 1 / 0

    monkeypatch.setattr(Trainer, "train_step", broken)
    checkpoints = hash_tree(run_copy / "checkpoints")
    line = expect_error(train_again(e2e, run_copy, "train.max_steps=15"), 1)
    assert line == (
        "error: internal error: ZeroDivisionError: division by zero (run with --debug for a traceback)"
    )
    log = (run_copy / "train.log").read_text(encoding="utf-8")
    assert ("internal error\nTraceback (most recent call last)" in log
            and log.rstrip().endswith("ZeroDivisionError: division by zero"))
    assert hash_tree(run_copy / "checkpoints") == checkpoints


def test_out_of_memory_outside_training_exits_5(tmp_path, monkeypatch):
    import attnmt.models.checkpoint

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 4096000000 bytes. "
                           "Error code 12 (Cannot allocate memory)")  # fmt: skip

    monkeypatch.setattr(attnmt.models.checkpoint, "load_model", no_memory)
    expect_error(invoke("translate", tmp_path / "model.pt", SOURCES[0]), 5,
                 "out of memory: reduce the batch (--max-tokens")


# A bug whose frame holds a secret in a local variable (built at run time, so no source line shows it).
BUG_SCRIPT = """
import sys
import attnmt.config.schema
from attnmt.cli import app

def load_config(path, overrides=()):
    token = "hf_" + "".join(reversed("terceS"))
    raise ValueError("the loader broke")

attnmt.config.schema.load_config = load_config
app(sys.argv[1:], prog_name="attnmt")
"""


@pytest.mark.parametrize("debug", [False, True])
def test_debug_shows_a_traceback_but_never_locals(tmp_path, debug):
    args = ["--debug"] if debug else []
    result = subprocess.run([sys.executable, "-c", BUG_SCRIPT, *args, "prepare", str(tmp_path / "cfg.yaml")],
                            cwd=REPO, env={**os.environ, **OFFLINE_ENV},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "hf_Secret" not in result.stdout + result.stderr
    if debug:
        assert "Traceback" in result.stderr and "ValueError: the loader broke" in result.stderr
        assert "token =" not in result.stderr  # rich would list the frame's locals as "token = 'hf_...'"
    else:
        assert assert_one_error_line(result.stderr) == (
            "error: internal error: ValueError: the loader broke (run with --debug for a traceback)"
        )


@pytest.mark.parametrize("args, code", [
    (["prepare", "{tmp}/missing.yaml"], None),  # the config is not there
    (["translate", "{tmp}/missing.pt", "x"], 4),
    (["eval", "--hyp", "{tmp}/missing.txt", "--ref", "{tmp}/missing.txt"], 3),
], ids=["config", "checkpoint", "data"])
def test_debug_keeps_the_exit_code_of_an_expected_error(tmp_path, args, code):
    """``--debug`` adds the traceback and keeps the contract's code; the error line still comes last."""
    args = [a.format(tmp=tmp_path) for a in args]
    plain = subprocess.run([sys.executable, "-m", "attnmt", *args], cwd=REPO,
                           env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=60)
    debug = subprocess.run([sys.executable, "-m", "attnmt", "--debug", *args], cwd=REPO,
                           env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=60)
    line = assert_one_error_line(plain.stderr)
    assert plain.returncode == code if code else plain.returncode in (2, 3)
    assert debug.returncode == plain.returncode
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1] == line
