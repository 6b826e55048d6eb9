"""``scripts/bootstrap_guided.py`` on the toy task as files, end to end in a few steps: forward and reverse
models, the training corpus aligned with both, a guided model trained on those links, both scored.

The end-to-end runs call the script's ``main`` in this process, and its ``attnmt`` commands (train, align,
eval) go through the Typer app here too (``in_process``): they check what the bootstrap makes, not how a
child process starts (each would cost seconds of start-up); eflomal's script still runs as a child. The
refusals run the script as a user does, exit codes and all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helpers import OFFLINE_ENV, REPO, TINY_MODELS, TINY_TRAIN, script_in_process
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.insight.links import alignment_scores, parse_pharaoh

pytestmark = pytest.mark.usefixtures("restore_torch_state")


@pytest.fixture
def bootstrap(monkeypatch, capsys):
    """``bootstrap(*args)``: the script's ``main(args)`` in this process (``helpers.script_in_process``)."""
    return script_in_process("bootstrap_guided", monkeypatch, capsys)


def toy_recipes(tmp_path):
    """The toy task as files, an unguided and a guided tiny recipe on them, and the command's start."""
    data = tmp_path / "toy"
    made = CliRunner().invoke(app, ["toy-data", str(data), "--train-size", "200", "--dev-size", "20",
                                    "--test-size", "20"])
    assert made.exit_code == 0, made.output
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de",
                 **{split: {"src": str(data / f"{split}.en"), "tgt": str(data / f"{split}.de")}
                    for split in ("train", "dev", "test")}},
        "tokenizer": {"vocab_size": 64},
        "model": TINY_MODELS["transformer"],
        "train": TINY_TRAIN,
        "decode": {"max_len_b": 5},
    }  # fmt: skip
    plain, guided = tmp_path / "plain.yaml", tmp_path / "guided.yaml"
    plain.write_text(json.dumps(config), encoding="utf-8")
    config["train"] = {**TINY_TRAIN, "alignment": {"layer": 1, "heads": [1], "weight": 0.5}}
    guided.write_text(json.dumps(config), encoding="utf-8")
    return data, [str(plain), "--guided", str(guided), "--set", "train.max_steps=6", "--set",
                  "train.eval_every=6", "--set", "train.save_every=6"]


def test_bootstrap_trains_aligns_both_ways_and_trains_guided(tmp_path, bootstrap):
    data, start = toy_recipes(tmp_path)
    out = tmp_path / "boot"
    command = [*start, "--out", str(out)]
    code, _, err = bootstrap(*command)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert set(summary["forward"]) == set(summary["guided"]) == {"bleu", "chrf"}
    assert summary["test"] == str(data / "test.en")
    # The reverse model reads every split the other way round.
    reverse = yaml.safe_load((out / "reverse.yaml").read_text(encoding="utf-8"))
    assert (reverse["data"]["src_lang"], reverse["data"]["tgt_lang"]) == ("de", "en")
    assert reverse["data"]["train"] == {**reverse["data"]["train"], "src": str(data / "train.de"),
                                        "tgt": str(data / "train.en")}
    # One alignment line per line of the training corpus, in range of its words; the guided run learned
    # from them (its loss has the alignment term) and read them from where the bootstrap wrote them.
    links = (out / "train.align").read_text(encoding="utf-8").splitlines()
    sources = (data / "train.en").read_text(encoding="utf-8").splitlines()
    targets = (data / "train.de").read_text(encoding="utf-8").splitlines()
    assert len(links) == len(sources) == 200
    assert sum(bool(line) for line in links) > 150
    for line, s, t in zip(links, sources, targets):
        assert all(i < len(s.split()) and j < len(t.split()) for i, j in parse_pharaoh(line)[0])
    records = [json.loads(x) for x in (out / "guided" / "metrics.jsonl").read_text().splitlines()]
    assert any("align_loss" in r for r in records if r.get("event") == "train")
    resolved = yaml.safe_load((out / "guided" / "config.yaml").read_text(encoding="utf-8"))
    assert resolved["train"]["alignment"]["path"] == str(out / "train.align")
    # The guided model the other way round, taught the same links turned round; each names the other.
    back = yaml.safe_load((out / "guided_reverse" / "config.yaml").read_text(encoding="utf-8"))
    assert (back["data"]["src_lang"], back["data"]["tgt_lang"]) == ("de", "en")
    assert back["train"]["alignment"]["path"] == str(out / "train.rev.align")
    turned = (out / "train.rev.align").read_text(encoding="utf-8").splitlines()
    assert [parse_pharaoh(x)[0] for x in turned] == [{(j, i) for i, j in parse_pharaoh(x)[0]} for x in links]
    assert set(summary["guided_reverse"]) == {"bleu", "chrf"}
    for run, other in (("guided", "guided_reverse"), ("guided_reverse", "guided")):
        named = json.loads((out / run / "reverse.json").read_text(encoding="utf-8"))["model"]
        assert (out / run / named).resolve() == (out / other).resolve()
    both = CliRunner().invoke(app, ["align", str(out / "guided"), "--src", str(data / "test.en"), "--tgt",
                                    str(data / "test.de")])
    assert both.exit_code == 0 and "aligning both ways" in both.stderr
    # Run again: every step is found done and nothing is trained again.
    code, again, err = bootstrap(*command)
    assert code == 0 and "bootstrap:" not in again, err


