"""``scripts/align_layer.py`` on the toy task as files, end to end in a few steps: an alignment layer added to
a trained run with its translation frozen, taught by the toy's gold links (a Pharaoh file) or by no teacher
(a layer that predicts, then its own links), scored on the test split against the gold.

The oracles: the layer runs' translation weights are RUN's bit for bit; the layer taught the gold aligns the
test split better than RUN's own attention does; a second call finds every step done. As in
``test_bootstrap.py``, the end-to-end runs call the script's ``main`` in this process, its ``attnmt`` commands
through the Typer app here; the refusals run the script as a user does, exit codes and all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import (
    OFFLINE_ENV,
    REPO,
    TINY_MODELS,
    TINY_TRAIN,
    assert_one_error_line,
    hash_tree,
    script_in_process,
)
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.insight.links import parse_pharaoh
from attnmt.models.checkpoint import load_checkpoint, resolve_model_path

pytestmark = pytest.mark.usefixtures("restore_torch_state")

SCRIPT = REPO / "scripts" / "align_layer.py"


def invoke(*args) -> object:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy task as files (200 training pairs, 50 test pairs with their gold links) and a tiny run
    trained 10 steps on them: its own attention aligns poorly, and its data.train is a file pair."""
    root = tmp_path_factory.mktemp("align_layer")
    data = root / "toy"
    invoke("toy-data", data, "--train-size", 200, "--dev-size", 20, "--test-size", 50)
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de",
                 **{split: {"src": str(data / f"{split}.en"), "tgt": str(data / f"{split}.de")}
                    for split in ("train", "dev")}},
        "tokenizer": {"vocab_size": 64},
        "model": TINY_MODELS["transformer"],
        "train": {**TINY_TRAIN, "max_steps": 10, "eval_every": 10, "save_every": 10},
        "decode": {"max_len_b": 5},
    }  # fmt: skip
    recipe = root / "tiny.yaml"
    recipe.write_text(json.dumps(config), encoding="utf-8")
    deterministic = torch.are_deterministic_algorithms_enabled()
    invoke("train", recipe, "--run-dir", root / "run")
    torch.use_deterministic_algorithms(deterministic)  # the module fixture outlives restore_torch_state
    test = ("--src", data / "test.en", "--tgt", data / "test.de", "--gold", data / "test.align")
    return {"root": root, "data": data, "run": root / "run", "recipe": recipe, "test": test}


@pytest.fixture
def align_layer(monkeypatch, capsys):
    """``align_layer(*args)``: the script's ``main(args)`` in this process (``helpers.script_in_process``)."""
    return script_in_process("align_layer", monkeypatch, capsys)


def translation(model) -> dict[str, torch.Tensor]:
    """A checkpoint's weights but the alignment layer's."""
    weights = load_checkpoint(resolve_model_path(model))["model"]
    return {name: tensor for name, tensor in weights.items() if not name.startswith("aligner.")}


def assert_same_translation(run, layer) -> None:
    """The layer run translates with RUN's weights, bit for bit, and has a layer of its own."""
    expected, found = translation(run), translation(layer)
    assert sorted(found) == sorted(expected)
    differ = [name for name in expected if not torch.equal(expected[name], found[name])]
    assert not differ, differ[:5]
    assert any(k.startswith("aligner.") for k in load_checkpoint(resolve_model_path(layer))["model"])


def trained_with(model) -> dict:
    """The train section a checkpoint was trained with (the run folder's config.yaml is RUN's, copied)."""
    return load_checkpoint(resolve_model_path(model))["config"]["train"]


