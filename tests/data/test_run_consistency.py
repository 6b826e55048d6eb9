"""A run folder's parts are checked together when training opens them: its encoded splits, its tokenizer
and its checkpoints carry the hash of the tokenizer they were made with, and parts from two runs are refused
with exit 3, one line naming both paths and the fix, before anything is written.

Oracles: two runs of the tiny config made with tokenizers of 64 and 100 pieces; every part of run A that
holds ids or names its tokenizer (``data/``, one split, ``tokenizer/``, ``checkpoints/``), in a prepared
and in a trained run folder, replaced by run B's (the class of the tester's case, which is one member:
``data/`` of B in A, which was an IndexError); the tokenizer's hash computed from the models, from the
tokenizer folder and from a checkpoint's record, which must agree; a split from before the hash, which
must still train, and must still be refused when its ids are past the vocabulary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import assert_one_error_line, hash_tree, train_cli, write_tiny_config
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import TokenizerConfig, load_config
from attnmt.data.prepare import prepare, write_tokenizer
from attnmt.data.tokenizer import folder_sha256, load_tokenizer, recorded_sha256, train_on_samples
from attnmt.data.toy import toy_pairs
from attnmt.runfiles import RunDir

pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py

OTHER = ["tokenizer.vocab_size=100"]  # run B: another tokenizer than the tiny config's 64 pieces
TRAIN_ONE_STEP = ["train.max_steps=1", "train.eval_every=1000"]
# A run folder's parts that hold ids or name the tokenizer they were made with.
PARTS = ["data", "data/train", "data/dev", "tokenizer", "checkpoints"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Runs A (64 pieces) and B (100 pieces) of the tiny config, each prepared, and trained one step (one
    checkpoint) in a copy; nothing here is modified by the tests."""
    import torch

    root = tmp_path_factory.mktemp("runs")
    config = write_tiny_config(root / "tiny.yaml")
    found = {"config": config}
    deterministic = torch.are_deterministic_algorithms_enabled()  # in-process training switches it on
    for name, sets in (("a", []), ("b", OTHER)):
        found[name], found[f"{name}_trained"] = root / name, root / f"{name}_trained"
        prepare(load_config(config, sets), RunDir(found[name]), workers=1)
        shutil.copytree(found[name], found[f"{name}_trained"])
        result = invoke_train(config, found[f"{name}_trained"], *sets)
        assert result.exit_code == 0, result.output
    torch.use_deterministic_algorithms(deterministic)
    return found


def invoke_train(config: Path, run: Path, *sets: str):
    """``attnmt train`` in-process, one step."""
    args = ["train", str(config), "--run-dir", str(run)]
    return CliRunner().invoke(app, args + [a for s in (*TRAIN_ONE_STEP, *sets) for a in ("--set", s)])


def mixed(runs: dict[str, Path], part: str, trained: bool, dest: Path) -> Path:
    """A copy of run A (``trained`` or only prepared) with ``part`` replaced by trained run B's."""
    shutil.copytree(runs["a_trained" if trained else "a"], dest, ignore=shutil.ignore_patterns(".lock"))
    shutil.rmtree(dest / part, ignore_errors=True)  # a prepared run has no checkpoints/
    shutil.copytree(runs["b_trained"] / part, dest / part)
    return dest


def kept(run: Path) -> dict[str, dict[str, str]]:
    """The files of the parts training reads, by hash: a refused start must change none."""
    return {part: hash_tree(run / part) for part in ("data", "tokenizer", "checkpoints")}


def assert_names_both_and_the_fix(line: str, run: Path, part: str) -> None:
    """The one line names a path in the replaced part and one in a part of A it disagrees with."""
    named = {p for p in ("data", "tokenizer", "checkpoints") if str(run / p) in line}
    assert part.split("/")[0] in named and len(named) == 2 and str(run / part) in line, line
    assert "together from one run" in line, line


