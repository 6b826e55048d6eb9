"""Issue 29's cases, each through the command line: realistic mistakes that used to delete a user's files
with exit 0, and inputs that broke the error contract. Every case asserts the exit code, the single
``error:`` line on stderr, and the hashes of the user's files before and after (``tests/cli/test_cli_fuzz.py``
walks every option of every command with hostile values).

- Run folders are recognised by their marker, never assumed: ``--run-dir .`` in a project is refused.
- Outputs never replace inputs (through links too), a run folder's own files, or another output.
- ``toy-data`` replaces no file; a killed ``prepare`` leaves nothing behind once the next one starts.
- Pipes and ``/dev/stdin`` are read like files; numbers are checked at the edge; a BLEU tokenizer that
  needs a download is refused before any work, writing nothing in the home folder.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers import OFFLINE_ENV, REPO, TOY_CONFIG, TOY_SET, expect_error, hash_tree
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.runfiles import RUN_MARKER, TEMPORARY

SOURCE = "monday , 3 june 2001"


def invoke(*args, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory) -> Path:
    """A private copy of the tiny reference run (trained to step 30)."""
    run = tmp_path_factory.mktemp("lost") / "run"
    shutil.copytree(tiny.reference("transformer"), run, ignore=shutil.ignore_patterns(".lock"))
    return run


@pytest.fixture
def project(tmp_path, tiny) -> Path:
    """A user's project folder: their own config and their corpus in data/train/."""
    folder = tmp_path / "project"
    (folder / "data" / "train").mkdir(parents=True)
    shutil.copy(tiny.config["transformer"], folder / "config.yaml")
    (folder / "config.yaml").write_text("# my settings\n" + (folder / "config.yaml").read_text())
    (folder / "data" / "train" / "train.de").write_text("ein hund\n", encoding="utf-8")
    (folder / "data" / "train" / "train.en").write_text("a dog\n", encoding="utf-8")
    return folder


# ---------------------------------------------------------------------------------------- run folders


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_run_dir_dot_in_a_project_is_refused_and_nothing_is_touched(project, command, monkeypatch):
    before = hash_tree(project)
    monkeypatch.chdir(project)
    line = expect_error(invoke(command, "config.yaml", "--run-dir", "."), 2, "not an attnmt run folder",
                   "config.yaml", "data/train/train.de", "give an empty or new --run-dir")
    assert str(project) in line  # the folder by its full name, not "."
    assert hash_tree(project) == before
    assert sorted(os.listdir(project)) == ["config.yaml", "data"]  # no lock, no marker


def test_the_config_run_dir_in_a_project_is_refused_too(project):
    before = hash_tree(project)
    expect_error(invoke("train", project / "config.yaml", "--set", f"train.run_dir={project}"), 2,
            "not an attnmt run folder")
    assert hash_tree(project) == before


def test_a_new_run_folder_gets_its_marker_first(toy_run):
    run_dir, result = toy_run
    assert result.exit_code == 0, result.output
    marker = json.loads((run_dir / RUN_MARKER).read_text())
    assert set(marker) == {"attnmt", "run_id", "created"} and len(marker["run_id"]) == 32


def test_a_run_folder_of_an_older_attnmt_is_recognised_and_marked(toy_run_copy):
    (toy_run_copy / RUN_MARKER).unlink()
    result = invoke("prepare", TOY_CONFIG, "--run-dir", toy_run_copy, *TOY_SET)
    assert result.exit_code == 0, result.output
    assert (toy_run_copy / RUN_MARKER).is_file()


