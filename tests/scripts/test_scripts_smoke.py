"""Every script runs through to its report on its smallest sizes: the benchmarks in ``scripts/bench/`` and the
tools in ``scripts/``, each in a process of its own as a user runs it (``python scripts/bench/bench_x.py
...``), with a time limit against a hang. A smoke run checks that the script got to its report (exit 0 and
the report's header printed), not its numbers: code that no test runs rots unseen (``bench_decode.py
--equal-work --ct2`` died on a stand-in for ``Translator`` that no longer had what ``encode`` reads).

The scripts are found by globbing (a ``.py`` with a ``__main__`` block, a ``.sh``), and each must have an
entry in ``smoke_runs``: a script added later without one fails here. What they read is made once (``world``):
the toy task as files (English-German, and English-Chinese with its segmentation), the same pairs laid out as
a Multi30k folder (``train/val/test_2016_flickr.{de,en}.gz``: the benchmarks that read
``../shared/data/multi30k`` take it through their ``--data``), a tiny config on them, and a tiny run trained
on it for a few steps. The runs start in that folder, not the repository's, and name its files by relative
paths, as a user in a project folder would. The peers (JoeyNMT, HF, their CTranslate2 conversion in
``../shared/peers``) are not there: the scripts that use them skip them by a flag (``bench_chinese.py
--no-joey``) or leave them out by default; CTranslate2 itself, the ``ct2`` extra, runs. A benchmark's
``--smoke`` shrinks what it builds itself (a model, a recipe, a matmul) to its smallest; a benchmark that
trains runs attnmt's commands in its own process instead of a child each (``benchlib.in_process``: a
child's start-up, torch's and its compiler's imports, took seconds, most of such a run's time).

``bootstrap_guided.py`` is not run again here: ``tests/scripts/test_bootstrap.py`` runs it end to end, both
teachers, on the toy task (``COVERED``, checked to still do so); nor is ``align_layer.py``, which
``tests/scripts/test_align_layer.py`` runs end to end. ``gpu_check.sh`` needs a GPU: here it is
checked with ``bash -n``, its Python parts compiled, and its ``bench_train.py`` invocation parsed by
bench_train's own parser.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import OFFLINE_ENV, REPO, SCRIPT_FOLDERS, TOY_CONFIG, TOY_SET, load_script, write_tiny_config

LIMIT_S = 180  # a hang guard for one run, not a timing: each takes seconds


def is_script(path: Path) -> bool:
    """A shell script, or a Python file with a top-level ``if __name__ == "__main__":``."""
    if path.suffix == ".sh":
        return True
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


SCRIPTS = {p.name: p for folder in SCRIPT_FOLDERS for p in sorted(folder.glob("*"))
           if p.suffix in (".py", ".sh") and is_script(p)}


# ------------------------------------------------------------------------------------------ the world


@dataclass
class World:
    """Paths relative to ``root``, the smoke runs' working folder (a script must take a relative path as
    the user meant it, whatever folder its own commands run in)."""

    root: Path
    toy: Path = Path("toy")  # the toy task, en-de: train/dev/test.{en,de,align}
    zh: Path = Path("zh")  # the toy task, en-zh: .zh, .seg.zh
    multi30k: Path = Path("multi30k")  # the toy pairs as a Multi30k folder
    config: Path = Path("tiny.yaml")  # a tiny config on the toy files (train, dev, test)
    run: Path = Path("run")  # that config trained a few steps


def attnmt(*args, cwd: Path = REPO) -> None:
    result = subprocess.run([sys.executable, "-m", "attnmt", *map(str, args)], cwd=cwd,
                            env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True,
                            timeout=LIMIT_S)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("smoke")
    found = World(root)
    toy, zh, multi30k = root / found.toy, root / found.zh, root / found.multi30k
    attnmt("toy-data", toy, "--train-size", 200, "--dev-size", 20, "--test-size", 20)
    attnmt("toy-data", zh, "--train-size", 50, "--dev-size", 5, "--test-size", 20, "--lang", "zh")
    multi30k.mkdir()
    for split, name in (("train", "train"), ("dev", "val"), ("test", "test_2016_flickr")):
        for lang in ("en", "de"):
            with gzip.open(multi30k / f"{name}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write((toy / f"{split}.{lang}").read_text(encoding="utf-8"))
    config = write_tiny_config(root / found.config)
    tiny = json.loads(config.read_text(encoding="utf-8"))
    tiny["data"] = {"src_lang": "en", "tgt_lang": "de",
                    **{split: {"src": str(toy / f"{split}.en"), "tgt": str(toy / f"{split}.de")}
                       for split in ("train", "dev", "test")}}
    tiny["train"].update(max_steps=10, eval_every=10, save_every=10, log_every=5)
    config.write_text(json.dumps(tiny, indent=1), encoding="utf-8")
    attnmt("train", config, "--run-dir", root / found.run)
    return found


# ------------------------------------------------------------------------------------------ the runs


@dataclass(frozen=True)
class Run:
    args: list
    header: str | tuple[str, ...]  # the report's header (or pieces of it), on stdout (or stderr: ``stream``)
    stream: str = "stdout"


def smoke_runs(w: World, tmp: Path) -> dict[str, list[Run]]:
    """Each script's smoke runs (``tmp``: a fresh folder for what it writes), its smallest sizes."""
    test_pair = ["--src", w.toy / "test.en", "--ref", w.toy / "test.de"]
    rows = ["--json", tmp / "rows.json"]
    return {
        # eflomal on 20 + 20 pairs, one attnmt align configuration (--smoke: no warm-up), one round
        "bench_align.py": [Run(
            ["--model", w.run, "--data", w.multi30k, "--src-lang", "en", "--tgt-lang", "de",
             "--eflomal-train", 20, "--runs", 1, "--threads", 1, "--smoke", "--out", tmp / "out"],
            "| aligner | time s |")],
        "bench_attention.py": [Run(
            ["--max-len", 64, "--repeats", 1, "--kernels", "math"], "growth exponents")],
        # --smoke: the recipe's smallest model, 4 steps each of the three trainings
        "bench_backtranslation.py": [Run(
            ["--data", w.multi30k, "--minutes", 1, "--smoke", "--run-root", tmp / "runs", *rows],
            "| training data | BLEU | chrF |")],
        "bench_checkpointing.py": [Run(
            ["--depth", 1, "--length", 4, "--batch", 2, "--threads", 1], "max |grad diff|")],
        # an existing run scored, JoeyNMT left out
        "bench_chinese.py": [Run(
            ["--direction", "en-zh", "--attnmt-run", w.run, "--no-joey", "--work", tmp / "work"],
            ("minutes each (JoeyNMT left out)", "BLEU    chrF"))],
        "bench_constraints.py": [Run(
            [w.run, *test_pair, "--phrases", 1, "--beam-sizes", 1, 2, *rows], "| beam | search | phrases |")],
        # every part in one run: the trained run, the pieces, the equal work with CTranslate2 (int8, beam 1)
        # and the command line; --smoke: a 1+1-layer random model, the checks and every engine's pass in one
        # child process (as a full run's are each in one of its own)
        "bench_decode.py": [Run(
            ["--models", w.run, "--parts", "--equal-work", "--ct2", "--cli", "--smoke", "--data", w.multi30k,
             "--tokenizer", w.run / "tokenizer", "--limit", 4, "--runs", 1, "--length", 5, "--beams", 1,
             "--quantizations", "int8", "--threads", 1],
            ("speedup", "attnmt -> CTranslate2 int8 / CTranslate2 int8 (raw)",
             "attnmt --int8 (random weights) / CTranslate2 int8 (raw)",
             "wall seconds, start-up included", "tok/s  median s")),
            # the whole picture on the tiny run (as teacher and student): a shortlist made, two exports, the
            # figure drawn
            Run(["--picture", "--models", w.run, "--data", w.multi30k, "--limit", 4, "--runs", 1,
                 "--beams", 1, "--threads", 1, "--figure", tmp / "picture.png"],
                ("| engine | beam | sentences/s |", "CTranslate2 int8 = ", "wrote"))],
        "bench_explorer.py": [Run(
            ["--sentences", 2, "--layers", 1, "--heads", 1, "--loads", 1, "--shortest", 3, "--longest", 5],
            "first draw ms")],
        # two pairs: the multilingual model and a single-pair one each
        "bench_multilingual.py": [Run(
            ["--data", w.multi30k, "--pairs", "en-de", "de-en", "--minutes", 1, "--smoke", "--run-root",
             tmp / "runs", *rows], "| pair | single-pair BLEU |")],
        # --smoke: a 1+1-layer Marian model of width 32 on the toy task, 10 sentences, 1 timed step each
        "bench_opus_mt.py": [Run(
            ["--smoke", "--sentences", 10, "--batch-size", 4, "--length", 5, "--rounds", 1, "--train-pairs",
             50, "--batch-tokens", 200, "--steps", 1, "--precisions", "fp32", "--threads", 1, "--out",
             tmp / "opus.json"], "| step | attnmt | HF transformers |")],
        "bench_prefix.py": [Run(
            [w.run, *test_pair, "--words", 1, "--beam-sizes", 1, 2, *rows], "| beam | search | BLEU |")],
        # the clock stops each training within a step or two; --smoke: attnmt's commands in its process
        "bench_sampling.py": [Run(
            [w.config, "--minutes", 0.002, "--smoke", "--run-root", tmp / "runs", *rows],
            "| run | sampling | pieces |")],
        "bench_scale.py": [Run(
            ["--sizes", 40, "--steps", 2, "--data", w.multi30k, "--config", w.config], "| measure |")],
        # the Chinese side of the toy task on the en-de run (its pieces unknown: the alignments still run)
        "bench_segmented_zh.py": [Run(
            [w.run, "--src", w.zh / "test.en", "--tgt", w.zh / "test.zh", "--segmented", w.zh / "test.seg.zh",
             "--train-src", w.zh / "train.en", "--train-segmented", w.zh / "train.seg.zh"],
            "word links against character links")],
        # one level of one client, two sentences; a server of one decoder (no bulk one) on one thread
        "bench_serve.py": [Run(
            [w.run, "--src", w.toy / "test.en", "--limit", 2, "--clients", 1, "--seconds", 1,
             "--serve-args=--bulk-above 0 --threads 1", "--json", tmp / "serve.json"],
            "| clients | requests |"),
            # --hog 1: the same level alone and beside one busy process, and the start-up both ways
            Run([w.run, "--src", w.toy / "test.en", "--limit", 2, "--clients", 1, "--seconds", 1, "--hog", 1,
                 "--serve-args=--bulk-above 0 --threads 1"], "| clients | requests alone / beside |")],
        # --smoke: 20 lines, every mode; the toy test files with their gold links, then --toy's own pairs
        "bench_tags.py": [
            Run([w.run, "--src", w.toy / "test.en", "--tgt", w.toy / "test.de", "--links",
                 w.toy / "test.align", "--smoke", "--out", tmp / "tags.json"],
                "| mode | lines | tags | exact target span |"),
            Run([w.run, "--toy", 5, "--tags-per-line", 2, "--max-span", 2, "--smoke"],
                "| mode | lines | tags | exact target span |")],
        # --smoke: 200/20/20 toy pairs, the recipes' smallest model, one reading of each of the three models
        "bench_toy_align.py": [Run(["--smoke", "--out", tmp / "out"], "| recipe | reading | AER |")],
        # --smoke: the toy task for Multi30k, the smallest model, 2 steps of the two runs symmetrised
        "bench_guided.py": [Run(["--smoke", "--data", w.toy, "--out", tmp / "out", "--steps", 2, "--every", 2,
                                 "--train-pairs", 10, "--variants", "full_w1", "reverse"],
                                ("| run | dev BLEU |", "| full_w1 + reverse |"))],
        # --smoke: the Transformer recipe's smallest model, one timed step (the LSTM's child is the same
        # code); then the pieces, each once at tiny sizes
        "bench_train.py": [
            Run(["--smoke", "--data", w.multi30k, "--archs", "transformer", "--precision", "fp32",
                 "--steps", 1, "--threads", 1], "tok/s (src+tgt)"),
            Run(["--smoke", "--parts", "--threads", 1], "speed-up"),
            Run(["--smoke", "--data", w.multi30k, "--profile", "--archs", "transformer",
                 "--precision", "fp32", "--steps", 1, "--threads", 1], "| output projection |")],
        # limits made loose: at these sizes the verdict means nothing, the sampling runs as at full size
        "check_growth.py": [Run(
            ["--steps", 100, "--every", 50, "--interval", 0.02, "--lines", 2000, "--rss-limit", 10,
             "--out", tmp / "growth.json"], "| process | at |")],
        "check_prepare.py": [Run([TOY_CONFIG, *TOY_SET], "streamed prepare == list-based prepare")],
        "eflomal_align.py": [Run(
            ["--src", w.toy / "train.en", "--tgt", w.toy / "train.de", "-o", tmp / "train.align"],
            "eflomal_align: 200 pairs", "stderr")],
    }