def test_data_copied_from_a_run_with_another_tokenizer_exits_3_through_the_cli(runs, tmp_path):
    """The tester's case, as a user meets it: ``data/`` of B copied into A, ``attnmt train``."""
    run = mixed(runs, "data", False, tmp_path / "run")
    before = kept(run)
    result = train_cli(runs["config"], run, *TRAIN_ONE_STEP)
    assert result.returncode == 3, result.stderr
    line = assert_one_error_line(result.stderr)
    assert line.startswith(f"error: {run / 'data' / 'train'}: encoded by another tokenizer than the one in "
                           f"{run / 'tokenizer'} "), line
    assert "copy data/ and tokenizer/ together from one run, or run attnmt prepare again" in line
    assert kept(run) == before and not (run / "checkpoints").exists()


@pytest.mark.parametrize("trained", [False, True], ids=["prepared", "trained"])
@pytest.mark.parametrize("part", PARTS)
def test_every_part_from_a_run_with_another_tokenizer_is_refused(runs, tmp_path, part, trained):
    """The class: whichever part of the run folder comes from the other run, training refuses it before
    a step, exit 3, one line naming both paths and the fix; nothing in the folder changes."""
    run = mixed(runs, part, trained, tmp_path / "run")
    before = kept(run)
    result = invoke_train(runs["config"], run)
    assert result.exit_code == 3, result.output
    assert_names_both_and_the_fix(assert_one_error_line(result.stderr), run, part)
    assert kept(run) == before


def test_the_tokenizer_hash_is_one_value_however_it_is_read(runs, tmp_path):
    """From the model bytes, from the folder's ``tokenizer.json``, from a checkpoint's record: the same hash
    for the same tokenizer, joint or separate, and another for another tokenizer."""
    a, b = (load_tokenizer(RunDir(runs[name]).tokenizer) for name in ("a", "b"))
    pairs = toy_pairs("train", 60)
    separate = train_on_samples([[p[0] for p in pairs], [p[1] for p in pairs]],
                                TokenizerConfig(vocab_size=60, joint=False, hard_vocab_limit=False))
    write_tokenizer(separate, {}, RunDir(tmp_path))
    for tokenizer, folder in ((a, RunDir(runs["a"]).tokenizer), (b, RunDir(runs["b"]).tokenizer),
                              (separate, RunDir(tmp_path).tokenizer)):
        assert tokenizer.sha256 == folder_sha256(folder) == recorded_sha256(tokenizer.fingerprint())
    assert len({a.sha256, b.sha256, separate.sha256}) == 3
    for name in ("a", "b"):
        for split in ("train", "dev"):
            meta = json.loads((runs[name] / "data" / split / "split.json").read_text(encoding="utf-8"))
            assert meta["tokenizer_sha256"] == (a if name == "a" else b).sha256


def strip_hash(run: Path) -> None:
    """Make ``run``'s splits look as an attnmt before the tokenizer hash wrote them."""
    for meta_path in (run / "data").glob("*/split.json"):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        del meta["tokenizer_sha256"]
        meta_path.write_text(json.dumps(meta), encoding="utf-8")


def test_a_split_from_before_the_hash_still_trains(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["a"], run)
    strip_hash(run)
    result = invoke_train(runs["config"], run)
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "step_00000001.pt").is_file()


def test_a_split_from_before_the_hash_past_the_vocabulary_is_refused(runs, tmp_path):
    """Without a hash to compare, the largest ids against the vocabulary: B's ids (up to 99) in A (64)."""
    run = mixed(runs, "data", False, tmp_path / "run")
    strip_hash(run)
    result = invoke_train(runs["config"], run)
    assert result.exit_code == 3, result.output
    line = assert_one_error_line(result.stderr)
    assert line.startswith(f"error: {run / 'data' / 'train'}: encoded by another tokenizer than the one in "
                           f"{run / 'tokenizer'} "), line
    assert "that one has 64 source, 64 target pieces" in line and "together from one run" in line