def test_bootstrap_with_eflomal_as_the_teacher(tmp_path, bootstrap):
    data, start = toy_recipes(tmp_path)
    out = tmp_path / "boot"
    code, _, err = bootstrap(*start, "--out", str(out), "--teacher", "eflomal")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["teacher"] == "eflomal"
    assert set(summary["minutes"]) == {"forward", "align", "guided", "guided_reverse"}
    assert not (out / "reverse").exists()
    # eflomal's links on the toy corpus: one line per line, close to the gold (a tiny model's would not be).
    predicted = [parse_pharaoh(x)[0] for x in (out / "train.align").read_text(encoding="utf-8").splitlines()]
    gold = [parse_pharaoh(x) for x in (data / "train.align").read_text(encoding="utf-8").splitlines()]
    assert len(predicted) == len(gold) == 200
    assert alignment_scores(predicted, [s for s, _ in gold], [s | p for s, p in gold]).aer < 0.2
    records = [json.loads(x) for x in (out / "guided" / "metrics.jsonl").read_text().splitlines()]
    assert any("align_loss" in r for r in records if r.get("event") == "train")


def test_bootstrap_refuses_a_folder_of_someone_elses_files(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.align").write_text("0-0\n", encoding="utf-8")  # would be taken as step 3 done
    recipe = tmp_path / "recipe.yaml"  # a config that loads (its files are not read before training)
    pair = {"src": str(tmp_path / "train.en"), "tgt": str(tmp_path / "train.de")}
    recipe.write_text(json.dumps({"data": {"train": pair, "dev": pair}, "model": TINY_MODELS["transformer"]}),
                      encoding="utf-8")
    command = [sys.executable, str(REPO / "scripts" / "bootstrap_guided.py"), str(recipe), "--guided",
               str(recipe), "--out"]
    result = subprocess.run([*command, str(mine)], cwd=REPO, env=OFFLINE_ENV, capture_output=True, text=True)
    assert result.returncode == 2 and "holds files the bootstrap did not write" in result.stderr
    assert [p.name for p in mine.iterdir()] == ["train.align"]
    (tmp_path / "file").write_text("x", encoding="utf-8")
    result = subprocess.run([*command, str(tmp_path / "file")], cwd=REPO, env=OFFLINE_ENV,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "is not a folder" in result.stderr
    assert (tmp_path / "file").read_text(encoding="utf-8") == "x"
    # A folder of the other teacher: its train.align would be taken for this teacher's links.
    made = tmp_path / "made"
    made.mkdir()
    marker = made / "bootstrap_guided.json"
    marker.write_text('{"made_by": "scripts/bootstrap_guided.py", "teacher": "attnmt"}\n', encoding="utf-8")
    result = subprocess.run([*command, str(made), "--teacher", "eflomal"], cwd=REPO, env=OFFLINE_ENV,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "was made with --teacher attnmt" in result.stderr, result.stderr
    assert '"teacher": "attnmt"' in marker.read_text(encoding="utf-8")