SMOKE = set(smoke_runs(World(Path()), Path()))
# Run end to end by a test of their own (each checked to still run the script).
COVERED = {"bootstrap_guided.py": ("tests/scripts/test_bootstrap.py",
                                   "test_bootstrap_trains_aligns_both_ways_and_trains_guided",
                                   "test_bootstrap_with_eflomal_as_the_teacher"),
           # a file teacher and no teacher, each called twice, on the toy task as files
           "align_layer.py": ("tests/scripts/test_align_layer.py",
                              "test_a_layer_taught_the_gold_aligns_better_than_the_run_and_translates_as_it",
                              "test_a_layer_with_no_teacher_predicts_then_learns_its_own_links"),
           # --smoke end to end, each picture opened and measured, the matplotlib ones made twice
           "docs_figures.py": ("tests/docs/test_figures.py", "test_docs_figures_smoke")}
WITHOUT_A_GPU = {"gpu_check.sh"}  # test_gpu_check_without_a_gpu


def test_every_script_has_a_smoke_run():
    assert {"bench_decode.py", "bench_train.py", "eflomal_align.py", "gpu_check.sh"} <= set(SCRIPTS)
    unknown = set(SCRIPTS) - SMOKE - set(COVERED) - WITHOUT_A_GPU
    assert not unknown, f"no smoke run for {sorted(unknown)}: add one to smoke_runs in {Path(__file__).name}"
    gone = (SMOKE | set(COVERED) | WITHOUT_A_GPU) - set(SCRIPTS)
    assert not gone, f"smoke runs of scripts that are not there: {sorted(gone)}"


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - set(COVERED) - WITHOUT_A_GPU))
def test_smoke(world, tmp_path, name):
    assert name in SMOKE, f"no smoke run for {name}: add one to smoke_runs"
    for run in smoke_runs(world, tmp_path)[name]:
        command = [sys.executable, str(SCRIPTS[name]), *map(str, run.args)]
        # From another working folder than the repository: a script finds what it imports by itself.
        done = subprocess.run(command, cwd=world.root, env={**os.environ, **OFFLINE_ENV}, capture_output=True,
                              text=True, timeout=LIMIT_S)
        said = f"{' '.join(command)}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert done.returncode == 0, said
        assert "Traceback" not in done.stderr, said
        headers = (run.header,) if isinstance(run.header, str) else run.header
        assert all(header in getattr(done, run.stream) for header in headers), said