def test_a_folder_a_killed_claim_left_with_only_its_lock_is_taken(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_bytes(b"")
    result = invoke("prepare", TOY_CONFIG, "--run-dir", tmp_path / "run", *TOY_SET)
    assert result.exit_code == 0, result.output


def test_a_corpus_inside_the_run_folders_own_data_is_refused(toy_run_copy, tmp_path):
    corpus = toy_run_copy / "data" / "mine"
    corpus.mkdir()
    (corpus / "a.en").write_text("x\n")
    (corpus / "a.de").write_text("y\n")
    config = yaml.safe_load(TOY_CONFIG.read_text())
    config["data"]["dev"] = {"src": str(corpus / "a.en"), "tgt": str(corpus / "a.de")}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    before = hash_tree(toy_run_copy)
    expect_error(invoke("prepare", tmp_path / "c.yaml", "--run-dir", toy_run_copy, *TOY_SET[:2]), 2,
            "data.dev.src", "which prepare replaces")
    assert hash_tree(toy_run_copy) == before


# -------------------------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("how", ["same", "hard link", "symbolic link"])
def test_an_output_onto_an_ensemble_member_is_refused(trained, tmp_path, how):
    member = tmp_path / "member.pt"
    shutil.copy(next(trained.glob("checkpoints/step_*.pt")), member)
    output = {"same": member, "hard link": tmp_path / "hard.pt", "symbolic link": tmp_path / "sym.pt"}[how]
    if how == "hard link":
        os.link(member, output)
    elif how == "symbolic link":
        output.symlink_to(member)
    before = hash_tree(tmp_path)
    expect_error(invoke("translate", trained, SOURCE, "--ensemble", member, "-o", output), 2,
            "--output", "--ensemble", "refusing to overwrite the input")
    source = tmp_path / "src.en"
    source.write_text(SOURCE + "\n")
    reference = tmp_path / "ref.de"
    reference.write_text("montag\n")
    before = hash_tree(tmp_path)
    expect_error(invoke("eval", trained, "--src", source, "--ref", reference, "--ensemble", member,
                   "--hyp-out", output), 2, "--hyp-out", "--ensemble")
    assert hash_tree(tmp_path) == before


@pytest.mark.parametrize("own", ["metrics.jsonl", "config.yaml", "checkpoints/latest.json"])
def test_plot_curves_onto_the_runs_own_files_is_refused(trained, own):
    before = hash_tree(trained)
    expect_error(invoke("plot-curves", trained, "--out", trained / own), 2, "--out", "own")
    assert hash_tree(trained) == before


def test_outputs_into_a_run_folder_go_only_where_the_run_does_not_write(trained, tmp_path):
    before = hash_tree(trained)
    expect_error(invoke("translate", trained, SOURCE, "-o", trained / "checkpoints" / "notes.txt"), 2,
            "checkpoints is the run folder")
    assert hash_tree(trained) == before
    result = invoke("translate", trained, SOURCE, "-o", trained / "hyp.txt")  # the user's own name: fine
    assert result.exit_code == 0, result.output
    (trained / "hyp.txt").unlink()
    result = invoke("plot-curves", trained)  # plot-curves' own figure
    assert result.exit_code == 0, result.output
    (trained / "curves.png").unlink()


def test_two_outputs_of_one_command_on_one_path_are_refused(trained, tmp_path):
    source = tmp_path / "src.en"
    source.write_text(SOURCE + "\n")
    result = invoke("align", trained, "--src", source, "-o", tmp_path / "x", "--hyp-out", tmp_path / "x")
    expect_error(result, 2, "--hyp-out", "is also --output")
    assert not (tmp_path / "x").exists()


def test_an_output_inside_an_input_folder_is_refused(trained, tmp_path):
    export = tmp_path / "ct2"
    assert invoke("export", trained, export).exit_code == 0
    before = hash_tree(export)
    result = invoke("translate", export, SOURCE, "-o", export / "model.bin")
    expect_error(result, 2, "inside the input folder")
    assert hash_tree(export) == before


# ------------------------------------------------------------------------------------------- toy-data


def test_toy_data_replaces_none_of_a_users_files(tmp_path):
    corpus = tmp_path / "multi30k"
    corpus.mkdir()
    (corpus / "train.en").write_text("A man in an orange hat.\n")
    (corpus / "train.de").write_text("Ein Mann mit einem orangefarbenen Hut.\n")
    before = hash_tree(corpus)
    expect_error(invoke("toy-data", corpus), 2, "train.en", "train.de", "replaces no file")
    assert hash_tree(corpus) == before


def test_toy_data_onto_a_file_exits_2(tmp_path):
    (tmp_path / "notes").write_text("mine\n")
    expect_error(invoke("toy-data", tmp_path / "notes"), 2, "is a file; give a folder")
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_toy_data_again_is_a_no_op_and_other_sizes_are_refused(tmp_path):
    sizes = ["--train-size", "5", "--dev-size", "2", "--test-size", "2"]
    assert invoke("toy-data", tmp_path / "toy", *sizes).exit_code == 0
    written = hash_tree(tmp_path)
    assert len(written) == 9
    assert invoke("toy-data", tmp_path / "toy", *sizes).exit_code == 0
    assert hash_tree(tmp_path) == written
    expect_error(invoke("toy-data", tmp_path / "toy", *sizes[:-1], "3"), 2, "test.en")
    assert hash_tree(tmp_path) == written


# ------------------------------------------------------------------------------------ killed prepare

KILLED_PREPARE = """
import os, signal, sys
import attnmt.data.encoded as encoded
import attnmt.data.prepare as prepare
from attnmt.cli import app

where, real = sys.argv[1], prepare.replace_dir

def replace_dir(tmp, final):  # the folder is written; SIGKILL before it is in place (an older one aside)
    if final.name == where:
        if final.exists():
            os.replace(final, final.with_name(f".{final.name}.old-{os.getpid()}"))
        os.kill(os.getpid(), signal.SIGKILL)
    real(tmp, final)

prepare.replace_dir = encoded.replace_dir = replace_dir
app(["prepare", *sys.argv[2:]], prog_name="attnmt")
"""


def temporaries(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if TEMPORARY.match(p.name))


def test_a_prepare_killed_midway_leaves_no_temporary_after_the_next(tmp_path):
    """SIGKILL before the tokenizer is in place, and while a split is replaced: the next prepare removes
    what was left, and a run folder killed half way is prepared again by train, never trained on as is."""
    run = tmp_path / "run"
    args = [str(TOY_CONFIG), "--run-dir", str(run), *TOY_SET]

    def killed(where: str) -> None:
        result = subprocess.run([sys.executable, "-c", KILLED_PREPARE, where, *args], cwd=REPO, text=True,
                                env={**os.environ, **OFFLINE_ENV}, capture_output=True, timeout=120)
        assert result.returncode == -9, result.stderr

    killed("tokenizer")  # a new run folder, killed before its tokenizer is in place
    assert [name.split("-")[0] for name in temporaries(run)] == [".tokenizer.tmp", "data/.prepare.tmp"]
    assert invoke("prepare", *args).exit_code == 0
    assert temporaries(run) == []
    killed("train")  # a prepared run, killed while its training split is replaced
    left = sorted(name.rsplit("-", 1)[0] for name in temporaries(run))
    assert left == ["data/.dev.tmp", "data/.prepare.tmp", "data/.test.tmp", "data/.train.old",
                    "data/.train.tmp"]
    assert not (run / "data" / "train").exists() and not (run / "config.yaml").exists()
    result = invoke("prepare", *args)
    assert result.exit_code == 0, result.output
    assert temporaries(run) == []
    assert (run / "data" / "train" / "split.json").is_file()
    prepared = hash_tree(run / "data")
    killed("dev")  # the training split is in place, the dev split is not: config.yaml is gone until the end
    assert (run / "data" / "train" / "split.json").is_file() and not (run / "config.yaml").exists()
    result = invoke("train", *args, "--set", "train.max_steps=1")
    assert result.exit_code == 0, result.output
    assert "preparing data" in result.output and temporaries(run) == []
    assert hash_tree(run / "data") == prepared


# ---------------------------------------------------------------------------------------------- pipes


def fifo_with(path: Path, data: bytes) -> Path:
    """A named pipe at ``path`` that a thread fills with ``data`` once a reader opens it."""
    os.mkfifo(path)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(path, "wb") as pipe:
            pipe.write(data)

    threading.Thread(target=write, daemon=True).start()
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_eval_reads_its_hypotheses_from_a_pipe(tmp_path, gz):
    lines = b"ein mann steht vor einem roten haus .\nzwei hunde laufen durch den schnee .\n"
    (tmp_path / "ref").write_bytes(lines)
    hyp = fifo_with(tmp_path / "hyp", gzip.compress(lines) if gz else lines)
    result = invoke("eval", "--hyp", hyp, "--ref", tmp_path / "ref", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["score"] == 100.0


def test_translate_and_score_read_sources_from_pipes(trained, tmp_path):
    expected = invoke("translate", trained, SOURCE).stdout
    result = invoke("translate", trained, "-i", fifo_with(tmp_path / "in", (SOURCE + "\n").encode()))
    assert (result.exit_code, result.stdout) == (0, expected)
    (tmp_path / "tgt").write_text("montag\n")
    on_disk = invoke("score", trained, "--src", fifo_with(tmp_path / "a", (SOURCE + "\n").encode()),
                     "--tgt", tmp_path / "tgt")
    (tmp_path / "src").write_text(SOURCE + "\n")
    assert on_disk.exit_code == 0, on_disk.output
    from_file = invoke("score", trained, "--src", tmp_path / "src", "--tgt", tmp_path / "tgt")
    assert on_disk.stdout == from_file.stdout


def test_a_checkpoint_from_a_pipe_exits_4_saying_so(trained, tmp_path):
    checkpoint = next(trained.glob("checkpoints/step_*.pt"))
    result = invoke("translate", fifo_with(tmp_path / "model", checkpoint.read_bytes()), SOURCE)
    expect_error(result, 4, "a checkpoint is read from disk")
    os.close(os.open(tmp_path / "model", os.O_RDONLY | os.O_NONBLOCK))  # the writer, never read, may go


def test_eval_reads_dev_stdin(tmp_path):
    line = "ein mann steht vor einem roten haus .\n"
    (tmp_path / "ref").write_text(line)
    result = subprocess.run([sys.executable, "-m", "attnmt", "eval", "--hyp", "/dev/stdin", "--ref",
                             str(tmp_path / "ref"), "--json"], input=line, capture_output=True, text=True,
                            env={**os.environ, **OFFLINE_ENV}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["score"] == 100.0


# -------------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(("args", "fragment"), [
    (["translate", "<run>", SOURCE, "--length-penalty", "inf"], "--length-penalty"),
    (["score", "<run>", "--src", "<src>", "--tgt", "<src>", "--length-penalty", "nan"], "--length-penalty"),
    (["translate", "<run>", SOURCE, "--length-penalty", "1e21"], "--length-penalty"),
    (["translate", "<run>", SOURCE, "--sampling", "--temperature", "inf"], "--temperature inf"),
    (["translate", "<run>", SOURCE, "--sampling", "--seed", str(2**64)], "--seed"),
    (["translate", "<run>", SOURCE, "--sampling", "--seed", "-1"], "--seed"),
    (["plot", "<run>", SOURCE, "--out", "<tmp>", "--limit", str(2**70)], "--limit"),
    (["toy-data", "<tmp>", "--train-size", str(2**40)], "--train-size"),
])  # fmt: skip
def test_numbers_out_of_range_exit_2_naming_the_option(trained, tmp_path, args, fragment):
    (tmp_path / "src").write_text(SOURCE + "\n")
    places = {"<run>": trained, "<src>": tmp_path / "src", "<tmp>": tmp_path / "out"}
    before = hash_tree(tmp_path)
    expect_error(invoke(*[places.get(a, a) for a in args]), 2, fragment)
    assert hash_tree(tmp_path) == before


def test_the_largest_seed_samples(trained):
    result = invoke("translate", trained, SOURCE, "--sampling", "--seed", str(2**64 - 1))
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------------ BLEU tokenizers


@pytest.mark.parametrize("tokenizer", ["flores200", "flores101", "spm", "spBLEU-1K"])
def test_a_tokenizer_that_needs_a_download_exits_3_and_writes_nothing(tmp_path, monkeypatch, tokenizer):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setattr("sacrebleu.tokenizers.tokenizer_spm.SACREBLEU_DIR", str(home / ".sacrebleu"))
    (tmp_path / "hyp").write_text("ein mann\n")
    result = invoke("eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "hyp", "--tokenize", tokenizer)
    line = expect_error(result, 3, f"{tokenizer} tokenizer", "fetch https://")
    assert str(home / ".sacrebleu" / "models") in line
    assert list(home.rglob("*")) == []


def test_a_tokenizer_whose_model_is_there_scores(trained, tmp_path, monkeypatch):
    from sacrebleu.tokenizers.tokenizer_spm import SPM_MODELS

    models = tmp_path / ".sacrebleu" / "models"
    models.mkdir(parents=True)
    # Any sentencepiece model will do to show the check lets a present one through: the run's own.
    shutil.copy(trained / "tokenizer" / "spm.model", models / Path(SPM_MODELS["flores200"]["url"]).name)
    monkeypatch.setattr("sacrebleu.tokenizers.tokenizer_spm.SACREBLEU_DIR", str(tmp_path / ".sacrebleu"))
    (tmp_path / "hyp").write_text("montag , 3. juni 2001\n")
    result = invoke("eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "hyp", "--tokenize", "flores200",
                    "--json")
    assert result.exit_code == 0, result.output
    assert "tok:flores200" in json.loads(result.stdout)[0]["signature"]