def read_summary(out) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def test_a_layer_taught_the_gold_aligns_better_than_the_run_and_translates_as_it(toy, align_layer):
    out, gold = toy["root"] / "gold", toy["data"] / "train.align"
    command = [toy["run"], "--out", out, "--steps", 40, "--teacher", gold, *toy["test"]]
    code, said, err = align_layer(*command)
    assert code == 0, err
    assert [line for line in said.splitlines() if line.startswith("align_layer:")] == ["align_layer: layer"]
    summary = read_summary(out)
    assert summary["teacher"] == summary["links"] == str(gold)
    assert set(summary) == {"teacher", "links", "minutes", "run", "layer"}  # predict: --teacher self only
    assert set(summary["minutes"]) == {"layer"}
    assert summary["run"]["layer"] == "avg" and summary["layer"]["layer"] == "aligner"
    for scores in (summary["run"], summary["layer"]):
        assert {"precision", "recall", "f1", "aer"} <= set(scores)
        p, r = scores["precision"], scores["recall"]
        assert scores["f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0, abs=1e-6)
    print({name: summary[name]["aer"] for name in ("run", "layer")})
    # 40 steps on the gold: 0.68 against the run's 0.92 when written; the margin leaves room for other CPUs.
    assert summary["layer"]["aer"] < summary["run"]["aer"] - 0.1
    assert_same_translation(toy["run"], out / "layer")
    taught = trained_with(out / "layer")
    assert taught["alignment"] == {**taught["alignment"], "module": "layer", "translation": "frozen",
                                   "objective": "links", "path": str(gold)}
    assert taught["init_from"] == str(toy["run"]) and taught["max_steps"] == 40
    # align reads the layer by default, and its scores are the summary's.
    read = json.loads(invoke("align", out / "layer", *toy["test"], "--json").stdout)
    assert read["layer"] == "aligner" and read["aer"] == summary["layer"]["aer"]
    # Again: every step is found done, nothing is trained again, the minutes of the first call are kept.
    before = hash_tree(out / "layer")
    code, again, err = align_layer(*command)
    assert code == 0, err
    assert "align_layer:" not in again and hash_tree(out / "layer") == before
    assert read_summary(out) == summary


def test_a_layer_with_no_teacher_predicts_then_learns_its_own_links(toy, align_layer):
    out = toy["root"] / "self"
    command = [toy["run"], "--out", out, "--steps", 10, "--shift", *toy["test"]]
    code, said, err = align_layer(*command)
    assert code == 0, err
    steps = [line for line in said.splitlines() if line.startswith("align_layer:")]
    assert steps == ["align_layer: predict", "align_layer: align", "align_layer: layer"]
    summary = read_summary(out)
    assert summary["teacher"] == "self" and summary["links"] == str(out / "train.align")
    assert set(summary["minutes"]) == {"predict", "align", "layer"}
    assert summary["run"]["layer"] == "avg"
    assert summary["predict"]["layer"] == summary["layer"]["layer"] == "aligner"
    assert all(0 <= summary[name]["aer"] <= 1 for name in ("run", "predict", "layer"))
    # The predicting layer's links of the training corpus: one line per line, in range of its words.
    links = (out / "train.align").read_text(encoding="utf-8").splitlines()
    sources = (toy["data"] / "train.en").read_text(encoding="utf-8").splitlines()
    targets = (toy["data"] / "train.de").read_text(encoding="utf-8").splitlines()
    assert len(links) == len(sources) == 200 and sum(bool(line) for line in links) > 100
    for line, s, t in zip(links, sources, targets):
        assert all(i < len(s.split()) and j < len(t.split()) for i, j in parse_pharaoh(line)[0])
    # Both layers translate with RUN's weights; the second started from the first's layer and learned on.
    for name in ("predict", "layer"):
        assert_same_translation(toy["run"], out / name)
    config = {name: trained_with(out / name) for name in ("predict", "layer")}
    assert config["predict"]["alignment"]["objective"] == "predict"
    # --shift is the links layer's alone: a predicting layer would be shown the piece it predicts.
    assert config["predict"]["alignment"]["shift"] is False and config["layer"]["alignment"]["shift"] is True
    assert config["predict"]["init_from"] == str(toy["run"])
    assert config["layer"]["alignment"]["path"] == str(out / "train.align")
    assert config["layer"]["init_from"] == str(out / "predict")
    first, second = (load_checkpoint(resolve_model_path(out / name))["model"]
                     for name in ("predict", "layer"))
    assert not torch.equal(first["aligner.query.weight"], second["aligner.query.weight"])
    # Again: every step is found done.
    before = hash_tree(out)
    code, again, err = align_layer(*command)
    assert code == 0 and "align_layer:" not in again, err
    assert hash_tree(out) == before


def user_runs(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO,
                            env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_the_refusals_are_one_line_before_any_work(toy, tmp_path):
    """As a user runs it, in processes of their own, at once: each refusal one ``error:`` line and its code,
    and nothing written."""
    run, test = toy["run"], toy["test"]
    plain = tmp_path / "plain"  # a folder, not a run folder
    plain.mkdir()
    foreign = tmp_path / "foreign"  # someone's files: train.align would be taken as the teacher's links
    foreign.mkdir()
    (foreign / "train.align").write_text("0-0\n", encoding="utf-8")
    untrained = tmp_path / "untrained"  # a run folder of the same data, never trained
    for part in ("data", "tokenizer"):
        shutil.copytree(run / part, untrained / part)
    for name in ("config.yaml", "attnmt-run.json"):
        shutil.copy(run / name, untrained / name)
    # A run on the toy task as attnmt generates it (format toy): there are no corpus files to align.
    made = yaml.safe_load(toy["recipe"].read_text(encoding="utf-8"))
    made["data"]["train"] = {"format": "toy", "split": "train", "size": 100}
    made["train"].update(max_steps=2, eval_every=2, save_every=2)
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(json.dumps(made), encoding="utf-8")
    invoke("train", recipe, "--run-dir", tmp_path / "toyrun")
    self_made = tmp_path / "self"  # as the script leaves a folder made with --teacher self
    self_made.mkdir()
    (self_made / "align_layer.json").write_text('{"teacher": "self"}\n', encoding="utf-8")
    (self_made / "train.align").write_text("0-0\n", encoding="utf-8")
    gold = toy["data"] / "train.align"
    new = tmp_path / "new"
    cases = {
        "not a run folder": ([plain, "--out", new], 4, "not an attnmt run folder"),
        "never trained": ([untrained, "--out", new], 4, "no checkpoint yet"),
        "--src alone": ([run, "--out", new, "--src", test[1]], 2, "--src needs --src, --tgt and --gold"),
        "--tgt, --gold without --src": ([run, "--out", new, *test[2:]], 2, "--tgt needs"),
        "foreign --out": ([run, "--out", foreign], 2, "holds files this script did not write"),
        "another teacher's --out": ([run, "--out", self_made, "--teacher", gold], 2,
                                    "was made with --teacher self"),
        "an unknown teacher": ([run, "--out", new, "--teacher", "giza"], 2,
                               "--teacher giza: expected self, eflomal or a Pharaoh file"),
        "--shift with --full-context": ([run, "--out", new, "--shift", "--full-context"], 2,
                                        "--shift goes with the causal pass's queries"),
        "a toy-format run": ([tmp_path / "toyrun", "--out", new], 2,
                             "data.train: format toy is not a file pair"),
    }
    before = {path: hash_tree(path) for path in (foreign, self_made, untrained, tmp_path / "toyrun")}
    children = {what: user_runs(*words) for what, (words, _, _) in cases.items()}
    for what, child in children.items():
        _, stderr = child.communicate(timeout=300)
        _, code, needle = cases[what]
        assert child.returncode == code, (what, stderr)
        assert needle in assert_one_error_line(stderr), (what, stderr)
    assert not new.exists()
    assert {path: hash_tree(path) for path in before} == before


def test_no_teacher_with_a_reverse_run_learns_the_two_directions_symmetrised(toy, align_layer, tmp_path):
    """``--reverse``: a predicting layer on each direction, and the links taught are theirs symmetrised
    (``attnmt align --reverse``: grow-diag-final-and), the same as align makes of the two layers itself."""
    made = yaml.safe_load(toy["recipe"].read_text(encoding="utf-8"))
    made["data"].update(src_lang="de", tgt_lang="en",
                        **{split: {"src": made["data"][split]["tgt"], "tgt": made["data"][split]["src"]}
                           for split in ("train", "dev")})  # fmt: skip
    recipe = tmp_path / "reverse.yaml"
    recipe.write_text(json.dumps(made), encoding="utf-8")
    deterministic = torch.are_deterministic_algorithms_enabled()
    invoke("train", recipe, "--run-dir", tmp_path / "reverse")
    torch.use_deterministic_algorithms(deterministic)
    out = tmp_path / "both"
    code, said, err = align_layer(toy["run"], "--out", out, "--steps", 8, "--reverse", tmp_path / "reverse")
    assert code == 0, err
    steps = [line for line in said.splitlines() if line.startswith("align_layer:")]
    assert steps == ["align_layer: predict", "align_layer: predict_reverse", "align_layer: align",
                     "align_layer: layer"]
    assert read_summary(out)["reverse"] == str(tmp_path / "reverse")
    assert trained_with(out / "predict_reverse")["init_from"] == str(tmp_path / "reverse")
    assert_same_translation(tmp_path / "reverse", out / "predict_reverse")
    data = toy["data"]
    both = tmp_path / "both.align"
    invoke("align", out / "predict", "--src", data / "train.en", "--tgt", data / "train.de",
           "--reverse", out / "predict_reverse", "-o", both)
    one_way = tmp_path / "one_way.align"
    invoke("align", out / "predict", "--src", data / "train.en", "--tgt", data / "train.de", "-o", one_way)
    assert (out / "train.align").read_text(encoding="utf-8") == both.read_text(encoding="utf-8")
    assert both.read_text(encoding="utf-8") != one_way.read_text(encoding="utf-8")
    # The same folder with another route is refused, and --reverse goes with --teacher self only.
    code, _, err = align_layer(toy["run"], "--out", out, "--steps", 8)
    assert code == 2 and "was made with --teacher self --reverse" in assert_one_error_line(err)
    code, _, err = align_layer(toy["run"], "--out", tmp_path / "x", "--teacher", data / "train.align",
                               "--reverse", tmp_path / "reverse")
    assert code == 2 and "--reverse goes with --teacher self" in assert_one_error_line(err)
    code, _, err = align_layer(toy["run"], "--out", tmp_path / "y", "--reverse", toy["run"])
    assert code == 2 and "not on RUN's training files the other way" in assert_one_error_line(err)