@pytest.mark.parametrize("name", sorted(COVERED))
def test_covered_elsewhere(name):
    path, *tests = COVERED[name]
    source = (REPO / path).read_text(encoding="utf-8")
    assert name in source and all(f"def {test}(" in source for test in tests)


def test_gpu_check_without_a_gpu(tmp_path):
    """``gpu_check.sh``: its shell is valid (``bash -n``), its Python parts compile, and the benchmark it runs
    takes the options it gives (bench_train's own parser; ``--data`` a folder of the Multi30k names)."""
    script = SCRIPTS["gpu_check.sh"]
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text(encoding="utf-8")
    heredocs = re.findall(r"<<'EOF'[^\n]*\n(.*?)\nEOF\n", text, re.S)
    assert len(heredocs) == 2
    for number, body in enumerate(heredocs):
        compile(body, f"gpu_check.sh heredoc {number}", "exec")
    call = re.search(r"python3 (scripts/bench/bench_train\.py) (.*?) 2>&1", text, re.S)
    assert call and (REPO / call.group(1)).is_file()
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (data / f"{split}.{lang}.gz").write_bytes(gzip.compress(b"a\n"))
    words = call.group(2).replace("\\\n", " ").replace('"$DATA"', str(data)).split()
    args = load_script("bench_train").build_parser().parse_args(words)
    assert args.device == "cuda" and args.data == data
